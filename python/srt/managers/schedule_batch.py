"""The scheduler's records: `Req`, one request's mutable state, and `ScheduleBatch`, the requests
of one forward pass.

Data flow through the scheduler (docs/design.md §3-4):

    TokenizedGenerateReq ─▶ Req ─▶ waiting queue ─(policy order, PrefillAdder)─▶ extend batch
        extend batch ─▶ ModelWorkerBatch ─▶ ModelRunner (forward + sample) ─▶ next ids
            ─▶ Req.output_ids ─▶ running batch
        running batch ─▶ decode batch ─▶ ModelRunner ─▶ ... until a finish condition
        finished Req ─▶ its KV slots into the radix cache (unlocked) ─▶ BatchTokenIDOut

The scheduler handles ints only: the runner keeps each request's sampling state (built once, at
its first admission, from `Req.sampling_spec`) and the KV tensors, and returns token ids.

A request's KV lives in `kv_slots`: its first `prefix_len` slots belong to the radix cache
(locked through `last_node` while the request holds them), the rest to the request itself. The
tokens that have KV are `all_ids[:kv_len]`; the newest output token never has KV until the next
decode step feeds it. The runner's `ReqToTokenPool` row holds the first `row_synced` of
`kv_slots`: the next batch of the request tells it the rest. A retracted request gives its
slots back and keeps its output ids: when it is admitted again, its prompt and outputs are
extended together (mostly from the cache).
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field

from srt.forward_mode import ForwardMode
from srt.io_struct import (
    BatchTokenIDOut,
    DetokenizeSettings,
    FinishReason,
    ReqTimeStats,
    TokenizedGenerateReq,
)
from srt.model_executor.worker_batch import PromptLogprobs, RequestSamplingSpec
from srt.sampling_params import SamplingParams

# How many prompt ids the detokenizer decodes ahead of the output (see incremental_detokenizer).
CONTEXT_IDS = 5


class Req:
    """One request, from admission to finish (retractions included)."""

    def __init__(self, recv: TokenizedGenerateReq, eos_token_ids: frozenset[int]) -> None:
        self.rid = recv.rid
        self.origin_input_ids = array("i", recv.input_ids)
        self.sampling_params: SamplingParams = recv.sampling_params
        self.stream = recv.stream
        self.return_logprob = recv.return_logprob
        self.top_logprobs_num = recv.top_logprobs_num
        self.arrival = time.monotonic()
        # Wall-clock stage times, sent with the finished message (`io_struct.ReqTimeStats`).
        self.queued_at = time.time()
        self.scheduled_at = 0.0  # first admitted to a batch (a retraction does not reset it)
        self.first_token_at = 0.0
        self.finished_at = 0.0
        params = self.sampling_params
        self.stop_token_ids = (
            frozenset() if params.ignore_eos else eos_token_ids | set(params.stop_token_ids)
        )

        self.output_ids: list[int] = []
        self.output_logprobs: list[float] = []
        self.output_top_logprobs: list[tuple[tuple[int, float], ...]] = []
        self.finished_reason: FinishReason | None = None
        self.sent_len = 0  # output ids already sent to the detokenizer
        self.settings_sent = False  # whether the detokenizer has its `DetokenizeSettings`

        # Prompt logprobs (SGLang's `logprob_start_len`, -1: none): one entry per prompt
        # position from the start on (position 0 has no logprob: None, and no top pairs),
        # gathered chunk by chunk, sent once.
        self.logprob_start_len = recv.logprob_start_len if recv.return_logprob else -1
        at_zero = self.logprob_start_len == 0
        self.input_token_logprobs: list[float | None] = [None] if at_zero else []
        self.input_top_logprobs: list[tuple[tuple[int, float], ...]] = (
            [()] if at_zero and self.top_logprobs_num else []
        )
        self.input_logprobs_sent = False

        # KV state (empty while waiting)
        self.row: int | None = None  # ReqToTokenPool row
        self.row_synced = 0  # leading kv_slots the runner has written into the row
        self.kv_slots = array("i")
        self.prefix_len = 0  # leading kv_slots owned by the radix cache
        self.last_node: int | None = None  # radix node locked for them
        self.cached_tokens = 0  # prompt tokens served from the cache at first admission
        self.admitted = False
        # Set by the prefill adder: the tokens the next extend computes (a chunk may be shorter
        # than the rest of the prompt) and the cache hit it starts after.
        self.extend_ids: list[int] = []

    # ---- token views -------------------------------------------------------------------------

    @property
    def fill_len(self) -> int:
        """Prompt plus output tokens: everything the model has seen or produced."""
        return len(self.origin_input_ids) + len(self.output_ids)

    def fill_ids(self) -> array[int]:
        """Prompt plus output ids, the key a (re-)admitted request is matched with."""
        ids = array("i", self.origin_input_ids)
        ids.extend(self.output_ids)
        return ids

    @property
    def kv_len(self) -> int:
        return len(self.kv_slots)

    @property
    def held_slots(self) -> int:
        """KV slots the request owns itself (not the cache's)."""
        return self.kv_len - self.prefix_len

    @property
    def remaining_new_tokens(self) -> int:
        return self.sampling_params.max_new_tokens - len(self.output_ids)

    def finished(self) -> bool:
        return self.finished_reason is not None

    # ---- prompt logprobs ---------------------------------------------------------------------

    @property
    def input_logprobs_pending(self) -> bool:
        """Whether prompt logprobs are asked for and not all computed yet."""
        start = self.logprob_start_len
        return start >= 0 and len(self.input_token_logprobs) < len(self.origin_input_ids) - start

    @property
    def first_logit_position(self) -> int:
        """The first position whose logits give a prompt logprob (of the token after it)."""
        return max(self.logprob_start_len, 1) - 1

    def prefix_limit(self) -> int:
        """How many leading fill ids may come from the cache: all but the last (whose logits
        give the next token) and, while prompt logprobs are pending, none whose logits give
        one of them."""
        limit = self.fill_len - 1
        if self.input_logprobs_pending:
            limit = min(limit, self.first_logit_position)
        return limit

    def logit_positions(self) -> range:
        """The positions of the extend about to run (`extend_ids` after `kv_len`) that need
        logits: its last, and those giving pending prompt logprobs."""
        end = self.kv_len + len(self.extend_ids)
        first = end - 1
        if self.input_logprobs_pending:
            first = min(first, max(self.kv_len, self.first_logit_position))
        return range(first, end)

    def input_logprob_targets(self, positions: range) -> range:
        """Of `positions` (with logits), those giving pending prompt logprobs: position j
        gives the logprob of prompt token j + 1."""
        if not self.input_logprobs_pending:
            return range(0)
        start = max(positions.start, self.first_logit_position)
        return range(start, max(start, min(positions.stop, len(self.origin_input_ids) - 1)))

    # ---- sampling ----------------------------------------------------------------------------

    def prompt_logprobs(self, positions: range) -> PromptLogprobs | None:
        """What the runner must take from the logits of `positions` (`logit_positions`) for
        the pending prompt logprobs (None: nothing)."""
        targets = self.input_logprob_targets(positions)
        if not targets:
            return None
        ids = self.origin_input_ids
        return PromptLogprobs(
            first_row=targets.start - positions.start,
            target_ids=[ids[j + 1] for j in targets],
        )

    def sampling_spec(self) -> RequestSamplingSpec:
        """What the runner builds this request's sampling state from, once, at admission."""
        return RequestSamplingSpec(
            params=self.sampling_params,
            stop_token_ids=self.stop_token_ids,
            prompt_ids=self.origin_input_ids,
            top_logprobs_num=self.top_logprobs_num if self.return_logprob else 0,
        )

    def check_finished(self, context_length: int, grammar_ended: bool = False) -> None:
        """Sets `finished_reason` after a new output token (stop strings are the scheduler's);
        `grammar_ended`: the token completed the request's grammar (a stop token after a
        complete match), which ends it first."""
        params = self.sampling_params
        if grammar_ended:
            self.finished_reason = FinishReason("stop", matched_token=self.output_ids[-1])
            return
        if len(self.output_ids) >= params.max_new_tokens:
            self.finished_reason = FinishReason("length", length=params.max_new_tokens)
            return
        if self.fill_len >= context_length:
            self.finished_reason = FinishReason("length", length=len(self.output_ids))
            return
        if len(self.output_ids) < params.min_new_tokens:
            return
        last = self.output_ids[-1]
        if last in self.stop_token_ids:
            self.finished_reason = FinishReason("stop", matched_token=last)

    def detokenize_settings(self) -> DetokenizeSettings:
        params = self.sampling_params
        return DetokenizeSettings(
            context_ids=tuple(self.origin_input_ids[-CONTEXT_IDS:]),
            skip_special_tokens=params.skip_special_tokens,
            no_stop_trim=params.no_stop_trim,
            stop=params.stop,
        )


@dataclass
class ScheduleBatch:
    """The requests of one forward pass. For an extend, each request's `extend_ids` are computed
    after its first `kv_len` tokens (cache hits and earlier chunks); for a decode, each request's
    newest output token is."""

    forward_mode: ForwardMode
    reqs: list[Req] = field(default_factory=list)

    @property
    def num_new_tokens(self) -> int:
        if self.forward_mode is ForwardMode.DECODE:
            return len(self.reqs)
        return sum(len(req.extend_ids) for req in self.reqs)


def stamp_first_tokens(reqs: list[Req]) -> None:
    """Marks now as the first token of those of `reqs` (just given a token by an extend) that
    had none: decode steps never call this, so they pay nothing for it."""
    now = time.time()
    for req in reqs:
        if not req.first_token_at:
            req.first_token_at = now


def time_stats(reqs: list[Req]) -> tuple[ReqTimeStats, ...]:
    """The stage times of the finished ones of `reqs` (see `BatchTokenIDOut.time_stats`); a
    request refused or aborted before it ran finishes with its later stages at 0.0."""
    out = []
    now = 0.0
    for i, req in enumerate(reqs):
        if req.finished_reason is None:
            continue
        if not req.finished_at:
            now = now or time.time()
            req.finished_at = now
        out.append(
            ReqTimeStats(i, req.queued_at, req.scheduled_at, req.first_token_at, req.finished_at)
        )
    return tuple(out)


def make_output(reqs: list[Req]) -> BatchTokenIDOut:
    """The detokenizer's message for `reqs`: each one's output ids since its last message, its
    settings if this is its first, its prompt logprobs if they are complete and not sent
    yet (`take_output` marks both sent), and the stage times of those it finishes."""
    sent = [req.sent_len for req in reqs]
    with_logprobs = [req.return_logprob for req in reqs]
    input_due = [
        req.logprob_start_len >= 0
        and not req.input_logprobs_sent
        and not req.input_logprobs_pending
        for req in reqs
    ]
    return BatchTokenIDOut(
        rids=tuple(req.rid for req in reqs),
        output_ids=tuple(tuple(req.output_ids[s:]) for req, s in zip(reqs, sent, strict=True)),
        finished_reasons=tuple(req.finished_reason for req in reqs),
        prompt_tokens=tuple(len(req.origin_input_ids) for req in reqs),
        completion_tokens=tuple(len(req.output_ids) for req in reqs),
        cached_tokens=tuple(req.cached_tokens for req in reqs),
        settings=tuple(None if req.settings_sent else req.detokenize_settings() for req in reqs),
        output_logprobs=tuple(
            tuple(req.output_logprobs[s:]) if lp else ()
            for req, s, lp in zip(reqs, sent, with_logprobs, strict=True)
        ),
        output_top_logprobs=tuple(
            tuple(req.output_top_logprobs[s:]) if lp else ()
            for req, s, lp in zip(reqs, sent, with_logprobs, strict=True)
        ),
        input_token_logprobs=tuple(
            tuple(req.input_token_logprobs) if due else ()
            for req, due in zip(reqs, input_due, strict=True)
        ),
        input_top_logprobs=tuple(
            tuple(req.input_top_logprobs) if due else ()
            for req, due in zip(reqs, input_due, strict=True)
        ),
        time_stats=time_stats(reqs),
    )
