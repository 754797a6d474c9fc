"""OpenTelemetry traces of requests (`--enable-trace`), into an in-memory exporter: one trace per
request, a root span with a child per stage, the stages' processes and times those the
scheduler and the detokenizer stamped, on real requests through the three processes."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from srt.entrypoints.engine import Engine
from srt.managers.request_times import POINTS, STAGES, RequestTimes
from srt.managers.tracing import STAGE_PROCESS, RequestTracer
from srt.server_args import ServerArgs
from srt.server_cli import parse_args

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

PARAMS = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}


def by_trace(spans: tuple[ReadableSpan, ...]) -> dict[int, list[ReadableSpan]]:
    out: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        assert span.context is not None
        out.setdefault(span.context.trace_id, []).append(span)
    return out


def check_trace(spans: list[ReadableSpan]) -> tuple[ReadableSpan, list[ReadableSpan]]:
    """The root and its stage spans, in order; checks their parentage and that the stages
    tile the root."""
    (root,) = [s for s in spans if s.parent is None]
    children = sorted((s for s in spans if s.parent is not None), key=lambda s: s.start_time or 0)
    assert root.name == "srt.request"
    assert root.context is not None
    for child in children:
        assert child.parent is not None
        assert child.parent.span_id == root.context.span_id
        assert child.attributes is not None
        assert child.attributes["srt.process"] == STAGE_PROCESS[child.name[len("srt.") :]]
    assert children[0].start_time == root.start_time
    assert children[-1].end_time == root.end_time
    for before, after in itertools.pairwise(children):
        assert before.end_time == after.start_time
    return root, children


def test_a_request_is_a_root_span_over_one_span_per_stage() -> None:
    exporter = InMemorySpanExporter()
    tracer = RequestTracer(exporter=exporter)
    times = RequestTimes(*(100.0 + i for i in range(len(POINTS))))
    tracer.trace(times, {"srt.rid": "r"})
    aborted = RequestTimes(200.0, tokenized=200.5, sent=201.0, queued=202.0, finished=203.0)
    tracer.trace(aborted, {"srt.rid": "a"})
    tracer.shutdown()
    traces = list(by_trace(exporter.get_finished_spans()).values())
    assert len(traces) == 2
    root, children = check_trace(traces[0])
    assert root.attributes == {"srt.rid": "r"}
    assert [c.name for c in children] == [f"srt.{stage}" for stage in STAGES]
    assert (root.start_time, root.end_time) == (100 * 10**9, 108 * 10**9)
    _, children = check_trace(traces[1])
    assert [c.name for c in children] == ["srt.tokenize", "srt.send", "srt.transfer", "srt.queue"]


@pytest.mark.slow
def test_real_requests_trace_the_stages_of_all_three_processes(
    tiny_model_factory: Callable[[str], Path],
) -> None:
    exporter = InMemorySpanExporter()
    model = str(tiny_model_factory("llama"))
    with Engine(model_path=model, context_length=512, enable_metrics=True) as engine:
        engine.tokenizer_manager.reporter.tracer = RequestTracer(exporter=exporter)
        plain = engine.generate("a traced request", PARAMS, rid="plain")
        chunks = list(engine.generate("a traced stream", PARAMS, stream=True, rid="streamed"))
    metas: dict[str, Any] = {
        "plain": plain["meta_info"],  # type: ignore[call-overload]
        "streamed": chunks[-1]["meta_info"],
    }
    traces = by_trace(exporter.get_finished_spans())
    assert len(traces) == 2
    for spans in traces.values():
        root, children = check_trace(spans)
        assert root.attributes is not None
        rid = str(root.attributes["srt.rid"])
        meta = metas[rid]
        assert root.attributes["srt.completion_tokens"] == meta["completion_tokens"]
        assert [c.name for c in children] == [f"srt.{stage}" for stage in STAGES]
        # The spans are the points the three processes stamped.
        points = meta["time_stats"]
        starts = [c.start_time for c in children] + [children[-1].end_time]
        assert starts == [int(points[name] * 1e9) for name in POINTS]
        assert {c.attributes["srt.process"] for c in children if c.attributes} == {
            "main",
            "scheduler",
            "detokenizer",
        }


def test_the_flags_and_no_opentelemetry_import_when_off() -> None:
    args = parse_args(["--enable-trace", "--otlp-traces-endpoint", "collector:4317"])
    assert args.enable_trace
    assert args.otlp_traces_endpoint == "collector:4317"
    assert not ServerArgs().enable_trace
    assert ServerArgs().otlp_traces_endpoint == "localhost:4317"  # SGLang's default
    code = (
        "import sys; import srt.managers.tokenizer_manager; "
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
