"""The attention layer of every model: hands its q/k/v to the batch's attention backend."""

from __future__ import annotations

import torch
from torch import nn

from srt.forward_mode import ForwardMode
from srt.layers.forward_batch import ForwardBatch


class RadixAttention(nn.Module):
    def __init__(
        self, num_heads: int, head_dim: int, scaling: float, num_kv_heads: int, layer_id: int
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scaling = scaling
        self.num_kv_heads = num_kv_heads
        self.layer_id = layer_id

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """q: [tokens, heads, head_dim], k/v: [tokens, kv_heads, head_dim] -> [tokens, hidden]."""
        backend = forward_batch.attn_backend
        if forward_batch.forward_mode is ForwardMode.DECODE:
            return backend.forward_decode(q, k, v, self, forward_batch)
        return backend.forward_extend(q, k, v, self, forward_batch)
