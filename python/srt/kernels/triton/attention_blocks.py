"""Building blocks shared by the attention kernels: one online-softmax (flash-attention) update,
and the loop that attends over a run of a request's cached tokens in the paged KV cache.

Scope: as the kernels that call them (extend_attention.py, decode_attention.py): K/V caches of
[num_slots, num_kv_heads, head_dim] with a contiguous last dimension, page size 1, slots read
through `req_to_token`; scores in base 2 (`qk_scale` includes log2(e)), accumulation in float32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_softmax_update(qk, v, m_i, l_i, acc, PRECISION: tl.constexpr):
    """Folds one block of scores `qk` [rows, cols] and values `v` [cols, dim] into the running
    max `m_i`, normalizer `l_i` and weighted sum `acc`. Masked scores must be -inf, and every
    row must have seen a finite score by its first block (so `m_i` stays finite)."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.exp2(qk - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    l_i = l_i * alpha + tl.sum(p, 1)
    return m_new, l_i, acc


@triton.jit
def attend_cached_tokens(
    q,
    m_i,
    l_i,
    acc,
    k_buf_ptr,
    v_buf_ptr,
    slots_row_ptr,
    kv_head,
    stride_kb0,
    stride_kb1,
    stride_vb0,
    stride_vb1,
    offs_d,
    mask_d,
    start,
    end,
    qk_scale,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Attends `q` [rows, dim] to the cached tokens at positions start..end of one request,
    whose slots `slots_row_ptr` (its row of req_to_token) lists; every row sees every token."""
    for n_start in range(start, end, BLOCK_N):
        offs_n = n_start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        slots = tl.load(slots_row_ptr + offs_n, mask=mask_n, other=0).to(tl.int64)
        k = tl.load(
            k_buf_ptr + slots[None, :] * stride_kb0 + kv_head * stride_kb1 + offs_d[:, None],
            mask=mask_n[None, :] & mask_d[:, None],
            other=0.0,
        )
        v = tl.load(
            v_buf_ptr + slots[:, None] * stride_vb0 + kv_head * stride_vb1 + offs_d[None, :],
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        )
        qk = tl.dot(q, k, input_precision=PRECISION) * qk_scale
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_i, l_i, acc = online_softmax_update(qk, v, m_i, l_i, acc, PRECISION)
    return m_i, l_i, acc
