"""A request's stage times, gathered across the three processes, and the breakdown they give.

Every point is wall-clock seconds (`time.time()`): monotonic clocks do not cross processes, the
system clock does. The main process stamps `received` (its `generate_request` call began),
`tokenized`, `sent` (handed to ring "scheduler") and `answered` (its final result was built for
the caller); the scheduler `queued` (it read the request), `scheduled` (first admitted to a
batch), `first_token` and `finished`; the detokenizer `detokenized` (it sent the final text on;
with `--grpc-mode`, which runs no detokenizer, the main process stamps it as it reads the
scheduler's finished message).
The scheduler's four and the detokenizer's one ride the finished message
(`io_struct.ReqTimeStats`, `BatchStrOut.detokenized_at`).

Stages are the spans between consecutive points, named by where they start:

    received ─tokenize─▶ tokenized ─send─▶ sent ─transfer─▶ queued ─queue─▶ scheduled
      ─prefill─▶ first_token ─decode─▶ finished ─detokenize─▶ detokenized ─answer─▶ answered

`transfer` includes waiting for ring space and for the scheduler's current step to end;
`detokenize` the ring to the detokenizer and its work; `answer` the ring back, the main
process's event loop and the result's assembly. A point a request never reached (0.0: refused,
aborted while queued, or its caller left before the answer) folds its stage into the one
before, so the stages always add up to the last point reached minus `received`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from srt.io_struct import ReqTimeStats

POINTS = (
    "received",
    "tokenized",
    "sent",
    "queued",
    "scheduled",
    "first_token",
    "finished",
    "detokenized",
    "answered",
)
STAGES = ("tokenize", "send", "transfer", "queue", "prefill", "decode", "detokenize", "answer")
"""`STAGES[i]` runs from `POINTS[i]` to `POINTS[i + 1]`."""


@dataclass(eq=False, slots=True)
class RequestTimes:
    """The points one request has reached so far (0.0: not reached)."""

    received: float
    tokenized: float = 0.0
    sent: float = 0.0
    queued: float = 0.0
    scheduled: float = 0.0
    first_token: float = 0.0
    finished: float = 0.0
    detokenized: float = 0.0
    answered: float = 0.0

    def absorb(self, stats: ReqTimeStats, detokenized_at: float) -> None:
        """Takes the scheduler's and the detokenizer's points from the finished message."""
        self.queued = stats.queued
        self.scheduled = stats.scheduled
        self.first_token = stats.first_token
        self.finished = stats.finished
        self.detokenized = detokenized_at

    def points(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in POINTS}

    def spans(self) -> list[tuple[str, float, float]]:
        """(stage, start, end) of each stage the request went through, in order (see the module
        docstring): each starts where the one before ended."""
        out: list[tuple[str, float, float]] = []
        stage, start = STAGES[0], self.received
        for i, name in enumerate(POINTS[1:]):
            at = getattr(self, name)
            if not at:
                continue
            out.append((stage, start, at))
            if i + 1 < len(STAGES):
                stage, start = STAGES[i + 1], at
        return out

    def stages(self) -> dict[str, float]:
        """Seconds in each stage the request went through."""
        return {stage: end - start for stage, start, end in self.spans()}

    def meta_info(self, completion_tokens: int) -> dict[str, Any]:
        """The timing fields of a finished request's `meta_info`: SGLang's names where SGLang
        has the field (its `--enable-metrics` meta_info), and srt's whole breakdown."""
        out: dict[str, Any] = {"request_received_ts": self.received}
        sglang_points = (
            ("request_sent_to_scheduler_ts", self.sent),
            ("prefill_finished_ts", self.first_token),
            ("decode_finished_ts", self.finished),
            ("response_sent_to_client_ts", self.answered),
        )
        out.update((key, at) for key, at in sglang_points if at)
        if self.scheduled:
            out["queue_time"] = self.scheduled - self.queued
        decode = self.finished - self.first_token
        if self.first_token and decode > 0:
            out["decode_throughput"] = completion_tokens / decode  # SGLang's formula
        out["time_stats"] = {name: at for name, at in self.points().items() if at}
        out["stage_latencies"] = self.stages()
        return out

    def log_fields(self) -> str:
        """The stages for the `Finish:` log line, in milliseconds: `tokenize=0.21ms ...`."""
        return " ".join(f"{stage}={1e3 * s:.2f}ms" for stage, s in self.stages().items())
