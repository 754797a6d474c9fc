"""Float32 CPU RMSNorm, gated SiLU and rotary embedding (`srt.kernels.cpu.cpu_kernels`) equal
PyTorch's formulas (the path every other dtype and device takes; the rotation bit for bit), update
the residual in place as documented, and refuse outputs that overlap their inputs."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from srt import _rust
from srt.kernels.cpu import cpu_kernels
from srt.layers.activation import SiluAndMul
from srt.layers.layernorm import RMSNorm
from srt.layers.rotary_embedding import RotaryEmbedding, apply_rotary


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return (weight.double() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).float()


@pytest.mark.parametrize("rows", [1, 7, 3000])  # 3000 rows run on several threads
def test_rms_norm_with_and_without_the_residual(rows: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    norm = RMSNorm(40, eps=1e-5).requires_grad_(False)
    norm.weight.copy_(torch.randn(40, generator=generator))
    x = torch.randn(rows, 40, generator=generator) * 3
    residual = torch.randn(rows, 40, generator=generator)
    expected_residual = x + residual
    with torch.inference_mode():
        plain = norm(x)
        out, new_residual = norm.forward_with_residual(x, residual)
    torch.testing.assert_close(plain, reference_rms_norm(x, norm.weight, 1e-5))
    assert new_residual is residual
    assert torch.equal(residual, expected_residual)
    torch.testing.assert_close(out, reference_rms_norm(expected_residual, norm.weight, 1e-5))


def test_rms_norm_of_strided_heads() -> None:
    """Qwen3's q/k norms normalize each head of a view into the fused projection."""
    norm = RMSNorm(8).requires_grad_(False)
    qkv = torch.randn(5, 3 * 4 * 8)
    heads = qkv[:, : 4 * 8].view(5, 4, 8)
    with torch.inference_mode():
        ours = norm(heads)
    torch.testing.assert_close(ours, reference_rms_norm(heads, norm.weight, 1e-6))


@pytest.mark.parametrize("rows", [1, 9, 2000])
def test_silu_and_mul(rows: int) -> None:
    gate_up = torch.randn(rows, 2 * 36, generator=torch.Generator().manual_seed(rows)) * 6
    gate_up[0, 0], gate_up[0, 1] = -100.0, 100.0
    with torch.inference_mode():
        ours = SiluAndMul()(gate_up)
    gate, up = gate_up.double().chunk(2, dim=-1)
    torch.testing.assert_close(ours, (F.silu(gate) * up).float())


def test_rotary_equals_the_pytorch_formula_bit_for_bit() -> None:
    params = {"rope_type": "default", "rope_theta": 10000.0}
    rope = RotaryEmbedding(16, 64, params)(torch.tensor([0, 5, 63, 7]), torch.float32)
    qkv = torch.randn(4, 6 * 16)
    q = qkv[:, : 4 * 16].view(4, 4, 16)  # a strided view, as the attention layers pass it
    with torch.inference_mode():
        ours = apply_rotary(q, rope)
    cos, sin = rope
    expected = q * cos + q.unflatten(-1, (2, 8)).flip(-2).flatten(-2) * sin
    assert torch.equal(ours, expected)


def test_outputs_that_overlap_an_input_are_refused() -> None:
    x = torch.randn(4, 8)
    weight = torch.ones(8)
    with pytest.raises(ValueError, match="overlaps"):
        _rust.rms_norm(x.numpy(), None, weight.numpy(), 1e-6, x.numpy())
    with pytest.raises(ValueError, match="overlaps"):
        _rust.rms_norm(x.numpy(), x.numpy(), weight.numpy(), 1e-6, torch.empty(4, 8).numpy())
    with pytest.raises(ValueError, match="overlaps"):
        _rust.silu_and_mul(x.numpy(), 4, x.view(-1)[:16].numpy())
    with pytest.raises(ValueError, match="cannot hold"):
        _rust.silu_and_mul(x.numpy(), 3, torch.empty(4, 3).numpy())


def test_operands_of_mixed_dtypes_are_refused() -> None:
    """Each kernel takes float32 or bf16 (int16 bits), all of one type."""
    x, weight = torch.randn(4, 8), torch.ones(8)
    bits = torch.empty(4, 8, dtype=torch.bfloat16).view(torch.int16).numpy()
    with pytest.raises(ValueError, match="must all be float32 or all bfloat16"):
        _rust.rms_norm(x.numpy(), None, weight.numpy(), 1e-6, bits)
    with pytest.raises(ValueError, match="the residual must be of the input's type"):
        _rust.rms_norm(x.numpy(), bits, weight.numpy(), 1e-6, torch.empty(4, 8).numpy())
    with pytest.raises(ValueError, match="must all be float32 or all bfloat16"):
        _rust.silu_and_mul(x.numpy(), 4, bits[:, :4].copy())


def test_sizes_past_the_address_space_are_value_errors() -> None:
    gate_up, out = torch.randn(4).numpy(), torch.empty(2).numpy()
    # 2 · 2^63 is 0 and 2 · (2^63 + 1) is 2 modulo 2^64: a row of "0" or "2" floats.
    for dim in (2**63, 2**63 + 1, 2**64 - 1):
        with pytest.raises(ValueError, match="more elements than memory can hold"):
            _rust.silu_and_mul(gate_up, dim, out)
    with pytest.raises(ValueError, match="even head size"):
        _rust.rotary(gate_up[:2], 2, gate_up[:2], gate_up[2:], 2**64 - 2, out)


def copies_in(call: Callable[[], object]) -> set[str]:
    """The names of the copying ATen operators that `call` runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        call()
    names = {event.key for event in profile.key_averages()}
    return names & {"aten::copy_", "aten::contiguous", "aten::clone", "aten::index_copy_"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_reads_strided_rows_in_place(dtype: torch.dtype) -> None:
    """q and k, columns of the fused qkv output (rows 960 elements apart for SmolLM2's 576 and
    192), and a row-narrowed tensor, rotate as their contiguous copies do, bit for bit, without
    a copy."""
    tokens, head_dim = 300, 64
    rope = RotaryEmbedding(head_dim, 512, {"rope_type": "default", "rope_theta": 10000.0})(
        torch.randint(0, 512, (tokens,)), dtype
    )
    qkv = torch.randn(tokens, 15 * head_dim).to(dtype)
    q, k, _ = qkv.split([9 * head_dim, 3 * head_dim, 3 * head_dim], dim=-1)
    narrowed = torch.randn(tokens, 4 * head_dim + 13).to(dtype)[:, 5 : 5 + 4 * head_dim]
    for x in (
        q.view(tokens, 9, head_dim),
        k.view(tokens, 3, head_dim),
        narrowed.view(tokens, 4, -1),
    ):
        assert not x.is_contiguous()
        ours = cpu_kernels.rotary(x, *rope)
        assert ours.is_contiguous()
        assert torch.equal(ours, cpu_kernels.rotary(x.contiguous(), *rope))
        assert not copies_in(functools.partial(cpu_kernels.rotary, x, *rope))
    # One token, and rows that overlap (an expanded tensor) and so are copied first.
    assert torch.equal(
        cpu_kernels.rotary(q[:1].view(1, 9, -1), rope[0][:1], rope[1][:1]),
        cpu_kernels.rotary(q[:1].contiguous().view(1, 9, -1), rope[0][:1], rope[1][:1]),
    )
    expanded = q[:1].view(1, 9, head_dim).expand(tokens, 9, head_dim)
    assert torch.equal(
        cpu_kernels.rotary(expanded, *rope), cpu_kernels.rotary(expanded.contiguous(), *rope)
    )


def test_strided_rotary_rows_past_the_input_are_refused() -> None:
    x, cos = torch.randn(2 * 10 + 8), torch.randn(3, 4)
    with pytest.raises(ValueError, match="end at"):
        _rust.rotary(x[:-1].numpy(), 10, cos.numpy(), cos.numpy(), 4, torch.empty(3, 8).numpy())
    with pytest.raises(ValueError, match="less than their width"):
        _rust.rotary(x.numpy(), 6, cos.numpy(), cos.numpy(), 4, torch.empty(3, 8).numpy())
