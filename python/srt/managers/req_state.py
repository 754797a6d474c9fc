"""The tokenizer manager's per-request state, and the SGLang-shaped results built from it.

The receive loop appends what each `BatchStrOut` brings to the `ReqState` of its request id;
`ReqState.result` turns the state into the dict a caller of `generate_request` gets: all of it,
or (streaming) what was added since the previous chunk, tracked by the `*_sent` counters.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from srt.io_struct import FinishReason
from srt.managers.generate_req_input import ReqInput
from srt.managers.request_times import RequestTimes


@dataclass(eq=False)
class ReqState:
    """One request id in flight, as the receive loop updates it."""

    req: ReqInput
    input_ids: tuple[int, ...]
    notify: asyncio.Event
    """Shared by the requests of one `generate_request` call: set on every update."""
    times: RequestTimes
    created: float = field(default_factory=time.perf_counter)
    """When its `generate_request` call began (`time.perf_counter`)."""
    pieces: list[str] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    input_token_logprobs: list[float | None] = field(default_factory=list)
    input_top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    input_logprobs_sent: int = 0  # prompt positions a stream has yielded
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: FinishReason | None = None
    finished_at: float | None = None
    last_token_at: float | None = None
    # What a stream has yielded so far: pieces and ids, and whether its last chunk went out.
    pieces_sent: int = 0
    ids_sent: int = 0
    done: bool = False
    sent: bool = False
    """Whether the scheduler got the request (else nothing of it can come back)."""
    abandoned: bool = False
    """Whether its caller went away before it finished (its final result has no reader)."""
    reported: bool = False
    """Whether its finish was logged and counted (`request_report`)."""

    @property
    def prompt_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def has_news(self) -> bool:
        """Whether a stream has something to yield (new ids, or the finish)."""
        return len(self.output_ids) > self.ids_sent or (self.finished and not self.done)

    def result(self, indexed: bool, stream: bool, timing: bool = False) -> dict[str, Any]:
        """The SGLang-shaped dict of the request: all of it, or (stream) what is new since the
        previous chunk. Marks what it returns as yielded; the final result stamps the request
        answered and, with `timing`, carries its stage times (`RequestTimes.meta_info`)."""
        start_piece = self.pieces_sent if stream else 0
        start_id = self.ids_sent if stream else 0
        ids = self.output_ids[start_id:]
        self.pieces_sent = len(self.pieces)
        self.ids_sent = len(self.output_ids)
        self.done = self.finished
        end = self.finished_at if self.finished_at is not None else time.perf_counter()
        reason = self.finish_reason
        meta: dict[str, Any] = {
            "id": self.req.rid,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": reason.to_json() if reason is not None else None,
            "e2e_latency": end - self.created,
        }
        if self.req.return_logprob:
            meta["output_token_logprobs"] = [
                (logprob, token, None)
                for logprob, token in zip(self.output_logprobs[start_id:], ids, strict=False)
            ]
            meta["output_top_logprobs"] = [
                [(logprob, token, None) for token, logprob in top]
                for top in self.output_top_logprobs[start_id:]
            ]
            if self.req.logprob_start_len >= 0:
                meta.update(self.input_logprobs(stream))
        if reason is not None:
            self.times.answered = self.times.answered or time.time()
            if timing:
                meta.update(self.times.meta_info(self.completion_tokens))
        out: dict[str, Any] = {
            "text": "".join(self.pieces[start_piece:]),
            "output_ids": ids,
            "meta_info": meta,
        }
        if indexed:
            out["index"] = self.req.index
        return out

    def input_logprobs(self, stream: bool) -> dict[str, Any]:
        """SGLang's `input_token_logprobs`: `(logprob, id, None)` per prompt position from
        `logprob_start_len` on (logprob None at position 0), and with `top_logprobs_num` its
        `input_top_logprobs` (None at position 0). A stream has them in one chunk (the first
        after the prompt is prefilled), empty in the others."""
        start = self.req.logprob_start_len
        begin = self.input_logprobs_sent if stream else 0
        self.input_logprobs_sent = len(self.input_token_logprobs)
        positions = range(start + begin, start + len(self.input_token_logprobs))
        out: dict[str, Any] = {
            "input_token_logprobs": [
                (self.input_token_logprobs[p - start], self.input_ids[p], None) for p in positions
            ]
        }
        if self.req.top_logprobs_num:
            out["input_top_logprobs"] = [
                [(logprob, token, None) for token, logprob in self.input_top_logprobs[p - start]]
                if p
                else None
                for p in positions
            ]
        return out
