"""Data parallelism: two `srt-serve` replicas of a tiny model behind sglang-router, spoken to
through the router with real clients (the official `openai` client, aiohttp for SSE). Skipped
only where sglang-router is not installed (it is in the `test` extra)."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import signal
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from srt.testing.router_process import running_router
from srt.testing.server_process import ServerProcess, all_healthy, spawn_server

pytest.importorskip("sglang_router", reason="needs sglang-router: pip install sglang-router")

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
WORDS = ("alpha", "bravo", "delta", "gamma", "kilo", "lima", "oscar", "sierra", "tango", "zulu")
GROUPS = 5  # odd: see the round-robin run
PROMPTS_PER_GROUP = 4


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_factory: Callable[[str], Path]
) -> Iterator[list[ServerProcess]]:
    """Two replicas of the tiny llama model, started side by side (metrics on: their counters
    are what the prefix-cache test reads)."""
    model = tiny_model_factory("llama")
    log_dir = tmp_path_factory.mktemp("replicas")
    flags = ("--served-model-name", MODEL, "--enable-metrics")
    with all_healthy([spawn_server(model, *flags, log_dir=log_dir) for _ in range(2)]) as servers:
        yield servers


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


def post_json(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def generate(url: str, text: str, max_new_tokens: int = 4) -> dict[str, Any]:
    params = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}
    reply: dict[str, Any] = post_json(f"{url}/generate", {"text": text, "sampling_params": params})
    return reply


# ---- the APIs through the router ---------------------------------------------------------------


def test_openai_client_through_the_router(replicas: list[ServerProcess]) -> None:
    with running_router([s.url for s in replicas], "round_robin") as router:
        client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused")
        assert [m.id for m in client.models.list()] == [MODEL]
        for _ in range(2):  # round robin: once on each replica
            chat = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
            assert chat.choices[0].finish_reason in ("stop", "length")
            assert chat.usage is not None
            assert 0 < chat.usage.completion_tokens <= 4
            completion = client.completions.create(
                model=MODEL, prompt="Once upon a time", max_tokens=4, temperature=0
            )
            assert completion.usage is not None
            assert completion.usage.completion_tokens == 4
        chunks = list(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens > 0
        assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_native_generate_and_its_stream_through_the_router(replicas: list[ServerProcess]) -> None:
    """A stream comes through the router as a stream. The tokenizer manager sends what has
    come since the client last read, so a short stream may arrive as one event when a replica
    is descheduled for a moment (the tiny model decodes a token in about a millisecond): the
    stream is long enough that no stall on a loaded machine could fold it into one. (Its text
    is not compared across replicas: over 128 greedy tokens of the random model, a near tie
    may fall either way when a replica's measured kernel plans or cached prefix differ.)"""
    tokens = 128
    with running_router([s.url for s in replicas], "cache_aware") as router:
        direct = generate(replicas[0].url, "The quick brown fox", 6)
        routed = generate(router.url, "The quick brown fox", 6)
        assert routed["text"] == direct["text"]  # greedy, and the replicas hold the same model
        assert routed["meta_info"]["completion_tokens"] == 6

        async def stream() -> list[Any]:
            body = {
                "text": "The quick brown fox",
                "stream": True,
                "sampling_params": {
                    "max_new_tokens": tokens,
                    "temperature": 0.0,
                    "ignore_eos": True,
                },
            }
            events = []
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{router.url}/generate", json=body) as response,
            ):
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/event-stream")
                async for line in response.content:
                    if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                        events.append(json.loads(line[len(b"data: ") :]))
            return events

        events = asyncio.run(stream())
        assert len(events) > 1
        texts = [event["text"] for event in events]
        assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
        assert events[-1]["meta_info"]["completion_tokens"] == tokens
        assert texts[-1].startswith(direct["text"])  # the first 6 greedy tokens, as above


def test_load_is_reported_to_the_router(replicas: list[ServerProcess]) -> None:
    """`/get_load` counts a running request and its KV tokens; the router reads it."""
    replica = replicas[0]
    assert get_json(f"{replica.url}/get_load") == [
        {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
    ]

    async def load_while_running() -> list[dict[str, Any]]:
        body = {
            "text": "The quick brown fox",
            "rid": "load-probe",
            "stream": True,
            "sampling_params": {"max_new_tokens": None, "ignore_eos": True},
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{replica.url}/generate", json=body) as response,
        ):
            await response.content.readline()  # the request is running
            async with session.get(f"{replica.url}/get_load") as load:
                busy: list[dict[str, Any]] = await load.json()
            abort = {"rid": "load-probe"}
            async with session.post(f"{replica.url}/abort_request", json=abort) as aborted:
                assert aborted.status == 200
            await response.read()
        return busy

    (busy,) = asyncio.run(load_while_running())
    assert busy["num_reqs"] == 1
    assert busy["num_waiting_reqs"] == 0
    assert busy["num_tokens"] > 4  # the prompt and the tokens generated so far
    with running_router([s.url for s in replicas], "power_of_two") as router:
        loads = get_json(f"{router.url}/get_loads")["workers"]
        assert sorted(w["worker"] for w in loads) == sorted(s.url for s in replicas)
        assert all(w["load"] >= 0 for w in loads)  # -1: the router could not read a load


# ---- prefix-cache affinity ---------------------------------------------------------------------


COUNTERS = ("srt_prompt_tokens_total", "srt_cached_tokens_total", "srt_requests_total")


def counters(replica: ServerProcess) -> dict[str, float]:
    """The `COUNTERS` of a replica's finished requests, from its `/metrics`."""
    with urllib.request.urlopen(f"{replica.url}/metrics", timeout=30) as response:
        text = response.read().decode()
    totals = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals


def send_rounds(url: str, seed: int, *, concurrent: bool) -> None:
    """A shared-prefix workload: `GROUPS` system prompts, `PROMPTS_PER_GROUP` questions each,
    sent in rounds (the r-th question of every group, then the next round), a round's requests
    at once or one after another. Requests in flight together never share a prefix, so a
    group's later questions find its prefix wherever its first one left it."""
    rng = random.Random(seed)
    systems = [" ".join(rng.choices(WORDS, k=60)) for _ in range(GROUPS)]
    for _ in range(PROMPTS_PER_GROUP):
        texts = [f"{system}\n{' '.join(rng.choices(WORDS, k=5))}" for system in systems]
        if concurrent:
            with ThreadPoolExecutor(len(texts)) as pool:
                list(pool.map(lambda text: generate(url, text, 8), texts))
        else:
            for text in texts:
                generate(url, text, 8)


def hit_rate(
    url: str, replicas: list[ServerProcess], seed: int, *, concurrent: bool
) -> tuple[float, list[int]]:
    """The replicas' prefix-cache hit rate over `send_rounds` to `url` on emptied caches, and
    how many of the requests each replica served."""
    for replica in replicas:
        assert post_json(f"{replica.url}/flush_cache", {})["success"]
    before = [counters(r) for r in replicas]
    send_rounds(url, seed, concurrent=concurrent)
    delta = [
        {name: a[name] - b[name] for name in COUNTERS}
        for a, b in zip([counters(r) for r in replicas], before, strict=True)
    ]
    prompt = sum(d["srt_prompt_tokens_total"] for d in delta)
    cached = sum(d["srt_cached_tokens_total"] for d in delta)
    return cached / prompt, [int(d["srt_requests_total"]) for d in delta]


def test_cache_aware_routing_keeps_a_single_replicas_hit_rate(
    replicas: list[ServerProcess],
) -> None:
    """Cache-aware routing spreads the groups over both replicas and sends each group's later
    questions where its prefix is; round robin splits each group over both replicas, so both
    compute its prefix."""
    single, _ = hit_rate(replicas[0].url, replicas, seed=1, concurrent=True)
    urls = [s.url for s in replicas]
    with running_router(urls, "cache_aware") as router:
        # At once: with nothing in flight the router sends every new prefix to the same
        # (least loaded) replica, as one replica would.
        cache_aware, served = hit_rate(router.url, replicas, seed=2, concurrent=True)
    with running_router(urls, "round_robin") as router:
        # One after another, so that round robin's choices do not hang on arrival order: with
        # an odd number of groups, each group alternates between the replicas.
        round_robin, _ = hit_rate(router.url, replicas, seed=3, concurrent=False)
    # One replica misses a group's prefix once, on its first question: about 3/4 of a prefix
    # that is most of each prompt is cached; round robin misses it twice, about 2/4.
    assert single > 0.5
    assert min(served) > 0
    assert cache_aware >= 0.9 * single
    assert round_robin <= 0.8 * cache_aware


# ---- a replica stops ---------------------------------------------------------------------------


def test_requests_keep_succeeding_when_a_replica_stops(replicas: list[ServerProcess]) -> None:
    """Last in the module: it stops the second replica, in front of two routers at once, round
    robin and cache-aware. Cache-aware routing may send a request back to the stopping replica,
    retries included: it loses nothing because the retries outlast the health check that takes
    the replica out (`router_process.FAILOVER_FLAGS`)."""
    texts = [f"{word} " * 30 for word in WORDS[:6]]
    urls = [s.url for s in replicas]
    with (
        running_router(urls, "round_robin") as round_robin,
        running_router(urls, "cache_aware") as cache_aware,
        ThreadPoolExecutor(len(texts) * 2) as pool,
    ):
        routers = (cache_aware, round_robin)
        # At once, so that cache-aware routing spreads the prefixes over both replicas.
        assert all(
            r["meta_info"]["completion_tokens"] == 4
            for r in pool.map(lambda text: generate(cache_aware.url, text), texts)
        )

        def every_prefix_again() -> None:
            """Each prefix, those the second replica held included, through both routers."""
            asked = [(router.url, text) for router in routers for text in texts]
            answers = pool.map(lambda args: generate(*args), asked)
            assert [a["meta_info"]["completion_tokens"] for a in answers] == [4] * len(asked)

        replicas[1].process.send_signal(signal.SIGTERM)
        every_prefix_again()  # while it drains: it refuses new requests
        assert replicas[1].stop() == 0
        every_prefix_again()  # once it is gone
        for router in routers:
            router.wait_healthy_workers(1)
            assert generate(router.url, "at last")["meta_info"]["completion_tokens"] == 4


def test_router_helpers_refuse_an_unknown_policy() -> None:
    with pytest.raises(ValueError, match="policy"), running_router(["http://127.0.0.1:1"], "x"):
        pass
