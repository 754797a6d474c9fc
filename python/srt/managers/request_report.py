"""What the main process does once for each finished request: its `Finish:` log line, its
Prometheus observations (counters, end-to-end latency, stage times), its trace, and its entry
among the recent requests (`recent_requests`).

A request is reported when its final result is built for its caller (so the `answer` stage is
known), or, when its caller went away first, when its final message arrives or its call ends.
`ReqState.reported` makes it once.
"""

from __future__ import annotations

import time

from srt.managers.metrics import TokenizerMetrics
from srt.managers.recent_requests import RecentRequests
from srt.managers.req_state import ReqState
from srt.managers.request_log import log_finished
from srt.managers.tracing import RequestTracer


class RequestReporter:
    """Logs, counts and traces finished requests (`metrics`, `tracer` None: not those)."""

    def __init__(
        self,
        metrics: TokenizerMetrics | None,
        log_texts: bool,
        tracer: RequestTracer | None = None,
    ) -> None:
        self.metrics = metrics
        self.log_texts = log_texts
        self.tracer = tracer
        self.recent = RecentRequests()

    def report(self, state: ReqState) -> None:
        """Logs and counts `state`'s request, if it finished and was not reported yet."""
        reason = state.finish_reason
        if reason is None or state.reported:
            return
        state.reported = True
        end = state.finished_at if state.finished_at is not None else time.perf_counter()
        e2e = end - state.created
        self.recent.add(state.req.rid, reason.type, e2e, state.times)
        if self.metrics is not None:
            self.metrics.observe_finish(reason.type, state.prompt_tokens, state.cached_tokens, e2e)
            self.metrics.observe_stages(state.times, state.completion_tokens)
        if self.tracer is not None:
            attributes = {
                "srt.rid": state.req.rid,
                "srt.finish_reason": reason.type,
                "srt.prompt_tokens": state.prompt_tokens,
                "srt.completion_tokens": state.completion_tokens,
                "srt.cached_tokens": state.cached_tokens,
            }
            self.tracer.trace(state.times, attributes)
        texts = None
        if self.log_texts:
            prompt = state.req.text if state.req.text is not None else str(list(state.input_ids))
            texts = (prompt, "".join(state.pieces))
        log_finished(
            state.req.rid,
            reason,
            state.prompt_tokens,
            state.completion_tokens,
            state.cached_tokens,
            e2e,
            state.times.log_fields(),
            texts,
        )

    def close(self) -> None:
        """Exports the traces still buffered."""
        if self.tracer is not None:
            self.tracer.shutdown()
            self.tracer = None
