"""What the main process does once for each finished request: its `Finish:` log line and its
Prometheus observations (counters, end-to-end latency, stage times).

A request is reported when its final result is built for its caller (so the `answer` stage is
known), or, when its caller went away first, when its final message arrives or its call ends.
`ReqState.reported` makes it once.
"""

from __future__ import annotations

import time

from srt.managers.metrics import TokenizerMetrics
from srt.managers.req_state import ReqState
from srt.managers.request_log import log_finished


class RequestReporter:
    """Logs and counts finished requests; `metrics` None: logs only."""

    def __init__(self, metrics: TokenizerMetrics | None, log_texts: bool) -> None:
        self.metrics = metrics
        self.log_texts = log_texts

    def report(self, state: ReqState) -> None:
        """Logs and counts `state`'s request, if it finished and was not reported yet."""
        reason = state.finish_reason
        if reason is None or state.reported:
            return
        state.reported = True
        end = state.finished_at if state.finished_at is not None else time.perf_counter()
        e2e = end - state.created
        if self.metrics is not None:
            self.metrics.observe_finish(reason.type, state.prompt_tokens, state.cached_tokens, e2e)
            self.metrics.observe_stages(state.times, state.completion_tokens)
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
