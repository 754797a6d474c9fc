"""Extend (prefill) attention of one sequence on the CPU, without a mask tensor.

A sequence's new tokens attend causally to themselves and to all of its cached prefix. SDPA's
causal flag aligns the triangle top-left, so a prefix used to need an explicit additive
`[new, prefix + new]` mask, which sends PyTorch's CPU flash kernel over every block of it,
masked or not, and adds the mask to each (2048 tokens, SmolLM2 shapes: 1.6-1.9x the causal
time). Instead the new tokens attend in two parts, each a mask-free call of that kernel:
the prefix (rectangular, nothing masked) and themselves (causal), merged by the log-sum-exp
each returns. That is exact in real arithmetic: with `l = log(e^l1 + e^l2)`, the softmax over
both parts is `e^(l1 - l) o1 + e^(l2 - l) o2`. The kernel handles grouped-query heads itself
(query head h reads KV head h // (heads / kv_heads)), so K/V are never expanded.

Bf16 on a CPU with AVX-512 BF16 (and a head size that is a multiple of 32) takes srt's kernel
instead (`cpu_kernels.prefill_attention`, blocked flash attention in `vdpbf16ps`): PyTorch's
multiplies bf16 blocks at float32 speed there, and srt's took 2.5-2.6x less CPU time at
SmolLM2's shapes from 1024 to 2048 new tokens, 2.8x after a 1024-token prefix (AMD Zen 4,
benches/bench_extend_attention.py). Where the CPU also has AMX-BF16, PyTorch's kernel
multiplies on its tiles, and so does srt's (`attention/prefill/amx.rs`): one thread's CPU time
on an Emerald Rapids guest (`--threads 1`), srt's against this route's PyTorch kernel, 0.72
against 0.83 ms at 256 new tokens, 7.6 against 8.4 at 1024, 26.8 against 24.0 at 2048 and 22.0
against 20.0 after a 1024-token prefix (srt's in `vdpbf16ps` there: 2.0, 24.3, 97.2 and 70.9).
The choice follows the CPU's instruction set as the kernels run it (`SRT_CPU_ISA` caps it).

Layouts: token-major, as the model produces them: q `[new, heads, head_dim]`, K/V `[len,
kv_heads, head_dim]`; the result is `[new, heads, head_dim]` in q's dtype. PyTorch's two
partial results are rounded to that dtype by its kernel, and merged in float32.
"""

from __future__ import annotations

import torch

from srt.kernels.cpu import cpu_kernels

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def kernel_takes(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether srt's kernel attends queries of `dtype` and `head_dim`: bf16, a head size it
    takes, and a CPU with AVX-512 BF16 at the kernels' current instruction set."""
    return (
        dtype == torch.bfloat16
        and head_dim % cpu_kernels.PREFILL_HEAD_DIM_MULTIPLE == 0
        and cpu_kernels.isa()[0] == "avx512_bf16"
    )


def runs_in_rust(q: torch.Tensor) -> bool:
    """Whether srt's kernel attends these queries (`kernel_takes`, without autograd)."""
    return kernel_takes(q.dtype, q.shape[-1]) and not q.requires_grad


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    """[len, heads, head_dim] as the kernel's [1, heads, len, head_dim] (a view)."""
    return t.transpose(0, 1)[None]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's output ([1, heads, new, head_dim]) and float32 log-sum-exp of the scaled
    scores ([1, heads, new])."""
    out, lse = _flash(
        _heads_first(q), _heads_first(k), _heads_first(v), is_causal=causal, scale=scale
    )
    return out, lse


def extend_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, scale: float
) -> torch.Tensor:
    """Causal attention of the new tokens (q) over the sequence's K and V (`k`, `v`: its
    `prefix` cached tokens, then the new ones): new token i sees keys up to prefix + i. CPU
    tensors of one dtype."""
    if runs_in_rust(q):
        return cpu_kernels.prefill_attention(q, k, v, prefix, scale)
    new_k, new_v = k[prefix:], v[prefix:]
    new_out, new_lse = _attend(q, new_k, new_v, True, scale)
    if not prefix:
        return new_out[0].transpose(0, 1)
    old_out, old_lse = _attend(q, k[:prefix], v[:prefix], False, scale)
    lse = torch.logaddexp(new_lse, old_lse)
    # [1, heads, new, 1]: each part's share of its row's softmax mass.
    new_share = torch.exp(new_lse - lse)[..., None]
    old_share = torch.exp(old_lse - lse)[..., None]
    merged = new_out.float().mul_(new_share).add_(old_out.float().mul_(old_share))
    return merged[0].transpose(0, 1).to(q.dtype)
