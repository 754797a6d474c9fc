"""CPU extend attention (srt.layers.attention.extend_cpu): causal over the new tokens, after a
cached prefix or none, equals a float64 reference with the causal triangle shifted past the
prefix; grouped-query heads (and not), odd lengths, float32 and bf16; bf16 through both routes
(srt's kernel on AVX-512 BF16, PyTorch's two flash calls below that tier), whichever the CPU
runs.

Tolerances: float32 differs from float64 by float32 rounding (1e-5 on outputs below ~3). In
bf16 both routes round each softmax weight to bf16 and the output once (PyTorch's also each
part's output before the merge: 8 significant bits, a relative 2^-9 each), so outputs of
magnitude up to ~3 are off by up to ~2e-2."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from srt.layers import cpu_kernels
from srt.layers.attention.extend_cpu import extend_attention, runs_in_rust

TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
SCALE = 0.125
ACTIVE, BEST = cpu_kernels.isa()
# The tier each route runs at: PyTorch's below AVX-512 BF16, srt's kernel on it.
ROUTES = {"torch": "avx512" if BEST == "avx512_bf16" else BEST}
if BEST == "avx512_bf16":
    ROUTES["rust"] = "avx512_bf16"


@pytest.fixture(params=sorted(ROUTES))
def route(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test with the kernels' tier set for this route, restoring it after."""
    cpu_kernels.set_isa(ROUTES[request.param])
    yield request.param
    cpu_kernels.set_isa(ACTIVE)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Float64 attention of q ([new, heads, d]) over k, v ([prefix + new, kv_heads, d]): query
    i sees keys up to prefix + i."""
    new, heads = q.shape[0], q.shape[1]
    total, group = k.shape[0], heads // k.shape[1]
    keys = k.double().repeat_interleave(group, dim=1)  # [total, heads, d]
    values = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), keys) * SCALE
    query_pos = torch.arange(total - new, total)[:, None]
    scores.masked_fill_(torch.arange(total)[None, :] > query_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)


def random_case(
    heads: int, kv_heads: int, prefix: int, new: int, dtype: torch.dtype, head_dim: int = 64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(heads * 1000 + prefix * 7 + new)
    q = torch.randn(new, heads, head_dim, generator=generator)
    # Keys scaled so that scores spread over several units: the softmax is neither flat nor
    # one-hot, and the merge of the two parts weighs both.
    k = torch.randn(prefix + new, kv_heads, head_dim, generator=generator) * 2
    v = torch.randn(prefix + new, kv_heads, head_dim, generator=generator)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4), (6, 1)])
@pytest.mark.parametrize(
    ("prefix", "new"), [(0, 1), (0, 37), (0, 300), (1, 1), (5, 1), (17, 33), (300, 129), (64, 700)]
)
def test_equals_float64_reference(
    dtype: torch.dtype, heads: int, kv_heads: int, prefix: int, new: int, route: str
) -> None:
    q, k, v = random_case(heads, kv_heads, prefix, new, dtype)
    assert runs_in_rust(q) == (route == "rust" and dtype == torch.bfloat16)
    # K as the model hands over the new tokens' K: a strided view of a wider tensor.
    wide_k = torch.cat([k, k], dim=1)[:, :kv_heads]
    out = extend_attention(q, wide_k, v, prefix, SCALE)
    assert out.dtype == dtype
    assert out.shape == q.shape
    expected = reference(q, k, v)
    tolerance = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [20, 96, 128])
def test_other_head_sizes(dtype: torch.dtype, head_dim: int, route: str) -> None:
    """20 is no multiple of 32: PyTorch's route whatever the tier; 96 and 128 take srt's kernel
    on AVX-512 BF16 (several 32-column slices of the weighted sum)."""
    q, k, v = random_case(6, 2, 40, 21, dtype, head_dim=head_dim)
    assert runs_in_rust(q) == (route == "rust" and dtype == torch.bfloat16 and head_dim != 20)
    out = extend_attention(q, k, v, 40, SCALE)
    tolerance = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), reference(q, k, v), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prefix_changes_the_result(dtype: torch.dtype, route: str) -> None:
    """The prefix is attended: the same new tokens without it give another result."""
    q, k, v = random_case(9, 3, 50, 30, dtype)
    with_prefix = extend_attention(q, k, v, 50, SCALE)
    without = extend_attention(q, k[50:], v[50:], 0, SCALE)
    assert (with_prefix - without).abs().max() > 0.1
