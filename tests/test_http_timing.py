"""Per-request stage times through the three processes, on real requests to `srt-serve` on a tiny
model (the shared server has `--enable-metrics`, so native results carry them): the points come
in order, the stages add up to the request's time, and they show in the `Finish:` log line and
in the Prometheus histograms."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from srt.managers.request_times import POINTS, STAGES
from srt.testing.server_process import ServerProcess

pytestmark = pytest.mark.slow

PROMPT = "The quick brown fox jumps over the lazy dog"
PARAMS = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
# Clock reads of two processes, rounding of sums: far below any stage worth seeing.
SLACK_S = 0.002


async def post(server: ServerProcess, body: dict[str, Any]) -> tuple[Any, float]:
    """The answer to one `/generate` (the last event of a stream) and the client's latency."""
    async with aiohttp.ClientSession() as session:
        start = time.time()
        async with session.post(server.url + "/generate", json=body) as response:
            assert response.status == 200
            if not body.get("stream"):
                out = await response.json()
                return out, time.time() - start
            last = None
            async for line in response.content:
                if line.startswith(b"data: {"):
                    last = json.loads(line[len(b"data: ") :])
            return last, time.time() - start


def check_times(meta: dict[str, Any], client_latency: float, stages: tuple[str, ...]) -> None:
    points = meta["time_stats"]
    assert list(points) == list(POINTS)  # every point reached, in the pipeline's order
    values = list(points.values())
    assert values == sorted(values)
    latencies = meta["stage_latencies"]
    assert tuple(latencies) == stages
    assert all(s >= 0 for s in latencies.values())
    total = sum(latencies.values())
    assert total == pytest.approx(points["answered"] - points["received"], abs=1e-6)
    # e2e_latency ends when the final message arrives, before the answer is built; the client
    # waited for all of it, and for the HTTP round trip.
    assert meta["e2e_latency"] - SLACK_S <= total <= client_latency + SLACK_S
    # SGLang's fields are the same points.
    assert meta["request_received_ts"] == points["received"]
    assert meta["request_sent_to_scheduler_ts"] == points["sent"]
    assert meta["prefill_finished_ts"] == points["first_token"]
    assert meta["decode_finished_ts"] == points["finished"]
    assert meta["response_sent_to_client_ts"] == points["answered"]
    assert meta["queue_time"] == pytest.approx(latencies["queue"])
    decode = points["finished"] - points["first_token"]
    assert meta["decode_throughput"] == pytest.approx(meta["completion_tokens"] / decode)


def test_a_plain_and_a_streamed_request_carry_their_stages(tiny_server: ServerProcess) -> None:
    for stream in (False, True):
        body = {"text": PROMPT, "sampling_params": PARAMS, "stream": stream}
        out, latency = asyncio.run(post(tiny_server, body))
        check_times(out["meta_info"], latency, STAGES)


def test_every_sample_of_a_batch_has_its_own_stages(tiny_server: ServerProcess) -> None:
    body = {"text": [PROMPT, "Hello"], "sampling_params": {**PARAMS, "n": 2}}
    outs, latency = asyncio.run(post(tiny_server, body))
    assert len(outs) == 4
    for out in outs:
        check_times(out["meta_info"], latency, STAGES)
    received = {out["meta_info"]["time_stats"]["received"] for out in outs}
    assert len(received) == 1  # one call: one arrival


def test_a_request_that_generates_nothing_skips_the_model_stages(
    tiny_server: ServerProcess,
) -> None:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 0}}
    out, latency = asyncio.run(post(tiny_server, body))
    meta = out["meta_info"]
    assert "scheduled" not in meta["time_stats"]
    assert "first_token" not in meta["time_stats"]
    # Its time in the scheduler is all queue: it finished where it arrived.
    assert list(meta["stage_latencies"]) == [
        "tokenize",
        "send",
        "transfer",
        "queue",
        "detokenize",
        "answer",
    ]
    assert "queue_time" not in meta
    assert "decode_throughput" not in meta
    total = sum(meta["stage_latencies"].values())
    assert total == pytest.approx(meta["response_sent_to_client_ts"] - meta["request_received_ts"])
    assert total <= latency + SLACK_S


def histogram_counts(server: ServerProcess) -> dict[str, float]:
    async def scrape() -> str:
        async with (
            aiohttp.ClientSession() as session,
            session.get(server.url + "/metrics") as response,
        ):
            return await response.text()

    counts = {}
    for family in text_string_to_metric_families(asyncio.run(scrape())):
        for s in family.samples:
            if s.name.endswith("_count"):
                key = s.name + (f"[{s.labels['stage']}]" if "stage" in s.labels else "")
                counts[key] = s.value
    return counts


def test_the_stages_show_in_the_log_and_the_histograms(tiny_server: ServerProcess) -> None:
    before = histogram_counts(tiny_server)
    rid = "timed-request"
    body = {"text": PROMPT, "sampling_params": PARAMS, "rid": rid}
    asyncio.run(post(tiny_server, body))
    after = histogram_counts(tiny_server)
    for name in (
        "srt_queue_time_seconds_count",
        "srt_prefill_time_seconds_count",
        "srt_decode_time_per_token_seconds_count",
        "srt_e2e_request_latency_seconds_count",
        *(f"srt_request_stage_seconds_count[{stage}]" for stage in STAGES),
    ):
        assert after[name] == before.get(name, 0) + 1, name
    (line,) = [line for line in tiny_server.output().splitlines() if f"rid={rid} " in line]
    assert "Finish: " in line
    for stage in STAGES:
        assert f" {stage}=" in line
        assert line.split(f" {stage}=")[1].split()[0].endswith("ms")


async def get(server: ServerProcess, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(server.url + path) as response:
        return response.status, await response.json()


def test_the_slowest_recent_requests_and_one_requests_breakdown(
    tiny_server: ServerProcess,
) -> None:
    for rid, tokens in (("recent-short", 1), ("recent-long", 24)):
        params = {**PARAMS, "max_new_tokens": tokens}
        asyncio.run(post(tiny_server, {"text": PROMPT, "sampling_params": params, "rid": rid}))
    status, info = asyncio.run(get(tiny_server, "/get_server_info"))
    assert status == 200
    slowest = info["slowest_requests"]
    assert 2 <= len(slowest) <= 10
    latencies = [entry["e2e_latency"] for entry in slowest]
    assert latencies == sorted(latencies, reverse=True)
    for entry in slowest:
        assert list(entry["stage_latencies"]) == list(STAGES)
        points = entry["time_stats"]
        total = sum(entry["stage_latencies"].values())
        assert total == pytest.approx(points["answered"] - points["received"], abs=1e-6)
    status, long = asyncio.run(get(tiny_server, "/request_times/recent-long"))
    assert status == 200
    assert long["rid"] == "recent-long"
    assert long["finish_reason"] == "length"
    _, short = asyncio.run(get(tiny_server, "/request_times/recent-short"))
    assert long["stage_latencies"]["decode"] > short["stage_latencies"]["decode"]
    status, missing = asyncio.run(get(tiny_server, "/request_times/never-sent"))
    assert status == 404
    assert "never-sent" in missing["error"]["message"]
