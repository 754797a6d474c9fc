"""What the scheduler and the model runner tell each other, in ints: the scheduler's side of the
runner's interface. No torch here, so that the scheduler, which imports this module, stays
torch-free (the runner turns these records into tensors).

    scheduler ─ add_request(rid, RequestSamplingSpec) ─▶ runner   (once, at first admission)
    scheduler ─ ModelWorkerBatch ─▶ runner.forward_batch_generation ─▶ GenerationBatchResult
    scheduler ─ remove_request(rid) ─▶ runner                      (once, when it is done)
    scheduler ─ grammar_status(kind, text) ─▶ runner  (a constrained request, until it is ready)
    scheduler ─ jump_forward(rid, ...) ─▶ runner ─▶ JumpForward  (--enable-jump-forward)

The runner keeps each request's sampling state (its settings as tensors, its seeded generator,
the tokens it produced) from `add_request` to `remove_request`, retractions included.

A request constrained by a grammar (`SamplingParams.grammar`) waits in the scheduler until
`grammar_status` says its grammar is compiled (the runner compiles it off the scheduler's
thread); from admission on, the runner masks its logits with the grammar and advances its
matcher with every token it samples, and says when the grammar has ended. With jump-forward,
the runner also tokenizes the text the grammar forces next and advances the matcher over it
(`JumpForward`); the scheduler appends those ids without sampling them.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from srt.forward_mode import ForwardMode
from srt.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class RequestSamplingSpec:
    """One request's sampling, as the runner builds its state from it at admission."""

    params: SamplingParams
    # Banned until `params.min_new_tokens` are produced: EOS and stop token ids (none with
    # ignore_eos).
    stop_token_ids: frozenset[int]
    prompt_ids: Sequence[int]  # read only when a repetition penalty needs them
    top_logprobs_num: int  # 0 unless the request returns logprobs


@dataclass(frozen=True, slots=True, eq=False)
class PromptLogprobs:
    """The prompt logprobs one sequence's extend gives: logit row `first_row` (of those the
    sequence gets, see `ModelWorkerBatch.logit_lens`) and the rows after it give the logprobs of
    `target_ids`, one row each."""

    first_row: int
    target_ids: list[int]


@dataclass(frozen=True, slots=True, eq=False)
class ModelWorkerBatch:
    """One forward pass, as the scheduler asks for it.

    Sequence i appends `extend_lens[i]` new tokens (1 when decoding), its slice of `input_ids`
    and `out_cache_loc`, after its first `seq_lens[i] - extend_lens[i]` tokens, in its
    `ReqToTokenPool` row `rows[i]`. The runner records the new tokens' slots in that row, and
    first the `row_writes` (row, start position, slots): the earlier positions whose slots the
    runner has not been told yet (a cache hit at admission, slots the radix cache swapped for
    its own).
    """

    forward_mode: ForwardMode
    rids: list[str]
    rows: list[int]
    seq_lens: list[int]
    extend_lens: list[int]
    input_ids: list[int]
    out_cache_loc: array[int]
    row_writes: list[tuple[int, int, array[int]]]
    # Extend only: how many of each sequence's last new tokens get logits (None: its last one).
    logit_lens: list[int] | None = None
    # Per sequence: whether a next token is sampled for it (False for a chunk of a longer prompt)
    sample: list[bool] | None = None  # None: every sequence samples
    prompt_logprobs: list[PromptLogprobs | None] | None = None

    @property
    def batch_size(self) -> int:
        return len(self.rows)


@dataclass(frozen=True, slots=True)
class GenerationBatchResult:
    """What one forward pass produced: per sampling sequence (batch order), its next token, the
    raw logprob of it and its best (id, logprob) pairs (empty unless the request asked); per
    sequence, the prompt logprobs its `PromptLogprobs` asked for (empty when none)."""

    next_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    input_token_logprobs: list[list[float]]
    input_top_logprobs: list[list[tuple[tuple[int, float], ...]]]
    # Sampling sequences (indices into `next_ids`) whose grammar ended with their token.
    grammar_ended: frozenset[int] = field(default_factory=frozenset)


@dataclass(frozen=True, slots=True)
class GrammarStatus:
    """Where one grammar's compile stands: `ready`, failed (`error` says why, in terms a client
    can act on), or neither: still compiling."""

    ready: bool = False
    error: str | None = None


GRAMMAR_COMPILING = GrammarStatus()
GRAMMAR_READY = GrammarStatus(ready=True)


@dataclass(frozen=True, slots=True)
class JumpForward:
    """A jump made: the request's last `rollback` output ids are replaced by `ids`, which its
    grammar forces (the runner's matcher and output history already took the change)."""

    rollback: int
    ids: list[int]


@dataclass(frozen=True, slots=True)
class RunnerLimits:
    """What the scheduler needs to know of the model and its memory, resolved by the runner."""

    context_length: int
    vocab_size: int
    eos_token_ids: frozenset[int]
    max_total_tokens: int  # KV slots
    max_running_requests: int  # ReqToTokenPool rows


class GenerationRunner(Protocol):
    """The model runner as the scheduler drives it (`ModelRunner`, or a scripted one in tests)."""

    @property
    def limits(self) -> RunnerLimits: ...

    def add_request(self, rid: str, spec: RequestSamplingSpec) -> None:
        """Builds the request's sampling state; it lives until `remove_request`."""

    def remove_request(self, rid: str) -> None:
        """Drops the request's sampling state (unknown ids are ignored)."""

    def forward_batch_generation(self, batch: ModelWorkerBatch) -> GenerationBatchResult:
        """Runs `batch` and samples the next token of every sequence that samples."""

    def grammar_status(self, kind: str, text: str) -> GrammarStatus:
        """Where the compile of grammar (`kind`, `text`) stands, starting it if it is new; never
        waits for it. The runner keeps the grammars used most recently: one that left its
        cache by the time a request asking for it is admitted is compiled again then."""

    def jump_forward(self, rid: str, max_rollback: int, budget: int) -> JumpForward | None:
        """Jumps constrained request `rid` over the text its grammar forces next, if that
        gains enough tokens: at most its last `max_rollback` output ids change and its output
        grows by at most `budget` ids. None: no jump (no grammar, nothing forced, too little)."""
