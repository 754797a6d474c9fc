"""The bf16 CPU kernels (`srt.kernels.cpu.cpu_kernels` over bf16 tensors) against PyTorch's bf16
operators and float64 references, and every instruction-set tier against the default one
(`SRT_CPU_ISA` / `cpu_kernels.set_isa`).

Tolerances: one bf16 step (2^-7 of the value) where the kernel and PyTorch may round a float32
intermediate differently (a sum of squares or a sigmoid computed in another order); none where
the same float32 values are rounded (the residual sum, the rotation); half a step plus float32
error for attention (rtol 2^-8, and atol 2^-8 of the largest |v|: the weights are rounded to
bf16 before their products with V, as PyTorch's CPU flash attention rounds them).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from srt.kernels.cpu import cpu_kernels
from srt.layers.activation import SiluAndMul
from srt.layers.layernorm import RMSNorm
from srt.layers.rotary_embedding import RotaryEmbedding, apply_rotary

BF16_STEP = 2**-7
ACTIVE, BEST = cpu_kernels.isa()
TIERS = ["scalar", "avx2", "avx512", "avx512_vnni", "avx512_bf16"]


@pytest.fixture
def restore_isa() -> Iterator[None]:
    yield
    cpu_kernels.set_isa(ACTIVE)


def bf16_randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=generator) * scale).bfloat16()


def pytorch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's LlamaRMSNorm in x's dtype (srt's non-kernel path)."""
    wide = x.float()
    wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return weight * wide.to(x.dtype)


@pytest.mark.parametrize("rows", [1, 7, 3000])  # 3000 rows run on several threads
def test_rms_norm_with_the_residual_equals_pytorch_in_bf16(rows: int) -> None:
    norm = RMSNorm(96, eps=1e-5).requires_grad_(False).bfloat16()
    norm.weight.copy_(bf16_randn(96, seed=rows))
    x = bf16_randn(rows, 96, seed=rows + 1, scale=3)
    residual = bf16_randn(rows, 96, seed=rows + 2)
    summed = residual + x  # PyTorch's bf16 add: the float32 sum, rounded
    with torch.inference_mode():
        plain = norm(x)
        out, new_residual = norm.forward_with_residual(x, residual)
    assert out.dtype == torch.bfloat16
    assert new_residual is residual
    assert torch.equal(residual, summed)
    for ours, source in ((plain, x), (out, summed)):
        torch.testing.assert_close(
            ours, pytorch_rms_norm(source, norm.weight, 1e-5), rtol=BF16_STEP, atol=1e-6
        )
        # The float32 kernel on the same bf16 values, within the two bf16 roundings.
        wide = cpu_kernels.rms_norm(source.float(), None, norm.weight.float(), 1e-5)
        torch.testing.assert_close(ours.float(), wide, rtol=2 * BF16_STEP, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 9, 2000])
def test_silu_and_mul_equals_pytorch_in_bf16(rows: int) -> None:
    gate_up = bf16_randn(rows, 2 * 40, seed=rows, scale=6)
    gate_up[0, 0], gate_up[0, 1] = -100.0, 100.0
    with torch.inference_mode():
        ours = SiluAndMul()(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours, F.silu(gate) * up, rtol=BF16_STEP, atol=1e-6)


def test_rotary_equals_the_pytorch_formula_in_bf16_bit_for_bit() -> None:
    params = {"rope_type": "default", "rope_theta": 10000.0}
    rope = RotaryEmbedding(64, 128, params)(torch.tensor([0, 5, 127, 7]), torch.bfloat16)
    qkv = bf16_randn(4, 6 * 64, seed=3)
    q = qkv[:, : 4 * 64].view(4, 4, 64)  # a strided view, as the attention layers pass it
    with torch.inference_mode():
        ours = apply_rotary(q, rope)
    cos, sin = rope
    expected = q * cos + q.unflatten(-1, (2, 32)).flip(-2).flatten(-2) * sin
    assert ours.dtype == torch.bfloat16
    assert torch.equal(ours, expected)


def decode_case(
    heads: int, kv_heads: int, lens: list[int], head_dim: int = 64
) -> tuple[torch.Tensor, ...]:
    slots_in_pool = 2000
    generator = torch.Generator().manual_seed(heads * 10 + kv_heads)
    width = max(lens) + 3
    q = torch.randn(len(lens), heads, head_dim, generator=generator).bfloat16()
    k = torch.randn(slots_in_pool, kv_heads, head_dim, generator=generator).bfloat16()
    v = torch.randn(slots_in_pool, kv_heads, head_dim, generator=generator).bfloat16()
    slots = torch.randperm(slots_in_pool - 1, generator=generator)[: len(lens) * width] + 1
    rows = slots.view(len(lens), width).to(torch.int32)
    for i, n in enumerate(lens):
        rows[i, n:] = 0
    return q, k, v, rows, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4)])
def test_decode_attention_over_a_bf16_cache_equals_float64_sdpa(heads: int, kv_heads: int) -> None:
    q, k, v, rows, lens = decode_case(heads, kv_heads, [1, 9, 40, 300])
    out = cpu_kernels.decode_attention(q, k, v, rows, lens, 0.125).view(q.shape)
    assert out.dtype == torch.bfloat16
    for i, n in enumerate(lens.tolist()):
        slots = rows[i, :n].long()
        expected = F.scaled_dot_product_attention(
            q[i][:, None].double(),
            k[slots].transpose(0, 1).double(),
            v[slots].transpose(0, 1).double(),
            scale=0.125,
            enable_gqa=True,
        )[:, 0]
        # The output's rounding, and the weights' (each rounded to bf16, as PyTorch's flash
        # attention rounds them): 2^-8 of the largest |v| at most.
        atol = 2**-8 * float(v[slots].abs().max()) + 1e-5
        torch.testing.assert_close(out[i].double(), expected, rtol=2**-8, atol=atol)


def run_every_kernel(dtype: torch.dtype) -> list[torch.Tensor]:
    """Each kernel once on fixed inputs of `dtype`."""
    x = bf16_randn(33, 72, seed=1).to(dtype)
    weight = bf16_randn(72, seed=2).to(dtype)
    residual = bf16_randn(33, 72, seed=3).to(dtype)
    cos, sin = bf16_randn(33, 1, 24, seed=4).to(dtype), bf16_randn(33, 1, 24, seed=5).to(dtype)
    q, k, v, rows, lens = decode_case(6, 2, [3, 50, 17])
    return [
        cpu_kernels.rms_norm(x, residual, weight, 1e-6),
        residual,
        cpu_kernels.silu_and_mul(x),
        cpu_kernels.rotary(x.view(33, 3, 24), cos, sin),
        cpu_kernels.decode_attention(q.to(dtype), k.to(dtype), v.to(dtype), rows, lens, 0.2),
    ]


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_tier_agrees_with_the_default(
    tier: str, dtype: torch.dtype, restore_isa: None
) -> None:
    if TIERS.index(tier) > TIERS.index(BEST):
        pytest.skip(f"this CPU has no {tier} tier (best: {BEST})")
    default = run_every_kernel(dtype)
    cpu_kernels.set_isa(tier)
    assert cpu_kernels.isa() == (tier, BEST)
    forced = run_every_kernel(dtype)
    # The row-wise kernels sum in one order on every tier: the same bits. Attention too,
    # except the bf16 pair products of the AVX-512 BF16 tier against the others.
    for ours, theirs in zip(forced[:-1], default[:-1], strict=True):
        assert torch.equal(ours, theirs)
    pairs_differ = dtype == torch.bfloat16 and "avx512_bf16" in (tier, ACTIVE) and tier != ACTIVE
    if pairs_differ:
        torch.testing.assert_close(forced[-1], default[-1], rtol=2 * BF16_STEP, atol=1e-5)
    else:
        assert torch.equal(forced[-1], default[-1])


def test_an_unknown_tier_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown CPU instruction set"):
        cpu_kernels.set_isa("avx1024")


@pytest.mark.skipif(BEST == "scalar", reason="the CPU has no AVX2 tier to force")
def test_srt_cpu_isa_caps_the_kernels_and_the_default_dtype() -> None:
    """In a fresh process, as a server starts: the cap applies before any kernel runs, to the
    quantized-weight kernels too."""
    script = (
        "import torch\n"
        "from srt.kernels.cpu import cpu_kernels\n"
        "from srt.model_executor.resolve import default_dtype_and_reason\n"
        "print(cpu_kernels.isa()[0], cpu_kernels.linear_supported(),\n"
        "      default_dtype_and_reason(torch.device('cpu'))[0],\n"
        "      cpu_kernels.quant_packed_kernel())\n"
    )

    def run(tier: str) -> list[str]:
        env = {**os.environ, "SRT_CPU_ISA": tier}
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        )
        return done.stdout.split()

    assert run("avx2") == ["avx2", "True", "float32", "avx2"]
    assert run("scalar") == ["scalar", "False", "float32", "None"]
