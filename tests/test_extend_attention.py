"""CPU extend attention (srt.layers.attention.extend_cpu): causal over the new tokens, after a
cached prefix or none, equals a float64 reference with the causal triangle shifted past the
prefix; grouped-query heads (and not), odd lengths, float32 and bf16.

Tolerances: float32 differs from float64 by float32 rounding (1e-5 on outputs below ~3). In
bf16 the kernel rounds each softmax weight and each part's output to bf16 (8 significant bits,
a relative 2^-9 each), so outputs of magnitude up to ~3 are off by up to ~2e-2."""

from __future__ import annotations

import pytest
import torch

from srt.layers.attention.extend_cpu import extend_attention

TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
SCALE = 0.125


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
    dtype: torch.dtype, heads: int, kv_heads: int, prefix: int, new: int
) -> None:
    q, k, v = random_case(heads, kv_heads, prefix, new, dtype)
    cached = (k[:prefix], v[:prefix]) if prefix else None
    # K/V of the new tokens as the model hands them over: strided views of a wider tensor.
    wide_k = torch.cat([k[prefix:], k[prefix:]], dim=1)[:, :kv_heads]
    out = extend_attention(q, wide_k, v[prefix:], cached, SCALE)
    assert out.dtype == dtype
    assert out.shape == q.shape
    expected = reference(q, k, v)
    tolerance = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), expected, rtol=tolerance, atol=tolerance)


def test_head_size_not_a_multiple_of_sixteen() -> None:
    q, k, v = random_case(6, 2, 40, 21, torch.float32, head_dim=20)
    out = extend_attention(q, k[40:], v[40:], (k[:40], v[:40]), SCALE)
    torch.testing.assert_close(out.double(), reference(q, k, v), rtol=1e-5, atol=1e-5)


def test_a_prefix_changes_the_result() -> None:
    """The prefix is attended: the same new tokens without it give another result."""
    q, k, v = random_case(9, 3, 50, 30, torch.float32)
    with_prefix = extend_attention(q, k[50:], v[50:], (k[:50], v[:50]), SCALE)
    without = extend_attention(q, k[50:], v[50:], None, SCALE)
    assert (with_prefix - without).abs().max() > 0.1
