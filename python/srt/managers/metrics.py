"""Prometheus metrics of the main process (issue item 4, `/metrics` with `--enable-metrics`).

`TokenizerMetrics` keeps its own `CollectorRegistry`, so several servers or Engines in one
process do not collide. The TokenizerManager feeds it from every result it receives:

- tokens as they arrive: the generation counter, and for streamed requests the time to first
  token and the inter-token latency (a non-streamed request's first message is its whole output,
  so it says nothing about either);
- each finished request (`request_report`): the request counter by finish type, prompt and
  cached tokens, e2e latency, and from its stage times (`request_times`) its queue time,
  prefill time, decode time per output token and every stage's time (label `stage`).

What only the scheduler knows (running and queued requests, KV usage, integrity-check
violations, retractions) comes from its `GetLoadOut` when the metrics are rendered, and the
generation throughput is the tokens generated between two renders over the time between them.
Names start with `srt_`, or another `--metrics-name-prefix`; with `sglang` they are SGLang's
(`metric_names`). Every series carries the served model's name.
"""

from __future__ import annotations

import time

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from srt.io_struct import GetLoadOut
from srt.managers.metric_names import DEFAULT_PREFIX, metric_name
from srt.managers.request_times import STAGES, RequestTimes

# The classic text format, which every Prometheus version scrapes; `render` writes it (srt's
# names, SGLang's colons included, need no escaping, so it reads the same in the 1.0.0 format).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

FINISH_TYPES = ("stop", "length", "abort")

# Seconds; wide enough for a GPU's milliseconds and a loaded CPU's seconds.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640, 1280)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
# Stages run from tens of microseconds (a ring hop) to minutes (a long decode).
STAGE_BUCKETS: tuple[float, ...] = (1e-4, 2.5e-4, 5e-4, 0.001, 0.0025, 0.005, 0.01, 0.025)
STAGE_BUCKETS += (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)


class TokenizerMetrics:
    """The server's Prometheus metrics, for model `model_name`, named under `prefix`."""

    def __init__(self, model_name: str, prefix: str = DEFAULT_PREFIX) -> None:
        self.registry = CollectorRegistry()
        labels = ("model_name",)

        def counter(name: str, doc: str) -> Counter:
            return Counter(metric_name(name, prefix), doc, labels, registry=self.registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(metric_name(name, prefix), doc, labels, registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(
                metric_name(name, prefix), doc, labels, registry=self.registry, buckets=buckets
            )

        requests = Counter(
            metric_name("requests", prefix),
            "Finished requests, by finish type (stop, length, abort).",
            (*labels, "finish_reason"),
            registry=self.registry,
        )
        self.requests = {t: requests.labels(model_name, t) for t in FINISH_TYPES}
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.").labels(
            model_name
        )
        self.generation_tokens = counter(
            "generation_tokens", "Generated tokens, counted as they arrive."
        ).labels(model_name)
        self.cached_tokens = counter(
            "cached_tokens", "Prompt tokens of finished requests served from the prefix cache."
        ).labels(model_name)
        self.ttft = histogram(
            "time_to_first_token_seconds",
            "Time from a streamed request's arrival to its first token.",
            TTFT_BUCKETS,
        ).labels(model_name)
        self.itl = histogram(
            "inter_token_latency_seconds",
            "Time between consecutive tokens of a streamed request.",
            ITL_BUCKETS,
        ).labels(model_name)
        self.e2e = histogram(
            "e2e_request_latency_seconds",
            "Time from a request's arrival to its finish.",
            E2E_BUCKETS,
        ).labels(model_name)
        self.queue_time = histogram(
            "queue_time_seconds",
            "Time from a request's arrival in the scheduler to its first batch.",
            QUEUE_BUCKETS,
        ).labels(model_name)
        self.prefill_time = histogram(
            "prefill_time_seconds",
            "Time from a request's first batch to its first token (every prompt chunk).",
            TTFT_BUCKETS,
        ).labels(model_name)
        self.decode_per_token = histogram(
            "decode_time_per_token_seconds",
            "A request's decode time over its output tokens after the first.",
            ITL_BUCKETS,
        ).labels(model_name)
        stage = Histogram(
            metric_name("request_stage_seconds", prefix),
            f"Time requests spend in each stage ({', '.join(STAGES)}).",
            (*labels, "stage"),
            registry=self.registry,
            buckets=STAGE_BUCKETS,
        )
        self.stages = {name: stage.labels(model_name, name) for name in STAGES}
        self.gen_throughput = gauge(
            "gen_throughput", "Tokens generated per second between the last two scrapes."
        ).labels(model_name)
        self.running = gauge("num_running_reqs", "Requests running.").labels(model_name)
        self.queued = gauge("num_queue_reqs", "Requests waiting for admission.").labels(model_name)
        self.used_tokens = gauge(
            "num_used_tokens", "KV slots held by requests or locked in the prefix cache."
        ).labels(model_name)
        self.total_tokens = gauge("max_total_tokens", "KV slots in all.").labels(model_name)
        self.token_usage = gauge("token_usage", "Used over total KV slots.").labels(model_name)
        self.cache_hit_rate = gauge(
            "cache_hit_rate", "Cached over prompt tokens of the requests finished so far."
        ).labels(model_name)
        self.violations = counter(
            "kv_integrity_violations", "Failed KV integrity checks in the scheduler."
        ).labels(model_name)
        self.retracted = counter(
            "retracted_requests", "Requests retracted because the KV cache ran short."
        ).labels(model_name)
        # The scheduler reports these two as running totals; the counters add the difference.
        self.seen_violations = 0
        self.seen_retracted = 0
        self.prompt_total = 0
        self.cached_total = 0
        self.generated_total = 0
        self.last_render = (time.monotonic(), 0)  # (when, generated_total then)

    def observe_tokens(self, count: int, elapsed: float, first: bool, streamed: bool) -> None:
        """`count` new tokens of one request arrived, `elapsed` seconds after its arrival
        (`first`) or after its previous tokens. The gap is spread evenly over the tokens of a
        message (with `--stream-interval` > 1, a message carries several)."""
        if count <= 0:
            return
        self.generation_tokens.inc(count)
        self.generated_total += count
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

    def observe_stages(self, times: RequestTimes, completion_tokens: int) -> None:
        """One finished request's stage times (the stages it reached)."""
        for name, seconds in times.stages().items():
            self.stages[name].observe(seconds)
        if times.scheduled:
            self.queue_time.observe(times.scheduled - times.queued)
            if times.first_token:
                self.prefill_time.observe(times.first_token - times.scheduled)
        if times.first_token and times.finished and completion_tokens > 1:
            decode = times.finished - times.first_token
            self.decode_per_token.observe(decode / (completion_tokens - 1))

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
        now = time.monotonic()
        since, generated = self.last_render
        if now > since:
            self.gen_throughput.set((self.generated_total - generated) / (now - since))
        self.last_render = (now, self.generated_total)
        return generate_latest(self.registry)
