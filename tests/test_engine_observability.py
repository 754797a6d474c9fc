"""Metrics and logs of a real Engine (scheduler and detokenizer processes) on a tiny model."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from srt.entrypoints.engine import Engine
from srt.logs import escape

PROMPT = "def parse_args(argv): return the namespace of every option given on the command line"
OTHER = "class Fraction: numerator and denominator, always reduced to lowest terms by gcd"
SHORT = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}
# Over 40 decode steps: the scheduler logs one decode line.
LONG = {"max_new_tokens": 45, "temperature": 0.0, "ignore_eos": True}
FINISH_LOGGER = "srt.managers.request_log"


@pytest.fixture(scope="module")
def model_dir(tiny_model_factory: Callable[[str], Path]) -> Path:
    return tiny_model_factory("llama")


def one(result: object) -> dict[str, Any]:
    assert isinstance(result, dict), result
    return result


def metric_values(text: bytes) -> dict[str, float]:
    """Sample name (with its finish_reason, if any) → value."""
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            reason = s.labels.get("finish_reason")
            if "le" not in s.labels:
                out[s.name + (f"[{reason}]" if reason else "")] = s.value
    return out


def finish_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == FINISH_LOGGER]


@pytest.mark.slow
def test_metrics_and_logs_follow_the_requests(
    model_dir: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger=FINISH_LOGGER)
    with Engine(model_path=str(model_dir), context_length=512, enable_metrics=True) as engine:
        metrics = engine.tokenizer_manager.metrics
        assert metrics is not None
        first = one(engine.generate(PROMPT, SHORT, rid="first"))
        again = one(engine.generate(PROMPT, SHORT, rid="again\r\nINFO forged"))
        chunks = list(engine.generate(OTHER, LONG, stream=True, rid="streamed"))
        streamed = chunks[-1]["meta_info"]
        values = metric_values(metrics.render(engine.get_load()))

    metas = [first["meta_info"], again["meta_info"], streamed]
    assert again["meta_info"]["cached_tokens"] > 0
    assert values["srt_requests_total[length]"] == 3
    assert values["srt_requests_total[stop]"] == values["srt_requests_total[abort]"] == 0
    assert values["srt_generation_tokens_total"] == sum(m["completion_tokens"] for m in metas)
    assert values["srt_prompt_tokens_total"] == sum(m["prompt_tokens"] for m in metas)
    assert values["srt_cached_tokens_total"] == sum(m["cached_tokens"] for m in metas)
    assert values["srt_cache_hit_rate"] == pytest.approx(
        values["srt_cached_tokens_total"] / values["srt_prompt_tokens_total"]
    )
    assert values["srt_e2e_request_latency_seconds_count"] == 3
    # Only the streamed request's tokens are timed one by one.
    assert values["srt_time_to_first_token_seconds_count"] == 1
    assert values["srt_inter_token_latency_seconds_count"] == LONG["max_new_tokens"] - 1
    assert values["srt_num_running_reqs"] == values["srt_num_queue_reqs"] == 0
    assert values["srt_max_total_tokens"] > 0
    assert values["srt_kv_integrity_violations_total"] == 0

    lines = finish_lines(caplog)
    assert len(lines) == 3
    assert lines[0].startswith("Finish: rid=first finish_reason=length prompt_tokens=")
    assert "rid=again\\r\\nINFO forged " in lines[1]
    assert all("\n" not in line and "prompt=" not in line for line in lines)
    assert all("output=" not in line and PROMPT not in line for line in lines)

    stderr = capfd.readouterr().err
    prefill = [line for line in stderr.splitlines() if "Prefill batch." in line]
    decode = [line for line in stderr.splitlines() if "Decode batch." in line]
    assert len(prefill) == 3
    assert " scheduler] INFO Prefill batch. #new-seq: 1, #new-token: " in prefill[0]
    assert "#running-req: 0, #queue-req: 0" in prefill[0]
    assert "#cached-token: 0," in prefill[0]
    assert f"#cached-token: {again['meta_info']['cached_tokens']}," in prefill[1]
    assert len(decode) == 1
    assert " scheduler] INFO Decode batch. #running-req: 1, #token: " in decode[0]
    assert "gen throughput (token/s): " in decode[0]


@pytest.mark.slow
def test_log_requests_adds_the_escaped_texts(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=FINISH_LOGGER)
    prompt = "first line\nsecond line\x1b[2J"
    with Engine(model_path=str(model_dir), context_length=512, log_requests=True) as engine:
        assert engine.tokenizer_manager.metrics is None
        out = one(engine.generate(prompt, SHORT, rid="logged"))
    (line,) = finish_lines(caplog)
    assert line.startswith("Finish: rid=logged finish_reason=length ")
    assert ' prompt="first line\\nsecond line\\x1b[2J" output="' in line
    assert line.endswith(f' output="{escape(out["text"])}"')
