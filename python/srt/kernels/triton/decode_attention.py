"""Decode attention, split-K: one new token per request attends to all of its cached tokens.

Scope: q, the output and the KV caches share one dtype (float32, float16 or bfloat16); the softmax
runs in float32 (float32 inputs use exact IEEE products, not TF32). Layouts, all with a contiguous
last dimension (other strides are free):

- `q`, `o`: [batch, num_heads, head_dim].
- `k_buffer`, `v_buffer`: [num_slots, num_kv_heads, head_dim], one slot per token (page size 1).
- `req_to_token`: [max_running_requests, max_context_len] int32; row `req_pool_indices[i]`, columns
  `0 : seq_lens[i]` are the slots of request i's tokens, the new token's own K/V included (it must
  be stored before this runs). `seq_lens[i] >= 1`; a request with length 0 gets a zero output.

Grouped-query attention: query head h reads KV head `h // (num_heads // num_kv_heads)`. One
stage-1 program serves up to 16 query heads of one KV head group, so each K/V row is loaded once
for the whole group. Stage 1 splits each request's tokens into `num_kv_splits` contiguous chunks
of `ceil(seq_len / num_kv_splits)` tokens and writes, per (request, head, split), the normalized
partial output and its log-sum-exp (base 2) into a float32 scratch buffer
[batch, num_heads, num_kv_splits, head_dim + 1] (the last column holds the log-sum-exp); empty
splits are skipped. Stage 2 merges the splits of each (request, head).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from srt.kernels.triton.attention_blocks import attend_cached_tokens

_LOG2E = 1.4426950408889634
_BLOCK_H = 16  # tl.dot needs at least 16 rows; unused rows are masked


@triton.jit
def _decode_stage1_kernel(
    q_ptr,
    k_buf_ptr,
    v_buf_ptr,
    scratch_ptr,
    req_to_token_ptr,
    req_pool_indices_ptr,
    seq_lens_ptr,
    qk_scale,
    stride_q0,
    stride_q1,
    stride_kb0,
    stride_kb1,
    stride_vb0,
    stride_vb1,
    stride_s0,
    stride_s1,
    stride_s2,
    stride_req_to_token,
    head_dim,
    GROUP: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    req = tl.program_id(0)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    blocks_per_group: tl.constexpr = (GROUP + BLOCK_H - 1) // BLOCK_H
    kv_head = head_block // blocks_per_group
    in_group = (head_block % blocks_per_group) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = in_group < GROUP
    heads = kv_head * GROUP + in_group

    seq_len = tl.load(seq_lens_ptr + req).to(tl.int32)
    split_len = tl.cdiv(seq_len, NUM_SPLITS)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    if start >= end:
        return
    pool_row = tl.load(req_pool_indices_ptr + req).to(tl.int64)

    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    q = tl.load(
        q_ptr + req * stride_q0 + heads[:, None] * stride_q1 + offs_d[None, :],
        mask=mask_h[:, None] & mask_d[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    # Every block has a valid first column, so m_i is finite after the first one.
    m_i, l_i, acc = attend_cached_tokens(
        q,
        m_i,
        l_i,
        acc,
        k_buf_ptr,
        v_buf_ptr,
        req_to_token_ptr + pool_row * stride_req_to_token,
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
        BLOCK_N,
        PRECISION,
    )

    base = scratch_ptr + req * stride_s0 + heads * stride_s1 + split * stride_s2
    tl.store(
        base[:, None] + offs_d[None, :],
        acc / l_i[:, None],
        mask=mask_h[:, None] & mask_d[None, :],
    )
    tl.store(base + head_dim, m_i + tl.log2(l_i), mask=mask_h)


@triton.jit
def _decode_stage2_kernel(
    scratch_ptr,
    o_ptr,
    seq_lens_ptr,
    stride_s0,
    stride_s1,
    stride_s2,
    stride_o0,
    stride_o1,
    head_dim,
    NUM_SPLITS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + req).to(tl.int32)
    split_len = tl.cdiv(seq_len, NUM_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim

    e_max = float("-inf")
    e_sum = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    base = scratch_ptr + req * stride_s0 + head * stride_s1
    for split in range(NUM_SPLITS):
        # Stage 1 wrote exactly the non-empty splits; the others hold garbage.
        if split * split_len < seq_len:
            part = tl.load(base + split * stride_s2 + offs_d, mask=mask_d, other=0.0)
            lse = tl.load(base + split * stride_s2 + head_dim)
            n_max = tl.maximum(e_max, lse)
            scale_old = tl.exp2(e_max - n_max)
            weight = tl.exp2(lse - n_max)
            acc = acc * scale_old + weight * part
            e_sum = e_sum * scale_old + weight
            e_max = n_max
    out = tl.where(e_sum > 0.0, acc / e_sum, 0.0)
    tl.store(
        o_ptr + req * stride_o0 + head * stride_o1 + offs_d,
        out.to(o_ptr.dtype.element_ty),
        mask=mask_d,
    )


def decode_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    num_kv_splits: int = 8,
    scratch: torch.Tensor | None = None,
) -> None:
    """Writes into `o` the attention of each request's one new token (`q[i]`) over its
    `seq_lens[i]` cached tokens, read through `req_to_token[req_pool_indices[i]]`. Scores are
    `sm_scale * q.k` (the caller passes 1/sqrt(head_dim) or the model's own scale). Layouts: see
    the module docstring.

    `req_pool_indices` and `seq_lens` hold one int32/int64 value per request, on the tensors'
    device. `num_kv_splits` is a compile-time constant of the kernels (each distinct value
    compiles once); more splits than a request has tokens is fine. `scratch`, when given, is the
    float32 [batch, num_heads, num_kv_splits, head_dim + 1] buffer for the split partials
    (contiguous in its last dimension; preallocate it for CUDA graphs); otherwise one is
    allocated. Index values are trusted, not checked: every row, column and slot they name must
    exist.
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, num_heads, head_dim], got {tuple(q.shape)}")
    batch, num_heads, head_dim = q.shape
    if k_buffer.dim() != 3 or k_buffer.shape[2] != head_dim:
        raise ValueError(
            f"k_buffer must be [num_slots, num_kv_heads, {head_dim}], got {tuple(k_buffer.shape)}"
        )
    num_kv_heads = k_buffer.shape[1]
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if v_buffer.shape != k_buffer.shape:
        raise ValueError(f"v_buffer {tuple(v_buffer.shape)} != k_buffer {tuple(k_buffer.shape)}")
    if o.shape != q.shape:
        raise ValueError(f"o must have q's shape {tuple(q.shape)}, got {tuple(o.shape)}")
    for name, t in (("q", q), ("o", o), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if t.stride(2) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    if not (q.dtype == o.dtype == k_buffer.dtype == v_buffer.dtype):
        raise ValueError("q, o and the KV buffers must share one dtype")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"unsupported dtype {q.dtype}")
    if req_to_token.dim() != 2 or req_to_token.dtype != torch.int32:
        raise ValueError("req_to_token must be a 2-D int32 [max_running_requests, max_context_len]")
    if req_to_token.stride(1) != 1:
        raise ValueError("req_to_token must be contiguous in its last dimension")
    for name, t in (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens)):
        if t.shape != (batch,) or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"{name} must be one int32/int64 value per request ({batch}), got "
                f"{tuple(t.shape)} {t.dtype}"
            )
    if num_kv_splits < 1:
        raise ValueError(f"num_kv_splits must be at least 1, got {num_kv_splits}")
    scratch_shape = (batch, num_heads, num_kv_splits, head_dim + 1)
    if scratch is None:
        scratch = torch.empty(scratch_shape, dtype=torch.float32, device=q.device)
    elif scratch.shape != scratch_shape or scratch.dtype != torch.float32:
        raise ValueError(
            f"scratch must be float32 {scratch_shape}, got {scratch.dtype} {tuple(scratch.shape)}"
        )
    elif scratch.stride(3) != 1:
        raise ValueError("scratch must be contiguous in its last dimension")
    tensors = (q, o, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, scratch)
    if len({t.device for t in tensors}) != 1:
        raise ValueError("all tensors must be on one device")
    if batch == 0:
        return

    group = num_heads // num_kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    precision = "ieee" if q.dtype == torch.float32 else None
    grid1 = (batch, num_kv_heads * triton.cdiv(group, _BLOCK_H), num_kv_splits)
    _decode_stage1_kernel[grid1](
        q,
        k_buffer,
        v_buffer,
        scratch,
        req_to_token,
        req_pool_indices,
        seq_lens,
        sm_scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        scratch.stride(0),
        scratch.stride(1),
        scratch.stride(2),
        req_to_token.stride(0),
        head_dim,
        GROUP=group,
        NUM_SPLITS=num_kv_splits,
        BLOCK_H=_BLOCK_H,
        BLOCK_N=64 if q.is_cuda else 16,
        BLOCK_D=block_d,
        PRECISION=precision,
        num_warps=4,
        num_stages=2,
    )
    _decode_stage2_kernel[(batch, num_heads)](
        scratch,
        o,
        seq_lens,
        scratch.stride(0),
        scratch.stride(1),
        scratch.stride(2),
        o.stride(0),
        o.stride(1),
        head_dim,
        NUM_SPLITS=num_kv_splits,
        BLOCK_D=block_d,
    )
