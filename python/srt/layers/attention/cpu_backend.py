"""The `cpu` attention backend (SGLang's `torch_native` takes this place): srt's Rust kernels
on the CPU, PyTorch's scaled_dot_product_attention over the KV pool elsewhere, where it is the
reference the other backends are tested against.

Runs on every device. Extend in bf16 on a CPU with AVX-512 BF16 attends every
sequence of the pass in one call of srt's Rust kernel, which reads each sequence's K/V from the
cache by slot (`cpu_kernels.prefill_attention_paged`: no gathered copies; one parallel region
for all sequences, so a few new tokens after a long cached prefix still keep every core busy).
Elsewhere extend attends one sequence at a time: on the CPU with no mask (extend_cpu.py: the
cached prefix and the new tokens as two parts, merged), elsewhere with a causal mask shifted by
the sequence's cached prefix. Decode in float32 or bf16 on the CPU
reads each sequence's K/V rows in place, in srt's Rust kernel (`cpu_kernels.decode_attention`:
float32 arithmetic over either cache), which costs a fraction of gathering them for PyTorch
at decode sizes, shared prefixes included (one layer of SmolLM2's shapes, 16 sequences of
1,056 tokens in two groups sharing 1,024: 1.3 ms in place, 17.7 ms attending each shared
prefix once per group as cascade.py does). Elsewhere decode gathers every sequence's K/V into
one padded batch and attends in a single call per layer, or, when sequences of the batch share
cached prefix slots, attends each shared prefix once per group (cascade.py). What a decode batch's
layers share (the slots, the additive padding mask, the groups) is derived once per forward
pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from srt.forward_mode import ForwardMode
from srt.kernels.cpu import cpu_kernels
from srt.layers.attention.base import AttentionBackend
from srt.layers.attention.cascade import (
    MIN_SAVED_TOKENS,
    CascadeMetadata,
    build_cascade_metadata,
    cascade_decode,
    plan_shared_prefixes,
)
from srt.layers.attention.extend_cpu import extend_attention, kernel_takes

# A sequence with a cached prefix, for extend: on the CPU its slots; elsewhere (slots, mask).
ExtendCache = torch.Tensor | tuple[torch.Tensor, torch.Tensor]

if TYPE_CHECKING:
    from srt.layers.forward_batch import ForwardBatch
    from srt.layers.radix_attention import RadixAttention


class CpuAttnBackend(AttentionBackend):
    # Float32 and bf16 decode on the CPU read K/V in place (the Rust kernel); False gathers them.
    decode_in_place = True

    def __init__(self, cascade_min_saved: int | None = MIN_SAVED_TOKENS) -> None:
        """cascade_min_saved: where decode gathers K/V (not in place), attend a prefix that
        decode sequences share once per group when that saves at least this many tokens per
        layer (None: never)."""
        self.cascade_min_saved = cascade_min_saved
        self._decode_mask: torch.Tensor | None = None
        self._decode_slots: torch.Tensor | None = None
        # In-place decode's metadata: [batch, max_len] int32 slots, [batch] int32 lengths.
        self._in_place: tuple[torch.Tensor, torch.Tensor] | None = None
        self._cascade: CascadeMetadata | None = None
        # Extend, per sequence: (first new token, new tokens, None without a cached prefix, else
        # its slots on the CPU and elsewhere (its slots, mask)).
        self._extend_seqs: list[tuple[int, int, ExtendCache | None]] = []
        # Extend where srt's kernel takes the cache, every sequence at once: int32 slots (each
        # sequence's whole, one after another), prefix lengths and new lengths.
        self._paged_extend: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        self._cascade = None
        self._in_place = None
        if forward_batch.forward_mode is ForwardMode.EXTEND:
            self._init_extend_metadata(forward_batch)
            return
        if forward_batch.batch_size == 0:
            return
        max_len = max(forward_batch.seq_lens_cpu)
        # The columns first: gathering whole rows would copy every row's full context length
        # (8,192 slots for SmolLM2) where a step needs its longest sequence's.
        table = forward_batch.req_to_token_pool.req_to_token
        rows = table[:, :max_len].index_select(0, forward_batch.req_pool_indices)
        dtype = forward_batch.kv_pool.k_buffers[0].dtype
        if (
            self.decode_in_place
            and rows.device.type == "cpu"
            and dtype in cpu_kernels.KERNEL_DTYPES
        ):
            self._in_place = (rows.contiguous(), forward_batch.seq_lens.to(torch.int32))
            return
        if self.cascade_min_saved is not None and forward_batch.batch_size > 1:
            groups = plan_shared_prefixes(
                rows.cpu(), forward_batch.seq_lens_cpu, self.cascade_min_saved
            )
            if groups:
                self._cascade = build_cascade_metadata(rows, forward_batch.seq_lens, groups)
                return
        # [batch * max_len]: a sequence's slots, then padding (whatever its row holds past its
        # length; masked out below).
        self._decode_slots = rows.flatten().long()
        positions = torch.arange(max_len, device=forward_batch.seq_lens.device)
        padding = positions[None, :] >= forward_batch.seq_lens[:, None]
        mask = torch.zeros(padding.shape, dtype=dtype, device=padding.device)
        self._decode_mask = mask.masked_fill_(padding, float("-inf"))[:, None, None, :]

    def in_place_decode(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """This decode step's in-place metadata, [batch, max_len] int32 slots and [batch] int32
        lengths, when the cache can be read in place (not gathered)."""
        return self._in_place

    def _init_extend_metadata(self, forward_batch: ForwardBatch) -> None:
        """Where srt's kernel takes the cache (CPU, bf16, its head sizes): every sequence's
        slots and lengths at once. Elsewhere, per sequence: its slice of the new tokens, and,
        after a cached prefix, the slots of its whole sequence and, off the CPU, the additive
        mask that shifts causality past the prefix."""
        req_to_token = forward_batch.req_to_token_pool.req_to_token
        device = forward_batch.input_ids.device
        k_buffer = forward_batch.kv_pool.k_buffers[0]
        dtype = k_buffer.dtype
        self._extend_seqs = []
        self._paged_extend = None
        if (
            device.type == "cpu"
            and forward_batch.batch_size
            and kernel_takes(dtype, k_buffer.shape[-1])
        ):
            seq_lens, extend_lens = forward_batch.seq_lens_cpu, forward_batch.extend_seq_lens_cpu
            rows = forward_batch.req_pool_indices.tolist()
            seq_slots = [req_to_token[row, :n] for row, n in zip(rows, seq_lens, strict=True)]
            prefix_lens = [n - e for n, e in zip(seq_lens, extend_lens, strict=True)]
            self._paged_extend = (
                torch.cat(seq_slots).to(torch.int32),
                torch.tensor(prefix_lens, dtype=torch.int32),
                torch.tensor(extend_lens, dtype=torch.int32),
            )
            return
        start = 0
        for i, (seq_len, extend_len) in enumerate(
            zip(forward_batch.seq_lens_cpu, forward_batch.extend_seq_lens_cpu, strict=True)
        ):
            prefix_len = seq_len - extend_len
            cached: ExtendCache | None = None
            if prefix_len > 0 and device.type == "cpu":
                row = forward_batch.req_pool_indices[i]
                cached = req_to_token[row, :seq_len].long()
            elif prefix_len > 0:
                row = forward_batch.req_pool_indices[i]
                slots = req_to_token[row, :seq_len].long()
                query_pos = torch.arange(prefix_len, seq_len, device=device)
                key_pos = torch.arange(seq_len, device=device)
                mask = torch.zeros((extend_len, seq_len), dtype=dtype, device=device)
                mask.masked_fill_(key_pos[None, :] > query_pos[:, None], float("-inf"))
                cached = (slots, mask)
            self._extend_seqs.append((start, extend_len, cached))
            start += extend_len

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        pool = forward_batch.kv_pool
        pool.store(layer.layer_id, forward_batch.out_cache_loc, k, v)
        if self._paged_extend is not None:
            k_cache, v_cache = pool.k_buffers[layer.layer_id], pool.v_buffers[layer.layer_id]
            out = cpu_kernels.prefill_attention_paged(
                q, k_cache, v_cache, *self._paged_extend, layer.scaling
            )
            return out.flatten(1)
        out = torch.empty_like(q)
        for start, extend_len, cached in self._extend_seqs:
            end = start + extend_len
            q_i, k_i, v_i = q[start:end], k[start:end], v[start:end]
            if q.is_cpu:
                assert not isinstance(cached, tuple), "CPU metadata holds slots"
                if cached is not None:
                    # The whole sequence's K/V, the new rows included (stored above).
                    k_i, v_i = pool.gather(layer.layer_id, cached)
                prefix = k_i.shape[0] - extend_len
                out[start:end] = extend_attention(q_i, k_i, v_i, prefix, layer.scaling)
                continue
            assert not isinstance(cached, torch.Tensor), "non-CPU metadata holds masks"
            mask = None
            if cached is not None:
                slots, mask = cached
                k_i, v_i = pool.gather(layer.layer_id, slots)
            # [heads, tokens, head_dim]; without a prefix the sequence is its new tokens, whose
            # K/V are at hand, and plain causality is right.
            o = F.scaled_dot_product_attention(
                q_i.transpose(0, 1),
                k_i.transpose(0, 1),
                v_i.transpose(0, 1),
                attn_mask=mask,
                is_causal=mask is None,
                scale=layer.scaling,
                enable_gqa=True,
            )
            out[start:end] = o.transpose(0, 1)
        return out.flatten(1)

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        pool = forward_batch.kv_pool
        pool.store(layer.layer_id, forward_batch.out_cache_loc, k, v)
        k_buffer, v_buffer = pool.k_buffers[layer.layer_id], pool.v_buffers[layer.layer_id]
        if self._cascade is not None:
            return cascade_decode(q, k_buffer, v_buffer, self._cascade, layer.scaling)
        if self._in_place is not None:
            rows, seq_lens = self._in_place
            return cpu_kernels.decode_attention(
                q, k_buffer, v_buffer, rows, seq_lens, layer.scaling
            )
        assert self._decode_slots is not None, "init_forward_metadata must run first"
        assert self._decode_mask is not None
        batch, kv_heads, head_dim = q.shape[0], layer.num_kv_heads, layer.head_dim
        shape = (batch, -1, kv_heads, head_dim)  # [batch, len, kv_heads, head_dim]
        keys, values = (t.view(shape) for t in pool.gather(layer.layer_id, self._decode_slots))
        # The query heads that share a KV head attend as that KV head's rows of queries
        # ([batch, kv_heads, group, head_dim]): query head h reads KV head h // group.
        o = F.scaled_dot_product_attention(
            q.reshape(batch, kv_heads, -1, head_dim),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=self._decode_mask,
            scale=layer.scaling,
        )
        return o.reshape(batch, -1)
