"""The names srt's Prometheus series are exported under (`--metrics-name-prefix`).

With a prefix P (default `srt`), each metric is `P_<name>`: `srt_e2e_request_latency_seconds`.
With `sglang`, each metric that has a counterpart in SGLang takes SGLang's own name
(`sglang:e2e_request_latency_seconds`, `sglang:num_requests_total`, ...), so SGLang's Grafana
dashboards and alerts read srt unchanged; the others are `sglang:<name>`. Counters gain
`_total`, histograms `_bucket`/`_sum`/`_count`, from `prometheus_client`, as in SGLang.
"""

from __future__ import annotations

import re

DEFAULT_PREFIX = "srt"
SGLANG_PREFIX = "sglang"
PREFIX_PATTERN = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
"""A prefix makes `PREFIX_name` a valid Prometheus name (no colon: those are for SGLang's)."""

SGLANG_NAMES: dict[str, str] = {
    "requests": "num_requests",
    "prompt_tokens": "prompt_tokens",
    "generation_tokens": "generation_tokens",
    "cached_tokens": "cached_tokens",
    "time_to_first_token_seconds": "time_to_first_token_seconds",
    "inter_token_latency_seconds": "inter_token_latency_seconds",
    "e2e_request_latency_seconds": "e2e_request_latency_seconds",
    "queue_time_seconds": "queue_time_seconds",
    # SGLang's name (before its per-stage histogram) for this same quantity: a request's decode
    # time over its output tokens after the first.
    "decode_time_per_token_seconds": "time_per_output_token_seconds",
    "request_stage_seconds": "per_stage_req_latency_seconds",
    "num_running_reqs": "num_running_reqs",
    "num_queue_reqs": "num_queue_reqs",
    "num_used_tokens": "num_used_tokens",
    "max_total_tokens": "max_total_num_tokens",
    "token_usage": "token_usage",
    "cache_hit_rate": "cache_hit_rate",
    "gen_throughput": "gen_throughput",
    "retracted_requests": "num_retracted_requests",
}
"""srt's name → SGLang's (both without prefix), for every metric SGLang also exports."""


def metric_name(name: str, prefix: str) -> str:
    """The exported name of srt metric `name` under `prefix` (see the module docstring)."""
    if prefix == SGLANG_PREFIX:
        return f"sglang:{SGLANG_NAMES.get(name, name)}"
    return f"{prefix}_{name}"
