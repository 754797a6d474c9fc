"""The batched sampler: next tokens from logits, each request with its own parameters.

Order of operations (vLLM's and SGLang's): logit bias and the EOS mask of `min_new_tokens`, then
repetition (prompt and output tokens), frequency and presence (output tokens) penalties; greedy
rows (temperature 0) take the argmax; the others are divided by their temperature and filtered by
top-k, top-p and min-p, then sampled. Requests with a seed draw from their own generator, one
draw per step, so their tokens do not depend on what else is in the batch. Reported logprobs are
those of the model's raw distribution (log-softmax of the logits before any processing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

_NEG_INF = float("-inf")


@dataclass(frozen=True)
class LogitBias:
    """One request's logit bias as tensors, built once per request (`of`): a step adds every
    row's bias in one indexed accumulation, whatever the number of entries."""

    token_ids: torch.Tensor  # int64 [entries]
    values: torch.Tensor  # float32 [entries]; a repeated id's biases add up

    @classmethod
    def of(cls, pairs: Sequence[tuple[int, float]]) -> LogitBias | None:
        """The tensors of `(token_id, bias)` pairs; None for no pairs."""
        if not pairs:
            return None
        ids, values = zip(*pairs, strict=True)
        return cls(torch.tensor(ids, dtype=torch.long), torch.tensor(values, dtype=torch.float32))


@dataclass(frozen=True)
class SamplingRow:
    """One request's unchanging sampling settings, built once when it is admitted: what the
    sampler needs besides the tokens it has produced so far (`sample`'s `output_ids`)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: the whole vocabulary
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: LogitBias | None = None
    # Ids banned until `min_new_tokens` are produced (the request's EOS and stop token ids).
    min_new_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    prompt_ids: tuple[int, ...] = ()  # kept only when a repetition penalty reads them
    generator: torch.Generator | None = None
    top_logprobs_num: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Whether the request's earlier tokens change its logits."""
        return bool(
            self.repetition_penalty != 1.0 or self.frequency_penalty or self.presence_penalty
        )

    def banned_ids(self, num_outputs: int) -> tuple[int, ...]:
        """The ids that cannot come next after `num_outputs` output tokens."""
        return self.stop_token_ids if num_outputs < self.min_new_tokens else ()


@dataclass(frozen=True)
class SamplerOutput:
    next_ids: list[int]
    logprobs: list[float]  # of each chosen token
    top_logprobs: list[list[tuple[int, float]]]  # per row, its top_logprobs_num best tokens


def sample(
    logits: torch.Tensor,
    rows: Sequence[SamplingRow],
    output_ids: Sequence[Sequence[int]] | None = None,
) -> SamplerOutput:
    """logits: [batch, vocab] float32, one row per entry of `rows`; `output_ids[i]` are the
    tokens row i's request produced so far (None: none for every row)."""
    if logits.shape[0] != len(rows):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(rows)} sampling rows")
    outputs: Sequence[Sequence[int]] = [()] * len(rows) if output_ids is None else output_ids
    if len(outputs) != len(rows):
        raise ValueError(f"{len(outputs)} output histories for {len(rows)} sampling rows")
    logits = torch.nan_to_num(logits.float(), nan=_NEG_INF)
    raw_logprobs = torch.log_softmax(logits, dim=-1)
    banned = [row.banned_ids(len(out)) for row, out in zip(rows, outputs, strict=True)]
    processed = _apply_penalties(apply_bias_and_bans(logits, rows, banned), rows, outputs)

    next_ids = processed.argmax(dim=-1)
    sampled = [i for i, row in enumerate(rows) if not row.greedy]
    if sampled:
        index = torch.tensor(sampled, device=logits.device)
        probs = _filtered_probs(processed[index], [rows[i] for i in sampled])
        drawn = _draw(probs, [rows[i].generator for i in sampled])
        # A row left with no probability mass (every token banned or -inf) keeps its argmax.
        next_ids[index] = torch.where(probs.sum(dim=-1) > 0, drawn, next_ids[index])

    chosen = raw_logprobs.gather(1, next_ids[:, None]).squeeze(1)
    return SamplerOutput(
        next_ids=next_ids.tolist(),
        logprobs=chosen.tolist(),
        top_logprobs=_top_logprobs(raw_logprobs, rows),
    )


def apply_bias_and_bans(
    logits: torch.Tensor, rows: Sequence[SamplingRow], banned: Sequence[Sequence[int]]
) -> torch.Tensor:
    """`logits` with each row's logit bias added and its `banned` ids at -inf (a copy when any
    row has either)."""
    biased = [(i, row.logit_bias) for i, row in enumerate(rows) if row.logit_bias is not None]
    if not biased and not any(banned):
        return logits
    logits = logits.clone()
    if biased:
        device = logits.device
        counts = torch.tensor([len(bias.token_ids) for _, bias in biased])
        row_index = torch.tensor([i for i, _ in biased]).repeat_interleave(counts)
        token_ids = torch.cat([bias.token_ids for _, bias in biased])
        values = torch.cat([bias.values for _, bias in biased])
        logits.index_put_(
            (row_index.to(device), token_ids.to(device)), values.to(device), accumulate=True
        )
    for i, ids in enumerate(banned):
        if ids:
            logits[i, list(ids)] = _NEG_INF
    return logits


def _apply_penalties(
    logits: torch.Tensor, rows: Sequence[SamplingRow], outputs: Sequence[Sequence[int]]
) -> torch.Tensor:
    if not any(row.penalized for row in rows):
        return logits
    logits = logits.clone()
    vocab = logits.shape[1]
    for i, (row, output_ids) in enumerate(zip(rows, outputs, strict=True)):
        if row.repetition_penalty != 1.0:
            seen = torch.tensor(sorted({*row.prompt_ids, *output_ids}), dtype=torch.long)
            if seen.numel():
                values = logits[i, seen]
                logits[i, seen] = torch.where(
                    values > 0, values / row.repetition_penalty, values * row.repetition_penalty
                )
        if (row.frequency_penalty or row.presence_penalty) and output_ids:
            counts = torch.bincount(torch.tensor(output_ids), minlength=vocab).to(logits)
            logits[i] -= row.frequency_penalty * counts + row.presence_penalty * (counts > 0)
    return logits


def _filtered_probs(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    temperatures = torch.tensor([row.temperature for row in rows], device=logits.device)
    probs = torch.softmax(logits / temperatures[:, None], dim=-1)
    vocab = probs.shape[1]
    top_ks = torch.tensor([row.top_k if row.top_k > 0 else vocab for row in rows])
    top_ps = torch.tensor([row.top_p for row in rows])
    min_ps = torch.tensor([row.min_p for row in rows])
    if (top_ks < vocab).any() or (top_ps < 1.0).any() or (min_ps > 0).any():
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=probs.device)[None, :]
        drop = ranks >= top_ks[:, None].to(probs.device)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop |= mass_before > top_ps[:, None].to(probs.device)
        drop |= sorted_probs < (min_ps[:, None].to(probs.device) * sorted_probs[:, :1])
        drop[:, 0] = False  # the most likely token always survives
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
    return torch.nan_to_num(probs, nan=0.0)


def _draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """Exponential-race sampling: argmax(p / E) with E ~ Exp(1) picks index i with prob p_i."""
    noise = torch.empty_like(probs)
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        noise[shared] = torch.empty(len(shared), probs.shape[1], device=probs.device).exponential_()
    for i, generator in enumerate(generators):
        if generator is not None:
            noise[i] = torch.empty(probs.shape[1], device=probs.device).exponential_(
                generator=generator
            )
    # Clamped so that a zero-probability token can never win through a 0/0.
    return (probs / noise.clamp_min_(1e-20)).argmax(dim=-1)


def _top_logprobs(
    raw_logprobs: torch.Tensor, rows: Sequence[SamplingRow]
) -> list[list[tuple[int, float]]]:
    k = max((row.top_logprobs_num for row in rows), default=0)
    if k == 0:
        return [[] for _ in rows]
    values, ids = raw_logprobs.topk(min(k, raw_logprobs.shape[1]), dim=-1)
    return [
        list(zip(ids[i, :n].tolist(), values[i, :n].tolist(), strict=True))
        for i, n in enumerate(row.top_logprobs_num for row in rows)
    ]


def token_logprobs(
    logits: torch.Tensor, targets: list[int], top_logprobs_num: int
) -> tuple[list[float], list[tuple[tuple[int, float], ...]]]:
    """The raw logprob of `targets[i]` under logits row `i` (prompt logprobs) and, with
    `top_logprobs_num`, each row's best (id, logprob) pairs (else no pairs)."""
    if logits.shape[0] != len(targets):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(targets)} target tokens")
    logprobs = torch.log_softmax(torch.nan_to_num(logits.float(), nan=_NEG_INF), dim=-1)
    index = torch.tensor(targets, device=logits.device, dtype=torch.long)
    chosen = logprobs.gather(1, index[:, None]).squeeze(1).tolist()
    if top_logprobs_num == 0:
        return chosen, []
    values, ids = logprobs.topk(min(top_logprobs_num, logprobs.shape[1]), dim=-1)
    tops = [
        tuple(zip(row_ids, row_values, strict=True))
        for row_ids, row_values in zip(ids.tolist(), values.tolist(), strict=True)
    ]
    return chosen, tops
