"""From final hidden states to logits: the last new token of each sequence, and, for an extend
that asks for them (prompt logprobs), the new tokens before it."""

from __future__ import annotations

import torch

from srt.forward_mode import ForwardMode
from srt.layers.forward_batch import ForwardBatch
from srt.layers.linear import Linear


def logit_hidden(hidden: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
    """[tokens, hidden] -> [rows, hidden]: per sequence, the hidden states of its last
    `extend_logit_lens_cpu[i]` new tokens (its last one when unset), in batch order."""
    if forward_batch.forward_mode is ForwardMode.DECODE:
        return hidden
    extend_lens = forward_batch.extend_seq_lens_cpu
    logit_lens = forward_batch.extend_logit_lens_cpu
    ends = torch.tensor(extend_lens, device=hidden.device).cumsum(0)
    if logit_lens is None:
        return hidden[ends - 1]
    if len(logit_lens) != len(extend_lens) or not all(
        1 <= n <= e for n, e in zip(logit_lens, extend_lens, strict=True)
    ):
        raise ValueError(f"logit lens {logit_lens} do not fit extend lens {extend_lens}")
    index = torch.cat(
        [
            torch.arange(int(end) - n, int(end))
            for end, n in zip(ends.tolist(), logit_lens, strict=True)
        ]
    )
    return hidden[index.to(hidden.device)]


def compute_logits(
    hidden: torch.Tensor, lm_head: Linear, forward_batch: ForwardBatch
) -> torch.Tensor:
    """[rows, vocab] float32 logits (see `logit_hidden` for the rows)."""
    return lm_head(logit_hidden(hidden, forward_batch)).float()
