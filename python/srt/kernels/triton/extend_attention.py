"""Extend (prefill) attention: new tokens attend to a cached prefix in the paged KV cache and
causally to each other.

Scope: q/k/v, the output and the KV caches share one dtype (float32, float16 or bfloat16); the
softmax runs in float32 (float32 inputs use exact IEEE products, not TF32). Layouts, all with a
contiguous last dimension (other strides are free):

- `q_extend`, `o_extend`: [total_new_tokens, num_heads, head_dim]; `k_extend`, `v_extend`:
  [total_new_tokens, num_kv_heads, head_dim]. Request i owns rows
  `extend_start_loc[i] : extend_start_loc[i] + extend_seq_lens[i]`.
- `k_buffer`, `v_buffer`: [num_slots, num_kv_heads, head_dim], one slot per token (page size 1).
- `req_to_token`: [max_running_requests, max_context_len] int32; row `req_pool_indices[i]`,
  column p is the slot of position p of request i. Only the first
  `seq_lens[i] - extend_seq_lens[i]` columns (the prefix) are read: the new tokens' own K/V come
  from `k_extend`/`v_extend`, whether or not they were already stored in the cache.

Grouped-query attention: query head h reads KV head `h // (num_heads // num_kv_heads)`. Any
head_dim works (the block is the next power of two, masked). One program computes one block of
BLOCK_M new tokens of one request for one query head, with an online (flash-attention) softmax over
two stages: the prefix, gathered slot by slot from the caches, then the new tokens, causally.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from srt.kernels.triton.attention_blocks import attend_cached_tokens, online_softmax_update

_LOG2E = 1.4426950408889634


@triton.jit
def _extend_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    k_buf_ptr,
    v_buf_ptr,
    req_to_token_ptr,
    req_pool_indices_ptr,
    seq_lens_ptr,
    extend_seq_lens_ptr,
    extend_start_loc_ptr,
    qk_scale,
    stride_q0,
    stride_q1,
    stride_k0,
    stride_k1,
    stride_v0,
    stride_v1,
    stride_o0,
    stride_o1,
    stride_kb0,
    stride_kb1,
    stride_vb0,
    stride_vb1,
    stride_req_to_token,
    head_dim,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    block_m = tl.program_id(2)
    kv_head = head // GROUP

    extend_len = tl.load(extend_seq_lens_ptr + req).to(tl.int32)
    m_start = block_m * BLOCK_M
    if m_start >= extend_len:
        return
    extend_start = tl.load(extend_start_loc_ptr + req).to(tl.int64)
    prefix_len = tl.load(seq_lens_ptr + req).to(tl.int32) - extend_len
    pool_row = tl.load(req_pool_indices_ptr + req).to(tl.int64)

    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < extend_len
    mask_d = offs_d < head_dim
    rows = extend_start + offs_m.to(tl.int64)

    q = tl.load(
        q_ptr + rows[:, None] * stride_q0 + head * stride_q1 + offs_d[None, :],
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Stage 1: the cached prefix. Every block has a valid first column, so m_i stays finite.
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
        0,
        prefix_len,
        qk_scale,
        BLOCK_N,
        PRECISION,
    )

    # Stage 2: the new tokens, causally. Column 0 is visible to every row, so m_i stays finite.
    n_end = tl.minimum(extend_len, m_start + BLOCK_M)
    for n_start in range(0, n_end, BLOCK_N):
        offs_n = n_start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < extend_len
        cols = extend_start + offs_n.to(tl.int64)
        k = tl.load(
            k_ptr + cols[None, :] * stride_k0 + kv_head * stride_k1 + offs_d[:, None],
            mask=mask_n[None, :] & mask_d[:, None],
            other=0.0,
        )
        v = tl.load(
            v_ptr + cols[:, None] * stride_v0 + kv_head * stride_v1 + offs_d[None, :],
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        )
        qk = tl.dot(q, k, input_precision=PRECISION) * qk_scale
        visible = mask_n[None, :] & (offs_n[None, :] <= offs_m[:, None])
        qk = tl.where(visible, qk, float("-inf"))
        m_i, l_i, acc = online_softmax_update(qk, v, m_i, l_i, acc, PRECISION)

    out = acc / l_i[:, None]
    tl.store(
        o_ptr + rows[:, None] * stride_o0 + head * stride_o1 + offs_d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=mask_m[:, None] & mask_d[None, :],
    )


def _tile_sizes(q: torch.Tensor) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): large tiles on a GPU, halved where float32 or wide heads would spill
    registers; small ones in the CPU interpreter, which keeps it quick and exercises the loops."""
    if not q.is_cuda:
        return 16, 16
    if q.dtype == torch.float32:
        return 32, 32
    return 64, 32 if q.shape[2] > 128 else 64


def _check_index(name: str, t: torch.Tensor, length: int) -> None:
    if t.shape != (length,) or t.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"{name} must be one int32/int64 value per request ({length}), got "
            f"{tuple(t.shape)} {t.dtype}"
        )


def _check_rows(name: str, t: torch.Tensor, rows: int, heads: int, head_dim: int) -> None:
    if t.dim() != 3 or t.shape[1:] != (heads, head_dim) or (rows >= 0 and t.shape[0] != rows):
        expected = f"[{rows if rows >= 0 else 'any'}, {heads}, {head_dim}]"
        raise ValueError(f"{name} must have shape {expected}, got {tuple(t.shape)}")
    if t.stride(2) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension")


def extend_attention_fwd(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    sm_scale: float,
    max_extend_len: int | None = None,
) -> None:
    """Writes into `o_extend` the attention of each request's new tokens over its cached prefix
    (`seq_lens[i] - extend_seq_lens[i]` tokens, read from the caches through `req_to_token`) and,
    causally, over its new tokens (`k_extend`/`v_extend`): new token j of request i sees the whole
    prefix and new tokens 0..j. Scores are `sm_scale * q.k` (the caller passes 1/sqrt(head_dim)
    or the model's own scale). Layouts: see the module docstring.

    `req_pool_indices`, `seq_lens`, `extend_seq_lens` and `extend_start_loc` hold one int32/int64
    value per request, on the tensors' device. `max_extend_len` must be at least
    `max(extend_seq_lens)` (it sizes the launch grid; rows past it are left unwritten); when None
    it is read from `extend_seq_lens`, which synchronizes with the device. Index values are
    trusted, not checked: `seq_lens[i] >= extend_seq_lens[i] >= 0`, and every row, column and slot
    they name must exist.
    """
    if q_extend.dim() != 3:
        raise ValueError(
            f"q_extend must be [total_new_tokens, num_heads, head_dim], got {tuple(q_extend.shape)}"
        )
    total, num_heads, head_dim = q_extend.shape
    if k_buffer.dim() != 3:
        raise ValueError(
            f"k_buffer must be [num_slots, num_kv_heads, head_dim], got {tuple(k_buffer.shape)}"
        )
    num_kv_heads = k_buffer.shape[1]
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    _check_rows("q_extend", q_extend, total, num_heads, head_dim)
    _check_rows("o_extend", o_extend, total, num_heads, head_dim)
    _check_rows("k_extend", k_extend, total, num_kv_heads, head_dim)
    _check_rows("v_extend", v_extend, total, num_kv_heads, head_dim)
    _check_rows("k_buffer", k_buffer, -1, num_kv_heads, head_dim)
    _check_rows("v_buffer", v_buffer, k_buffer.shape[0], num_kv_heads, head_dim)
    tensors = (q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer)
    if len({t.dtype for t in tensors}) != 1:
        raise ValueError("q, k, v, o and the KV buffers must share one dtype")
    if q_extend.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"unsupported dtype {q_extend.dtype}")
    if req_to_token.dim() != 2 or req_to_token.dtype != torch.int32:
        raise ValueError("req_to_token must be a 2-D int32 [max_running_requests, max_context_len]")
    if req_to_token.stride(1) != 1:
        raise ValueError("req_to_token must be contiguous in its last dimension")
    if req_pool_indices.dim() != 1:
        raise ValueError(f"req_pool_indices must be 1-D, got {tuple(req_pool_indices.shape)}")
    batch = req_pool_indices.shape[0]
    for name, t in (
        ("req_pool_indices", req_pool_indices),
        ("seq_lens", seq_lens),
        ("extend_seq_lens", extend_seq_lens),
        ("extend_start_loc", extend_start_loc),
    ):
        _check_index(name, t, batch)
    indices = (req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc)
    if len({t.device for t in (*tensors, *indices)}) != 1:
        raise ValueError("all tensors must be on one device")
    if max_extend_len is None:
        max_extend_len = int(extend_seq_lens.max().item()) if batch > 0 else 0
    if batch == 0 or max_extend_len <= 0 or total == 0:
        return

    block_m, block_n = _tile_sizes(q_extend)
    grid = (batch, num_heads, triton.cdiv(max_extend_len, block_m))
    _extend_attention_kernel[grid](
        q_extend,
        k_extend,
        v_extend,
        o_extend,
        k_buffer,
        v_buffer,
        req_to_token,
        req_pool_indices,
        seq_lens,
        extend_seq_lens,
        extend_start_loc,
        sm_scale * _LOG2E,
        q_extend.stride(0),
        q_extend.stride(1),
        k_extend.stride(0),
        k_extend.stride(1),
        v_extend.stride(0),
        v_extend.stride(1),
        o_extend.stride(0),
        o_extend.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        req_to_token.stride(0),
        head_dim,
        GROUP=num_heads // num_kv_heads,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        PRECISION="ieee" if q_extend.dtype == torch.float32 else None,
        num_warps=4,
        num_stages=1,
    )
