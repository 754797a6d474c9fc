"""The Triton attention backend: srt's own kernels (srt.kernels) over the paged KV pool.

The kernels run on CUDA; on CPU they run only under `TRITON_INTERPRET=1` (tests). Per batch,
the extend metadata (start offsets, longest extend) is derived once, on the host side, so that
no launch waits on the device.

Decode needs no metadata of its own: the kernels read the batch's `req_pool_indices` and
`seq_lens` and the pool's `req_to_token` on the device, so a CUDA graph captured over static
copies of those tensors replays correctly for any lengths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from srt.forward_mode import ForwardMode
from srt.kernels.triton.decode_attention import decode_attention_fwd
from srt.kernels.triton.extend_attention import extend_attention_fwd
from srt.kernels.triton.store_kv_cache import store_kv_cache
from srt.layers.attention.base import AttentionBackend
from srt.layers.attention.kv_indices import indptr_of

if TYPE_CHECKING:
    from srt.layers.forward_batch import ForwardBatch
    from srt.layers.radix_attention import RadixAttention

DEFAULT_NUM_KV_SPLITS = 8


class TritonAttnBackend(AttentionBackend):
    supports_cuda_graph = True

    def __init__(self, num_kv_splits: int = DEFAULT_NUM_KV_SPLITS) -> None:
        self.num_kv_splits = num_kv_splits
        self._extend_seq_lens: torch.Tensor | None = None
        self._extend_start_loc: torch.Tensor | None = None
        self._max_extend_len = 0

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        if forward_batch.forward_mode is ForwardMode.DECODE:
            return
        lens = forward_batch.extend_seq_lens_cpu
        device = forward_batch.seq_lens.device
        self._extend_seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        self._extend_start_loc = indptr_of(lens)[:-1].to(device)
        self._max_extend_len = max(lens, default=0)

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        """Nothing to allocate: decode reads only the batch's own (static) tensors."""

    def init_forward_metadata_capture_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        """Nothing to prepare: see `init_cuda_graph_state`."""

    def init_forward_metadata_replay_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        """Nothing to rewrite: the static batch tensors already hold the new batch."""

    def _store(self, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch) -> None:
        pool = fb.kv_pool
        store_kv_cache(k, v, pool.k_buffers[layer_id], pool.v_buffers[layer_id], fb.out_cache_loc)

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        assert self._extend_seq_lens is not None, "init_forward_metadata must run first"
        assert self._extend_start_loc is not None
        self._store(k, v, layer.layer_id, forward_batch)
        out = torch.empty_like(q)
        pool = forward_batch.kv_pool
        extend_attention_fwd(
            q,
            k,
            v,
            out,
            pool.k_buffers[layer.layer_id],
            pool.v_buffers[layer.layer_id],
            forward_batch.req_to_token_pool.req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            self._extend_seq_lens,
            self._extend_start_loc,
            layer.scaling,
            self._max_extend_len,
        )
        return out.flatten(1)

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        self._store(k, v, layer.layer_id, forward_batch)
        out = torch.empty_like(q)
        pool = forward_batch.kv_pool
        decode_attention_fwd(
            q,
            pool.k_buffers[layer.layer_id],
            pool.v_buffers[layer.layer_id],
            out,
            forward_batch.req_to_token_pool.req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            layer.scaling,
            self.num_kv_splits,
        )
        return out.flatten(1)
