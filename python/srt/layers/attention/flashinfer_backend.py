"""The flashinfer attention backend: flashinfer's paged-KV kernels over the KV pool (CUDA only).

flashinfer is the optional extra `srt[cuda]` (flashinfer-python); this module imports it at
construction, so that the registry can refuse the backend with a clear message where it is
missing. Layout: page size 1, so each KV slot is a page of one token and a sequence's page table
is its row of `req_to_token`, flattened into CSR arrays by `kv_indices`; the pool's per-layer
[slots + 1, kv_heads, head_dim] K and V tensors are seen as [pages, 1, kv_heads, head_dim]
(flashinfer's NHD layout), without a copy.

Both passes store the new tokens' K/V first and then attend over every token of each sequence:
extend through the paged prefill wrapper with a causal mask (flashinfer aligns it to the end of
the sequence, so the cached prefix is fully visible), decode through the paged decode wrapper.
`plan()` runs once per batch, in the metadata hooks (never inside a CUDA graph); `run()` once per
layer. One plan serves every layer, so every layer must share one shape and softmax scale.

Under CUDA graphs each captured batch size gets its own decode wrapper (flashinfer fixes a graph
wrapper's batch size) whose index buffers are slices of one set of static buffers; replanning
before a replay rewrites them in place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from srt.forward_mode import ForwardMode
from srt.layers.attention.base import AttentionBackend
from srt.layers.attention.kv_indices import build_kv_indices, indptr_of
from srt.layers.radix_attention import RadixAttention

if TYPE_CHECKING:
    from srt.layers.forward_batch import ForwardBatch

WORKSPACE_BYTES = 128 * 2**20  # flashinfer's recommended split-k workspace
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


class FlashInferAttnBackend(AttentionBackend):
    supports_cuda_graph = True

    def __init__(self, model: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
        import flashinfer

        if device.type != "cuda":
            raise ValueError(f"the flashinfer attention backend needs CUDA, not {device}")
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(
                f"the flashinfer attention backend runs float16 or bfloat16, not {dtype}; "
                "choose another --dtype or --attention-backend"
            )
        layers = [m for m in model.modules() if isinstance(m, RadixAttention)]
        shapes = {(m.num_heads, m.num_kv_heads, m.head_dim, m.scaling) for m in layers}
        if len(shapes) != 1:
            raise ValueError(
                "the flashinfer attention backend plans one shape for all layers, but this "
                f"model's attention layers have {len(shapes)}: {sorted(shapes)}"
            )
        ((self.num_heads, self.num_kv_heads, self.head_dim, self.scaling),) = shapes
        self.dtype = dtype
        self.device = device
        self._flashinfer = flashinfer
        # Tensor-core decode pays off once several query heads share a KV head.
        self._decode_tensor_cores = self.num_heads // self.num_kv_heads >= 4
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._eager_decode = self._decode_wrapper()
        self._decode: Any = self._eager_decode
        # kv_indptr, kv_indices and last_page_len of the largest graph batch; the graph of each
        # batch size reads a prefix of them.
        self._graph_buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._graph_decode: dict[int, Any] = {}

    def _decode_wrapper(self, graph_bs: int | None = None) -> Any:
        if graph_bs is None:
            return self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_tensor_cores=self._decode_tensor_cores
            )
        if self._graph_buffers is None:
            raise RuntimeError("init_cuda_graph_state must run before a CUDA graph is captured")
        kv_indptr, kv_indices, last_page_len = self._graph_buffers
        if graph_bs + 1 > kv_indptr.numel():
            raise ValueError(
                f"batch size {graph_bs} exceeds the CUDA graph state's {kv_indptr.numel() - 1}"
            )
        return self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self._decode_tensor_cores,
            paged_kv_indptr_buffer=kv_indptr[: graph_bs + 1],
            paged_kv_indices_buffer=kv_indices,
            paged_kv_last_page_len_buffer=last_page_len[:graph_bs],
        )

    def _page_table(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """kv_indptr (host), kv_indices (device) and last_page_len (host, all 1) of a batch."""
        kv_indptr = indptr_of(fb.seq_lens_cpu)
        kv_indices = build_kv_indices(
            fb.req_to_token_pool.req_to_token, fb.req_pool_indices, fb.seq_lens_cpu, kv_indptr
        )
        return kv_indptr, kv_indices, torch.ones(fb.batch_size, dtype=torch.int32)

    def _plan_decode(self, wrapper: Any, fb: ForwardBatch) -> None:
        kv_indptr, kv_indices, last_page_len = self._page_table(fb)
        wrapper.plan(
            kv_indptr,
            kv_indices,
            last_page_len,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            1,  # page size
            sm_scale=self.scaling,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        if forward_batch.batch_size == 0:
            return
        if forward_batch.forward_mode is ForwardMode.DECODE:
            self._decode = self._eager_decode
            self._plan_decode(self._decode, forward_batch)
            return
        kv_indptr, kv_indices, last_page_len = self._page_table(forward_batch)
        self._prefill.plan(
            indptr_of(forward_batch.extend_seq_lens_cpu),
            kv_indptr,
            kv_indices,
            last_page_len,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            1,  # page size
            causal=True,
            sm_scale=self.scaling,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        self._graph_buffers = (
            torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device),
            torch.zeros(max_bs * max_context_len, dtype=torch.int32, device=self.device),
            torch.ones(max_bs, dtype=torch.int32, device=self.device),
        )
        self._graph_decode = {}

    def init_forward_metadata_capture_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        wrapper = self._decode_wrapper(forward_batch.batch_size)
        self._graph_decode[forward_batch.batch_size] = wrapper
        self._decode = wrapper
        self._plan_decode(wrapper, forward_batch)

    def init_forward_metadata_replay_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        wrapper = self._graph_decode.get(forward_batch.batch_size)
        if wrapper is None:
            raise ValueError(
                f"no CUDA graph was captured for batch size {forward_batch.batch_size}"
            )
        self._decode = wrapper
        self._plan_decode(wrapper, forward_batch)

    def _paged_cache(self, layer: RadixAttention, fb: ForwardBatch) -> tuple[torch.Tensor, ...]:
        pool = fb.kv_pool
        return (
            pool.k_buffers[layer.layer_id].unsqueeze(1),
            pool.v_buffers[layer.layer_id].unsqueeze(1),
        )

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        forward_batch.kv_pool.store(layer.layer_id, forward_batch.out_cache_loc, k, v)
        out: torch.Tensor = self._prefill.run(
            q.contiguous(), self._paged_cache(layer, forward_batch)
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
        forward_batch.kv_pool.store(layer.layer_id, forward_batch.out_cache_loc, k, v)
        out: torch.Tensor = self._decode.run(
            q.contiguous(), self._paged_cache(layer, forward_batch)
        )
        return out.flatten(1)
