"""Prometheus metrics of the main process (issue item 4, `/metrics` with `--enable-metrics`).

`TokenizerMetrics` keeps its own `CollectorRegistry`, so several servers or Engines in one
process do not collide. The TokenizerManager feeds it from every result it receives:

- tokens as they arrive: the generation counter, and for streamed requests the time to first
  token and the inter-token latency (a non-streamed request's first message is its whole output,
  so it says nothing about either);
- each finished request: the request counter by finish type, prompt and cached tokens, e2e
  latency.

What only the scheduler knows (running and queued requests, KV usage, integrity-check
violations, retractions) comes from its `GetLoadOut` when the metrics are rendered. Names start
with `srt_` (SGLang's `sglang:` is not a valid name outside its own exporter); every series
carries the served model's name.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from srt.io_struct import GetLoadOut

# The classic text format, which every Prometheus version scrapes; `render` writes it (srt's
# names need no escaping, so it reads the same in the 1.0.0 format).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

FINISH_TYPES = ("stop", "length", "abort")

# Seconds; wide enough for a GPU's milliseconds and a loaded CPU's seconds.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640, 1280)


class TokenizerMetrics:
    """The server's Prometheus metrics, for model `model_name`."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ("model_name",)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=self.registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, registry=self.registry, buckets=buckets)

        requests = Counter(
            "srt_requests",
            "Finished requests, by finish type (stop, length, abort).",
            (*labels, "finish_reason"),
            registry=self.registry,
        )
        self.requests = {t: requests.labels(model_name, t) for t in FINISH_TYPES}
        self.prompt_tokens = counter(
            "srt_prompt_tokens", "Prompt tokens of finished requests."
        ).labels(model_name)
        self.generation_tokens = counter(
            "srt_generation_tokens", "Generated tokens, counted as they arrive."
        ).labels(model_name)
        self.cached_tokens = counter(
            "srt_cached_tokens", "Prompt tokens of finished requests served from the prefix cache."
        ).labels(model_name)
        self.ttft = histogram(
            "srt_time_to_first_token_seconds",
            "Time from a streamed request's arrival to its first token.",
            TTFT_BUCKETS,
        ).labels(model_name)
        self.itl = histogram(
            "srt_inter_token_latency_seconds",
            "Time between consecutive tokens of a streamed request.",
            ITL_BUCKETS,
        ).labels(model_name)
        self.e2e = histogram(
            "srt_e2e_request_latency_seconds",
            "Time from a request's arrival to its finish.",
            E2E_BUCKETS,
        ).labels(model_name)
        self.running = gauge("srt_num_running_reqs", "Requests running.").labels(model_name)
        self.queued = gauge("srt_num_queue_reqs", "Requests waiting for admission.").labels(
            model_name
        )
        self.used_tokens = gauge(
            "srt_num_used_tokens", "KV slots held by requests or locked in the prefix cache."
        ).labels(model_name)
        self.total_tokens = gauge("srt_max_total_tokens", "KV slots in all.").labels(model_name)
        self.token_usage = gauge("srt_token_usage", "Used over total KV slots.").labels(model_name)
        self.cache_hit_rate = gauge(
            "srt_cache_hit_rate", "Cached over prompt tokens of the requests finished so far."
        ).labels(model_name)
        self.violations = counter(
            "srt_kv_integrity_violations", "Failed KV integrity checks in the scheduler."
        ).labels(model_name)
        self.retracted = counter(
            "srt_retracted_requests", "Requests retracted because the KV cache ran short."
        ).labels(model_name)
        # The scheduler reports these two as running totals; the counters add the difference.
        self.seen_violations = 0
        self.seen_retracted = 0
        self.prompt_total = 0
        self.cached_total = 0

    def observe_tokens(self, count: int, elapsed: float, first: bool, streamed: bool) -> None:
        """`count` new tokens of one request arrived, `elapsed` seconds after its arrival
        (`first`) or after its previous tokens. The gap is spread evenly over the tokens of a
        message (with `--stream-interval` > 1, a message carries several)."""
        if count <= 0:
            return
        self.generation_tokens.inc(count)
        if not streamed:
            return
        if first:
            self.ttft.observe(elapsed)
            return
        gap = elapsed / count
        for _ in range(count):
            self.itl.observe(gap)

    def observe_finish(
        self, finish_type: str, prompt_tokens: int, cached_tokens: int, e2e: float
    ) -> None:
        """One request finished (`finish_type` "stop", "length" or "abort")."""
        counter = self.requests.get(finish_type)
        if counter is None:
            raise ValueError(f"unknown finish type {finish_type!r}")
        counter.inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_tokens.inc(cached_tokens)
        self.e2e.observe(e2e)
        self.prompt_total += prompt_tokens
        self.cached_total += cached_tokens
        self.cache_hit_rate.set(self.cached_total / self.prompt_total if self.prompt_total else 0)

    def render(self, load: GetLoadOut) -> bytes:
        """Every metric in Prometheus' text format (`CONTENT_TYPE`), the scheduler's gauges
        taken from `load`."""
        self.running.set(load.num_running_reqs)
        self.queued.set(load.num_waiting_reqs)
        self.used_tokens.set(load.num_used_tokens)
        self.total_tokens.set(load.max_total_tokens)
        usage = load.num_used_tokens / load.max_total_tokens if load.max_total_tokens else 0.0
        self.token_usage.set(usage)
        if load.invariant_violations > self.seen_violations:
            self.violations.inc(load.invariant_violations - self.seen_violations)
            self.seen_violations = load.invariant_violations
        if load.num_retracted_reqs > self.seen_retracted:
            self.retracted.inc(load.num_retracted_reqs - self.seen_retracted)
            self.seen_retracted = load.num_retracted_reqs
        return generate_latest(self.registry)
