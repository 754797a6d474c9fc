"""What `bench_serving.py` records per request and how it sums a run up (SGLang's and vLLM's
metric names): TTFT, TPOT per request ((e2e - ttft) / (output tokens - 1)), ITL (every gap between
content chunks), E2E, each as mean, median and p99 in milliseconds; request, input and output
throughput over the run's duration; the server's prefix-cache hit rate."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class RequestResult:
    """One request as the client saw it. Times are seconds from sending it."""

    index: int
    expected_output_len: int
    prompt_len: int
    """The server's `usage.prompt_tokens`, else the benchmark tokenizer's count."""
    success: bool = False
    error: str = ""
    ttft: float = 0.0
    e2e: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    """When each chunk carrying text arrived."""
    output_len: int = 0
    """The server's `usage.completion_tokens`, else the number of content chunks."""
    cached_tokens: int | None = None
    """`usage.prompt_tokens_details.cached_tokens`, where the server reports it."""

    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]

    def tpot(self) -> float | None:
        if self.output_len < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_len - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linearly interpolated between closest ranks, as numpy's
    default."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def describe_ms(name: str, seconds: Sequence[float]) -> dict[str, float | None]:
    """`mean_<name>_ms`, `median_<name>_ms` and `p99_<name>_ms`; None where nothing was
    measured."""
    ms = [s * 1000 for s in seconds]
    return {
        f"mean_{name}_ms": statistics.fmean(ms) if ms else None,
        f"median_{name}_ms": statistics.median(ms) if ms else None,
        f"p99_{name}_ms": percentile(ms, 99) if ms else None,
    }


def summarize(results: Sequence[RequestResult], duration: float) -> dict[str, Any]:
    """The metrics of a run that took `duration` seconds; failed requests are counted and
    listed, and count in no other figure."""
    if duration <= 0:
        raise ValueError(f"a run's duration must be positive, got {duration}")
    done = [r for r in results if r.success]
    failed = [r for r in results if not r.success]
    input_tokens = sum(r.prompt_len for r in done)
    output_tokens = sum(r.output_len for r in done)
    reported = [r for r in done if r.cached_tokens is not None]
    reported_prompt = sum(r.prompt_len for r in reported)
    summary: dict[str, Any] = {
        "completed": len(done),
        "failed": len(failed),
        "errors": [{"request": r.index, "error": r.error} for r in failed],
        "duration_s": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "output_len_mismatches": sum(r.output_len != r.expected_output_len for r in done),
        "request_throughput": len(done) / duration,
        "input_throughput": input_tokens / duration,
        "output_throughput": output_tokens / duration,
        # Only when every successful request reported its cached tokens: a partial sum would
        # understate the rate.
        "cache_hit_rate": (
            sum(r.cached_tokens or 0 for r in reported) / reported_prompt
            if done and len(reported) == len(done) and reported_prompt
            else None
        ),
    }
    summary |= describe_ms("ttft", [r.ttft for r in done])
    summary |= describe_ms("tpot", [t for r in done if (t := r.tpot()) is not None])
    summary |= describe_ms("itl", [gap for r in done for gap in r.itls()])
    summary |= describe_ms("e2e", [r.e2e for r in done])
    return summary
