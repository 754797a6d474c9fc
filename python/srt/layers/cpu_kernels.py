"""srt's float32 CPU kernels (the Rust core's `gemm`, `attention` and `ops`), as functions of
tensors: the one place the model layers call `srt._rust` from.

Why they exist: on the CPU a decode step is a few rows per operator, where PyTorch's kernels
reach a fraction of the cores' throughput (its BLAS) or spend more in fixed costs and extra
passes than in arithmetic (its element-wise operators, its attention over gathered K/V). These
run the same float32 arithmetic on PyTorch's OpenMP threads, each row computed alone, so a
sequence's results do not depend on the rest of the batch.

Tensors cross as numpy views of their memory (shared, never copied); the Rust side checks every
length and refuses outputs that overlap inputs. Callers check `runs_in_rust` first; other dtypes,
devices and autograd keep PyTorch's path.
"""

from __future__ import annotations

import torch

from srt import _rust


def runs_in_rust(*tensors: torch.Tensor) -> bool:
    """Whether these kernels take these tensors: float32 on the CPU, no autograd."""
    return all(t.dtype == torch.float32 and t.is_cpu and not t.requires_grad for t in tensors)


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
    x` first, in place, and the sum is normalized."""
    x = x.contiguous()
    out = torch.empty_like(x)
    _rust.rms_norm(
        x.numpy(),
        None if residual is None else residual.numpy(),
        weight.detach().numpy(),
        eps,
        out.numpy(),
    )
    return out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) · up` where the last dimension is `[gate | up]`."""
    dim = gate_up.shape[-1] // 2
    gate_up = gate_up.contiguous()
    out = gate_up.new_empty((*gate_up.shape[:-1], dim))
    _rust.silu_and_mul(gate_up.numpy(), dim, out.numpy())
    return out


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x ([tokens, heads, head_dim]) rotated by each token's row of cos and signed sin."""
    x = x.contiguous()
    out = torch.empty_like(x)
    _rust.rotary(x.numpy(), cos.numpy(), sin.numpy(), x.shape[-1], out.numpy())
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
    kv_heads, head_dim]), read in place. Returns [batch, heads * head_dim]."""
    query = q.contiguous()
    out = torch.empty_like(query)
    _rust.decode_attention(
        query.numpy(),
        k_cache.numpy(),
        v_cache.numpy(),
        rows.numpy(),
        seq_lens.numpy(),
        k_cache.shape[1],
        k_cache.shape[2],
        scale,
        out.numpy(),
    )
    return out.reshape(q.shape[0], -1)
