"""Scatter the K and V rows of new tokens into the KV cache at their slots.

Scope: any float dtype (K, V and caches of one dtype); K/V of shape [tokens, heads, head_dim] and
caches of shape [slots, heads, head_dim], each contiguous in its last two dimensions; page size 1
(a slot is one token). One program copies one token's K and V rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_cache_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slots_ptr,
    k_stride,
    v_stride,
    cache_stride,
    row_size,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    for start in range(0, row_size, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < row_size
        k = tl.load(k_ptr + token * k_stride + offsets, mask=mask)
        v = tl.load(v_ptr + token * v_stride + offsets, mask=mask)
        tl.store(k_cache_ptr + slot * cache_stride + offsets, k, mask=mask)
        tl.store(v_cache_ptr + slot * cache_stride + offsets, v, mask=mask)


def store_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Writes `k[i]` to `k_cache[slots[i]]` and `v[i]` to `v_cache[slots[i]]`, in place."""
    if k.shape != v.shape or k.dim() != 3:
        raise ValueError(
            f"k and v must share a [tokens, heads, head_dim] shape: {k.shape}, {v.shape}"
        )
    if k_cache.shape != v_cache.shape or k_cache.shape[1:] != k.shape[1:]:
        raise ValueError(f"caches {k_cache.shape} do not hold rows of shape {tuple(k.shape[1:])}")
    if slots.shape != (k.shape[0],) or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slots must be one int32/int64 index per token, got {slots.shape}")
    if not (k.dtype == v.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError("k, v and the caches must share one dtype")
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(2) != 1 or t.stride(1) != t.shape[2]:
            raise ValueError(f"{name} must be contiguous in its last two dimensions")
    if k_cache.stride(0) != v_cache.stride(0):
        raise ValueError("k_cache and v_cache must share a row stride")
    if k.shape[0] == 0:
        return
    row_size = k.shape[1] * k.shape[2]
    _store_kv_cache_kernel[(k.shape[0],)](
        k,
        v,
        k_cache,
        v_cache,
        slots,
        k.stride(0),
        v.stride(0),
        k_cache.stride(0),
        row_size,
        BLOCK=min(1024, triton.next_power_of_2(row_size)),
    )
