"""The interface every attention backend implements."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from srt.layers.forward_batch import ForwardBatch
    from srt.layers.radix_attention import RadixAttention


class AttentionBackend(abc.ABC):
    """Writes the new tokens' K/V into the KV pool and attends over each sequence's cache.

    A backend that can run decode under CUDA graphs sets `supports_cuda_graph` and implements
    the three `*_cuda_graph` methods: the graph runner calls `init_cuda_graph_state` once, then
    captures each batch size after `init_forward_metadata_capture_cuda_graph`, and before every
    replay calls `init_forward_metadata_replay_cuda_graph` with a batch whose tensors are the
    same static buffers. Whatever a captured layer reads besides those buffers must stay at the
    address it had during capture.
    """

    supports_cuda_graph: bool = False

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:  # noqa: B027
        """Prepares whatever the backend derives from a batch once, before the layers run."""

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        """Allocates the static metadata buffers for decode batches of up to `max_bs` sequences
        of up to `max_context_len` tokens."""
        raise NotImplementedError(f"{type(self).__name__} cannot run under CUDA graphs")

    def init_forward_metadata_capture_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        """Like `init_forward_metadata`, for the decode batch about to be captured; its metadata
        must live in the static buffers, one set per batch size where the sizes need it."""
        raise NotImplementedError(f"{type(self).__name__} cannot run under CUDA graphs")

    def init_forward_metadata_replay_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        """Rewrites, in place, the static metadata of the graph of `forward_batch.batch_size`
        for this batch, before it is replayed."""
        raise NotImplementedError(f"{type(self).__name__} cannot run under CUDA graphs")

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
