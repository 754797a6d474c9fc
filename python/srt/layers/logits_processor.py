"""From final hidden states to next-token logits: only the last new token of each sequence."""

from __future__ import annotations

import torch

from srt.layers.forward_batch import ForwardBatch, ForwardMode
from srt.layers.linear import Linear


def last_token_hidden(hidden: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
    """[tokens, hidden] -> [batch, hidden]: the hidden state of each sequence's last new token."""
    if forward_batch.forward_mode is ForwardMode.DECODE:
        return hidden
    ends = torch.tensor(forward_batch.extend_seq_lens_cpu, device=hidden.device).cumsum(0) - 1
    return hidden[ends]


def compute_logits(
    hidden: torch.Tensor, lm_head: Linear, forward_batch: ForwardBatch
) -> torch.Tensor:
    """[batch, vocab] float32 logits of each sequence's next token."""
    return lm_head(last_token_hidden(hidden, forward_batch)).float()
