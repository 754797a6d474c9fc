"""The runner's half of sampling: each request's sampling state, kept from admission to finish,
and the step that turns a forward pass's logits into next tokens and logprobs.

A request's settings become a `SamplingRow` (logit-bias tensors, seeded generator) once, when
the scheduler admits it (`SamplingStates.add`); each step adds only what changed, the tokens it
produced so far, which the runner records itself as it samples them. The state outlives a
retraction (a seeded request keeps drawing from the same generator) and ends with the request.
A constrained request's state holds its grammar matcher too (`srt.constrained`): it masks the
request's logits before each sample and takes each token sampled, so it is where the request's
output is, retractions included, and goes with the request. A jump forward
(`srt.constrained.jump_forward`) changes that output without sampling: the matcher and the
recorded tokens change together.

Under tensor parallelism every rank samples from the same all-gathered logits with the same
seeds; `sync_ids` (rank 0's ids broadcast) makes rank 0's tokens every rank's, so that a
difference in the last bit of a draw can never split the ranks' schedules (SGLang syncs them
too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import xgrammar as xgr

from srt.constrained.grammar_mask import GrammarMasks, accept_tokens
from srt.constrained.jump_forward import jump
from srt.constrained.xgrammar_backend import GrammarBackend
from srt.layers.sampler import LogitBias, SamplingRow, sample, token_logprobs
from srt.model_executor.worker_batch import (
    GenerationBatchResult,
    JumpForward,
    ModelWorkerBatch,
    PromptLogprobs,
    RequestSamplingSpec,
)


@dataclass(eq=False)
class RequestSampling:
    """One request's sampling state: its settings and the tokens sampled for it so far."""

    row: SamplingRow
    output_ids: list[int] = field(default_factory=list)
    matcher: xgr.GrammarMatcher | None = None

    @classmethod
    def of(cls, spec: RequestSamplingSpec, grammars: GrammarBackend | None) -> RequestSampling:
        """The state of `spec`; a constrained one's matcher comes from `grammars`."""
        params = spec.params
        generator = None
        if params.seed is not None:
            generator = torch.Generator().manual_seed(params.seed)
        row = SamplingRow(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            min_p=params.min_p,
            repetition_penalty=params.repetition_penalty,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            logit_bias=LogitBias.of(params.logit_bias),
            min_new_tokens=params.min_new_tokens,
            stop_token_ids=tuple(sorted(spec.stop_token_ids)),
            # Only the repetition penalty reads the prompt.
            prompt_ids=tuple(spec.prompt_ids) if params.repetition_penalty != 1.0 else (),
            generator=generator,
            top_logprobs_num=spec.top_logprobs_num,
        )
        matcher = None
        if params.grammar is not None:
            if grammars is None:
                raise ValueError("a constrained request needs a grammar backend")
            matcher = grammars.matcher(*params.grammar)
        return cls(row, matcher=matcher)


class SamplingStates:
    """The sampling state of every admitted request, by request id; constrained requests' logits
    are `vocab_size` wide and their grammars come from `grammars`."""

    def __init__(
        self,
        grammars: GrammarBackend | None = None,
        vocab_size: int = 0,
        sync_ids: Callable[[list[int]], list[int]] | None = None,
    ) -> None:
        self.states: dict[str, RequestSampling] = {}
        self.sync_ids = sync_ids
        self.grammars = grammars
        self.masks = GrammarMasks(vocab_size) if grammars is not None else None

    def add(self, rid: str, spec: RequestSamplingSpec) -> None:
        if rid in self.states:
            raise ValueError(f"request {rid!r} already has sampling state")
        self.states[rid] = RequestSampling.of(spec, self.grammars)

    def remove(self, rid: str) -> None:
        self.states.pop(rid, None)

    def __len__(self) -> int:
        return len(self.states)

    def jump_forward(self, rid: str, max_rollback: int, budget: int) -> JumpForward | None:
        """Jumps request `rid` over the text its grammar forces next, if worth it (see
        `GenerationRunner.jump_forward`): its matcher and output history change together."""
        state = self.states[rid]
        if state.matcher is None or self.grammars is None:
            return None
        tokens = self.grammars.forced_tokenizer()
        made = jump(state.matcher, tokens, state.output_ids, max_rollback, budget)
        if made is not None:
            del state.output_ids[len(state.output_ids) - made.rollback :]
            state.output_ids.extend(made.ids)
        return made

    def sample(self, batch: ModelWorkerBatch, logits: torch.Tensor) -> GenerationBatchResult:
        """Next tokens from `logits`, whose rows are, sequence by sequence, the last
        `batch.logit_lens[i]` new positions of each (one each without `logit_lens`): prompt
        logprobs from the rows that give them, a next token from each sampling sequence's last
        row."""
        lens = batch.logit_lens or [1] * batch.batch_size
        rows_total = sum(lens)
        if rows_total != logits.shape[0]:
            raise ValueError(f"{logits.shape[0]} logit rows for {rows_total} positions")
        states = [self.states[rid] for rid in batch.rids]
        input_logprobs, input_tops = record_prompt_logprobs(
            logits, lens, batch.prompt_logprobs, [s.row.top_logprobs_num for s in states]
        )
        last_rows, end = [], 0
        for n in lens:
            end += n
            last_rows.append(end - 1)
        due = batch.sample
        sampling = [i for i in range(batch.batch_size) if due is None or due[i]]
        picked = [last_rows[i] for i in sampling]
        if picked != list(range(rows_total)):
            logits = logits[picked]
        chosen = [states[i] for i in sampling]
        matchers = [s.matcher for s in chosen]
        if self.masks is not None:
            self.masks.apply(logits, matchers)
        out = sample(logits, [s.row for s in chosen], [s.output_ids for s in chosen])
        next_ids = out.next_ids if self.sync_ids is None else self.sync_ids(out.next_ids)
        for state, token in zip(chosen, next_ids, strict=True):
            state.output_ids.append(token)
        return GenerationBatchResult(
            next_ids=next_ids,
            logprobs=out.logprobs,
            top_logprobs=out.top_logprobs,
            input_token_logprobs=input_logprobs,
            input_top_logprobs=input_tops,
            grammar_ended=accept_tokens(matchers, next_ids),
        )


def record_prompt_logprobs(
    logits: torch.Tensor,
    logit_lens: list[int],
    asked: list[PromptLogprobs | None] | None,
    top_logprobs_nums: list[int],
) -> tuple[list[list[float]], list[list[tuple[tuple[int, float], ...]]]]:
    """Per sequence, the prompt logprobs (and top pairs) its `PromptLogprobs` asks for, taken
    from its rows of `logits` (`logit_lens[i]` rows each, in batch order)."""
    logprobs: list[list[float]] = []
    tops: list[list[tuple[tuple[int, float], ...]]] = []
    start = 0
    for i, n in enumerate(logit_lens):
        want = asked[i] if asked is not None else None
        if want is None or not want.target_ids:
            logprobs.append([])
            tops.append([])
        else:
            first = start + want.first_row
            chosen, top = token_logprobs(
                logits[first : first + len(want.target_ids)],
                want.target_ids,
                top_logprobs_nums[i],
            )
            logprobs.append(chosen)
            tops.append(top)
        start += n
    return logprobs, tops
