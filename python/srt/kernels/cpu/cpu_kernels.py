"""srt's CPU kernels (the Rust kernels' `gemm`, `attention`, `ops` and `moe`) as functions of
tensors, and the instruction-set tier they run. The layers' other facades over `srt._rust` are
`quant_kernels.py` (GGUF weights) and `plan_cache.py` (the extension's bytes in a plan's key);
the CPU decode executor (`model_executor/cpu_decode.py`) calls the Rust decoder stack itself.

Why they exist: on the CPU a decode step is a few rows per operator, where PyTorch's kernels
reach a fraction of the cores' throughput (its BLAS) or spend more in fixed costs and extra
passes than in arithmetic (its element-wise operators, its attention over gathered K/V). These
run on PyTorch's OpenMP threads, each row computed alone, so a sequence's results do not depend
on the rest of the batch. The row-wise operators and decode attention take float32 or bf16
(float32 arithmetic, bf16 rounded where PyTorch rounds it); the linear kernel float32 only.

Tensors cross as numpy views of their memory (shared, never copied; bf16 as int16 views of its
bits, numpy having no bf16); the Rust side checks every length and refuses outputs that overlap
inputs. Callers check `runs_in_rust` first; other dtypes, devices and autograd keep PyTorch's
path. The kernels run the best instruction set of the CPU, capped by `SRT_CPU_ISA` (applied
when this module loads, before any kernel runs).
"""

from __future__ import annotations

import torch

from srt import _rust, envs
from srt.tensor_views import numpy_view as _view
from srt.tensor_views import strided_rows

# The dtypes of the row-wise and attention kernels.
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
# Prefill attention takes head sizes that are multiples of this (bf16 only).
PREFILL_HEAD_DIM_MULTIPLE = 32


def runs_in_rust(*tensors: torch.Tensor, dtypes: tuple[torch.dtype, ...] = KERNEL_DTYPES) -> bool:
    """Whether these kernels take these tensors: all of one dtype among `dtypes`, on the CPU,
    no autograd."""
    dtype = tensors[0].dtype
    return dtype in dtypes and all(
        t.dtype == dtype and t.is_cpu and not t.requires_grad for t in tensors
    )


def isa() -> tuple[str, str]:
    """The instruction set the kernels run now and the best this CPU runs (`scalar`, `avx2`,
    `avx512`, `avx512_vnni`, `avx512_bf16`)."""
    return _rust.cpu_isa()


def set_isa(name: str) -> None:
    """Caps the kernels' instruction set at `name`: one of `isa`'s names, or `avx2_vnni` (the
    AVX2 tier with AVX-VNNI, as on Alder Lake; `avx2` leaves AVX-VNNI out). `avx512_bf16`: no
    cap on any CPU today."""
    _rust.set_cpu_isa(name)


def native_bf16_matmul() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX-512 BF16 or AMX-BF16), counting
    it as without them when `SRT_CPU_ISA` caps the kernels below its tier."""
    return _rust.cpu_bf16_matmul()[0]


def quant_packed_kernel() -> str | None:
    """The integer kernel of quantized weights (`quant_kernels`: "avx512_vnni", "avx2_vnni" with
    AVX-VNNI, "avx2") within the `SRT_CPU_ISA` cap, or None where the float kernel runs
    instead."""
    return _rust.quant_packed_kernel()


def amx_bf16() -> bool:
    """Whether this CPU has AMX tiles with bf16 products (PyTorch's oneDNN uses them)."""
    return _rust.cpu_bf16_matmul()[1]


_configured_isa = envs.cpu_isa()
if _configured_isa is not None:
    set_isa(_configured_isa)


def linear_supported() -> bool:
    """Whether this CPU runs the linear kernel (x86-64 with AVX2 and FMA)."""
    return _rust.linear_supported()


class PackedLinear:
    """A float32 `[out, in]` weight (and bias) packed for the linear kernel, made once after the
    weights load; calling it computes `x · Wᵀ + bias` for x of shape [..., in]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape
        self.packed = torch.empty(_rust.packed_weight_len(self.out_features, self.in_features))
        plain = weight.detach().contiguous()
        # The numpy views are made once: each costs microseconds, and a linear runs often.
        self._packed = self.packed.numpy()
        _rust.pack_weight(plain.numpy(), self.out_features, self.in_features, self._packed)
        self._bias = None if bias is None else bias.detach().numpy()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).contiguous()
        out = torch.empty(rows.shape[0], self.out_features)
        if rows.shape[0]:
            _rust.linear(
                rows.numpy(),
                rows.shape[0],
                self._packed,
                self.out_features,
                self.in_features,
                self._bias,
                out.numpy(),
            )
        return out.view(*x.shape[:-1], self.out_features)


def rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """`weight · x / sqrt(mean(x²) + eps)` per row; with `residual` (contiguous), `residual +=
    x` first, in place, and the sum is normalized. (`weight` takes no gradient: the model
    runner turns them off.)"""
    x = x.contiguous()
    out = torch.empty_like(x)
    _rust.rms_norm(
        _view(x),
        None if residual is None else _view(residual),
        _view(weight),
        eps,
        _view(out),
    )
    return out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) · up` where the last dimension is `[gate | up]`."""
    dim = gate_up.shape[-1] // 2
    gate_up = gate_up.contiguous()
    out = gate_up.new_empty((*gate_up.shape[:-1], dim))
    _rust.silu_and_mul(_view(gate_up), dim, _view(out))
    return out


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x ([tokens, heads, head_dim]) rotated by each token's row of cos and signed sin. x's
    tokens may lie at any stride (q or k columns of the fused qkv output are read in place); the
    result is contiguous."""
    out = torch.empty(x.shape, dtype=x.dtype)
    if x.shape[0] == 0:
        return out
    span, stride = strided_rows(x)
    _rust.rotary(_view(span), stride, _view(cos), _view(sin), x.shape[-1], _view(out))
    return out


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence (q: [batch, heads, head_dim]) against the first
    `seq_lens[b]` slots of `rows[b]` ([batch, width] int32) in a layer's K/V caches ([slots,
    kv_heads, head_dim]), read in place, all of q's dtype. Returns [batch, heads * head_dim]."""
    query = q.contiguous()
    out = torch.empty_like(query)
    _rust.decode_attention(
        _view(query),
        _view(k_cache),
        _view(v_cache),
        rows.numpy(),
        seq_lens.numpy(),
        k_cache.shape[1],
        k_cache.shape[2],
        scale,
        _view(out),
    )
    return out.reshape(q.shape[0], -1)


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, scale: float
) -> torch.Tensor:
    """Causal attention of one sequence's new tokens (q: [new, heads, head_dim], bf16) over its
    `prefix` cached tokens and themselves (k, v: [prefix + new, kv_heads, head_dim], bf16; query
    head h reads KV head h // (heads / kv_heads)). head_dim must be a multiple of 32. Returns
    [new, heads, head_dim]."""
    query, keys, values = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(query)
    _rust.prefill_attention_bf16(
        _view(query),
        _view(keys),
        _view(values),
        q.shape[1],
        k.shape[1],
        k.shape[2],
        prefix,
        scale,
        _view(out),
    )
    return out


def prefill_attention_paged(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    prefix_lens: torch.Tensor,
    new_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of a pass's sequences in one call (bf16): q `[tokens, heads,
    head_dim]` holds their new tokens in order; sequence i has `prefix_lens[i]` cached tokens
    then `new_lens[i]` new ones (int32), whose K/V rows in the layer's caches (`[slots,
    kv_heads, head_dim]`, the new rows already stored) are at `slots` (int32, one sequence's
    after another's). Returns `[tokens, heads, head_dim]`."""
    query = q.contiguous()
    out = torch.empty_like(query)
    _rust.prefill_attention_paged_bf16(
        _view(query),
        _view(k_cache),
        _view(v_cache),
        slots.numpy(),
        prefix_lens.numpy(),
        new_lens.numpy(),
        q.shape[1],
        k_cache.shape[1],
        k_cache.shape[2],
        scale,
        _view(out),
    )
    return out


def moe_route(
    x: torch.Tensor, router: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of `x`'s `top_k` experts (int64 `[rows, top_k]`, in descending weight) and
    their float32 weights, routed through the float32 `[experts, hidden]` weight `router`
    (rust/kernels/src/moe.rs: float32 logits, softmax, top-k, divided by their sum when
    `renormalize`)."""
    x = x.contiguous()
    ids = torch.empty(x.shape[0], top_k, dtype=torch.int64)
    weights = torch.empty(x.shape[0], top_k, dtype=torch.float32)
    router = router.detach()
    experts = router.shape[0]
    _rust.moe_route(
        _view(x), _view(router), experts, top_k, renormalize, ids.numpy(), _view(weights)
    )
    return ids, weights
