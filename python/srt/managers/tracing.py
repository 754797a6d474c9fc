"""OpenTelemetry traces of requests, with SGLang's flags: `--enable-trace` exports them over
OTLP/gRPC to `--otlp-traces-endpoint` (needs `pip install 'srt[trace]'`).

Each finished request is one trace: a root span `srt.request` from its arrival in the main
process to its answer (or to the last point it reached), and under it one span per stage it
went through (`srt.tokenize` ... `srt.answer`, see `request_times`), each with its own start
and end and the process that ran it (`srt.process`). The scheduler and the detokenizer stamp
their points on the request and send them with its finished message (the same points as the
log line and the metrics); the main process turns them into spans when it reports the request.
So the trace spans all three processes while only the main process calls OpenTelemetry: the
scheduler's and the detokenizer's loops pay nothing, and every span's parent is in its trace by
construction. Off (the default), `opentelemetry` is never imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from srt.managers.request_times import RequestTimes

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

STAGE_PROCESS = {
    "tokenize": "main",
    "send": "main",
    "transfer": "scheduler",
    "queue": "scheduler",
    "prefill": "scheduler",
    "decode": "scheduler",
    "detokenize": "detokenizer",
    "answer": "main",
}
"""The process whose work (or wait) a stage is: `transfer` ends when the scheduler reads the
request, `detokenize` when the detokenizer sends the text on, `answer` in the main process."""


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class RequestTracer:
    """Turns finished requests into spans and exports them."""

    def __init__(self, endpoint: str = "", exporter: SpanExporter | None = None) -> None:
        """Exports to the OTLP/gRPC collector at `endpoint` in batches, or (tests) to
        `exporter` as each span ends."""
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        except ImportError as e:
            raise RuntimeError(
                "--enable-trace needs OpenTelemetry: pip install 'srt[trace]'"
            ) from e
        self.provider = TracerProvider(resource=Resource.create({"service.name": "srt"}))
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            otlp = OTLPSpanExporter(endpoint=endpoint, insecure=True)
            self.provider.add_span_processor(BatchSpanProcessor(otlp))
        else:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("srt")

    def trace(self, times: RequestTimes, attributes: dict[str, Any]) -> None:
        """One request's trace, from its points; `attributes` go on its root span."""
        from opentelemetry import trace

        spans = times.spans()
        end = spans[-1][2] if spans else times.received
        root = self.tracer.start_span(
            "srt.request", start_time=_ns(times.received), attributes=attributes
        )
        parent = trace.set_span_in_context(root)
        for stage, start, stop in spans:
            span = self.tracer.start_span(
                f"srt.{stage}",
                context=parent,
                start_time=_ns(start),
                attributes={"srt.process": STAGE_PROCESS[stage], "srt.stage": stage},
            )
            span.end(end_time=_ns(stop))
        root.end(end_time=_ns(end))

    def shutdown(self) -> None:
        """Exports what is left and stops."""
        self.provider.shutdown()
