"""`TokenizerMetrics`: the Prometheus exposition, parsed back with prometheus_client's parser."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from srt.io_struct import GetLoadOut
from srt.managers.metrics import TokenizerMetrics


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by name and labels (model_name left out)."""
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def value(parsed: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    return parsed[(name, ())]


def load(violations: int = 0, retracted: int = 0) -> GetLoadOut:
    return GetLoadOut("m", 2, 5, 300, 1000, violations, retracted)


def test_observations_show_up_in_the_exposition() -> None:
    metrics = TokenizerMetrics("tiny")
    metrics.observe_tokens(1, 0.2, first=True, streamed=True)
    metrics.observe_tokens(3, 0.03, first=False, streamed=True)
    metrics.observe_tokens(6, 1.5, first=True, streamed=False)
    metrics.observe_finish("length", prompt_tokens=10, cached_tokens=0, e2e=0.5)
    metrics.observe_finish("abort", prompt_tokens=30, cached_tokens=20, e2e=1.5)
    parsed = samples(metrics.render(load()))

    assert parsed[("srt_requests_total", (("finish_reason", "length"),))] == 1
    assert parsed[("srt_requests_total", (("finish_reason", "abort"),))] == 1
    assert parsed[("srt_requests_total", (("finish_reason", "stop"),))] == 0
    assert value(parsed, "srt_generation_tokens_total") == 10
    assert value(parsed, "srt_prompt_tokens_total") == 40
    assert value(parsed, "srt_cached_tokens_total") == 20
    assert value(parsed, "srt_cache_hit_rate") == 0.5
    # Only the streamed request's first token is a time to first token.
    assert value(parsed, "srt_time_to_first_token_seconds_count") == 1
    assert value(parsed, "srt_time_to_first_token_seconds_sum") == pytest.approx(0.2)
    assert value(parsed, "srt_inter_token_latency_seconds_count") == 3
    assert value(parsed, "srt_inter_token_latency_seconds_sum") == pytest.approx(0.03)
    assert parsed[("srt_inter_token_latency_seconds_bucket", (("le", "0.01"),))] == 3
    assert value(parsed, "srt_e2e_request_latency_seconds_count") == 2
    assert value(parsed, "srt_num_running_reqs") == 2
    assert value(parsed, "srt_num_queue_reqs") == 5
    assert value(parsed, "srt_num_used_tokens") == 300
    assert value(parsed, "srt_max_total_tokens") == 1000
    assert value(parsed, "srt_token_usage") == 0.3


def test_the_schedulers_running_totals_become_counters() -> None:
    metrics = TokenizerMetrics("tiny")
    metrics.render(load(violations=1, retracted=3))
    parsed = samples(metrics.render(load(violations=1, retracted=7)))
    assert value(parsed, "srt_kv_integrity_violations_total") == 1
    assert value(parsed, "srt_retracted_requests_total") == 7


def test_every_series_names_the_model_and_instances_do_not_collide() -> None:
    first, second = TokenizerMetrics("model-a"), TokenizerMetrics("model-b")
    first.observe_finish("stop", prompt_tokens=4, cached_tokens=0, e2e=0.1)
    for metrics, count in ((first, 1), (second, 0)):
        text = metrics.render(load()).decode()
        families = list(text_string_to_metric_families(text))
        assert all(f.name.startswith("srt_") for f in families)
        names = {s.labels["model_name"] for f in families for s in f.samples}
        assert names == {"model-a" if metrics is first else "model-b"}
        assert samples(text.encode())[("srt_requests_total", (("finish_reason", "stop"),))] == count


def test_an_unknown_finish_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown finish type 'eof'"):
        TokenizerMetrics("tiny").observe_finish("eof", prompt_tokens=1, cached_tokens=0, e2e=0.1)
