"""The interface every attention backend implements."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from srt.layers.forward_batch import ForwardBatch
    from srt.layers.radix_attention import RadixAttention


class AttentionBackend(abc.ABC):
    """Writes the new tokens' K/V into the KV pool and attends over each sequence's cache."""

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:  # noqa: B027
        """Prepares whatever the backend derives from a batch once, before the layers run."""

    @abc.abstractmethod
    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        """q: [tokens, heads, head_dim], k/v: [tokens, kv_heads, head_dim] of the new tokens.
        Returns [tokens, heads * head_dim]: each new token attends to its sequence's cached
        prefix and causally to the new tokens up to itself."""

    @abc.abstractmethod
    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        """One new token per sequence (shapes as in `forward_extend`), attending to all of its
        sequence's tokens."""
