"""`--metrics-name-prefix`: srt's names under any prefix, SGLang's own under `sglang` (checked
against the series SGLang's Grafana dashboard queries), and the flag's validation; and srt's
own dashboard under docs/ queries only series srt exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from srt import server_args_check
from srt.io_struct import GetLoadOut
from srt.managers.metric_names import PREFIX_PATTERN, SGLANG_NAMES, metric_name
from srt.managers.metrics import TokenizerMetrics
from srt.managers.request_times import RequestTimes
from srt.server_args import ServerArgs
from srt.server_args_check import ServerArgsError
from srt.server_cli import parse_args

SGLANG_DASHBOARD_SERIES = (
    "sglang:e2e_request_latency_seconds_bucket",
    "sglang:e2e_request_latency_seconds_sum",
    "sglang:e2e_request_latency_seconds_count",
    "sglang:time_to_first_token_seconds_bucket",
    "sglang:time_to_first_token_seconds_sum",
    "sglang:time_to_first_token_seconds_count",
    "sglang:num_running_reqs",
    "sglang:gen_throughput",
    "sglang:cache_hit_rate",
    "sglang:num_queue_reqs",
)
"""Every series the `expr` of SGLang's dashboard reads: github.com/sgl-project/sglang,
examples/monitoring/grafana/dashboards/json/sglang-dashboard.json at commit
bac2cc6711e0342e25d27bbcdef773555ad402eb ("SGLang Dashboard": end-to-end latency quantiles,
average and heatmap, time to first token likewise, running and queued requests, generation
throughput, cache hit rate)."""

SGLANG_COLLECTOR_SERIES = (
    "sglang:num_requests_total",
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:cached_tokens_total",
    "sglang:inter_token_latency_seconds_count",
    "sglang:queue_time_seconds_count",
    "sglang:per_stage_req_latency_seconds_count",
    "sglang:num_used_tokens",
    "sglang:token_usage",
    "sglang:max_total_num_tokens",
    "sglang:num_retracted_requests_total",
)
"""More of SGLang's names (python/sglang/srt/metrics/collector.py) that srt has a counterpart
for."""

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "srt-dashboard.json"


def exported(prefix: str) -> set[str]:
    """The sample names of a rendered exposition after one finished request."""
    metrics = TokenizerMetrics("tiny", prefix)
    metrics.observe_tokens(1, 0.1, first=True, streamed=True)
    metrics.observe_tokens(2, 0.02, first=False, streamed=True)
    metrics.observe_finish("length", prompt_tokens=4, cached_tokens=0, e2e=0.2)
    times = RequestTimes(1.0, tokenized=1.01, sent=1.02, queued=1.03, scheduled=1.04)
    times.first_token, times.finished, times.detokenized, times.answered = 1.1, 1.18, 1.19, 1.2
    metrics.observe_stages(times, completion_tokens=3)
    text = metrics.render(GetLoadOut("m", 1, 0, 10, 100)).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_sglang_prefix_exports_every_series_sglangs_dashboard_reads() -> None:
    names = exported("sglang")
    assert set(SGLANG_DASHBOARD_SERIES) <= names
    assert set(SGLANG_COLLECTOR_SERIES) <= names
    assert all(name.startswith("sglang:") for name in names)


def test_other_prefixes_keep_srts_names() -> None:
    srt, custom = exported("srt"), exported("my_llm")
    assert "srt_e2e_request_latency_seconds_count" in srt
    assert "srt_decode_time_per_token_seconds_count" in srt
    assert {"my_llm" + name[len("srt") :] for name in srt} == custom
    # Every srt metric SGLang has a counterpart of is renamed to it, and only those.
    for name, sglang in SGLANG_NAMES.items():
        assert metric_name(name, "sglang") == f"sglang:{sglang}"
    assert metric_name("kv_integrity_violations", "sglang") == "sglang:kv_integrity_violations"


@pytest.mark.parametrize("prefix", ["", "9lives", "srt-x", "a:b", "sp ace"])
def test_a_bad_prefix_is_refused_naming_the_flag(prefix: str) -> None:
    with pytest.raises(ServerArgsError, match="--metrics-name-prefix"):
        ServerArgs(metrics_name_prefix=prefix)


def test_the_flag_parses_and_the_patterns_agree() -> None:
    assert parse_args(["--metrics-name-prefix", "sglang"]).metrics_name_prefix == "sglang"
    assert ServerArgs().metrics_name_prefix == "srt"
    assert server_args_check._METRICS_PREFIX.pattern == PREFIX_PATTERN.pattern


def test_srts_dashboard_queries_only_series_srt_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert exprs
    queried = {name for expr in exprs for name in re.findall(r"\bsrt_[a-z0-9_]+", expr)}
    names = exported("srt")
    assert queried <= names, queried - names
    # It shows the stage breakdown and the latencies operators start from.
    for wanted in (
        "srt_request_stage_seconds_bucket",
        "srt_queue_time_seconds_bucket",
        "srt_time_to_first_token_seconds_bucket",
        "srt_e2e_request_latency_seconds_bucket",
    ):
        assert wanted in queried
