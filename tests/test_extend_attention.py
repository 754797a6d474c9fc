"""CPU extend attention (srt.layers.attention.extend_cpu): causal over the new tokens, after a
cached prefix or none, equals a float64 reference with the causal triangle shifted past the
prefix; grouped-query heads (and not), odd lengths, float32 and bf16; bf16 through both routes
(srt's kernel on AVX-512 BF16, PyTorch's two flash calls below that tier), whichever the CPU
runs. On AVX-512 BF16, a whole pass in one paged call (the CPU backend's bf16 extend) gives
each sequence the bits of attending it alone.

Tolerances: float32 differs from float64 by float32 rounding (1e-5 on outputs below ~3). In
bf16 both routes round each softmax weight to bf16 and the output once (PyTorch's also each
part's output before the merge: 8 significant bits, a relative 2^-9 each), so outputs of
magnitude up to ~3 are off by up to ~2e-2."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from runner_helpers import extend_and_decode_logits
from transformers import AutoConfig

from srt.kernels.cpu import cpu_kernels
from srt.layers.attention import cpu_backend
from srt.layers.attention.extend_cpu import extend_attention, runs_in_rust
from srt.testing.make_tiny_model import make_tiny_model

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


needs_rust = pytest.mark.skipif("rust" not in ROUTES, reason="srt's kernel needs AVX-512 BF16")
# (prefix, new) per sequence of a pass: fresh, a few tokens after a long prefix, prefix only
# (nothing to attend), and one whose keys span two key blocks of the kernel.
PASS = [(0, 40), (300, 7), (50, 0), (129, 164)]


@needs_rust
def test_a_paged_pass_equals_its_sequences_attended_alone() -> None:
    """One paged call over scattered cache slots gives each sequence the bits of attending it
    alone over its gathered K/V, and a wrong slot is refused."""
    generator = torch.Generator().manual_seed(3)
    rows, heads, kv_heads, d = 1200, 9, 3, 64
    k_cache = (torch.randn(rows, kv_heads, d, generator=generator) * 2).bfloat16()
    v_cache = torch.randn(rows, kv_heads, d, generator=generator).bfloat16()
    keys = sum(p + n for p, n in PASS)
    slots = torch.randperm(rows, generator=generator)[:keys].to(torch.int32)
    tokens = sum(n for _, n in PASS)
    # The queries as the model hands them over: a strided view of a wider projection.
    wide = torch.randn(tokens, heads + 2 * kv_heads, d, generator=generator).bfloat16()
    q = wide[:, :heads]
    prefix_lens = torch.tensor([p for p, _ in PASS], dtype=torch.int32)
    new_lens = torch.tensor([n for _, n in PASS], dtype=torch.int32)
    out = cpu_kernels.prefill_attention_paged(
        q, k_cache, v_cache, slots, prefix_lens, new_lens, SCALE
    )
    first_query = first_key = 0
    for prefix, new in PASS:
        mine = slots[first_key : first_key + prefix + new].long()
        k, v = k_cache[mine], v_cache[mine]
        queries = q[first_query : first_query + new]
        alone = cpu_kernels.prefill_attention(queries, k, v, prefix, SCALE)
        assert torch.equal(out[first_query : first_query + new], alone)
        expected = reference(queries, k, v).float()
        torch.testing.assert_close(alone.float(), expected, atol=2e-2, rtol=2e-2)
        first_query, first_key = first_query + new, first_key + prefix + new
    slots[5] = rows
    with pytest.raises(ValueError, match="outside the 1200 rows"):
        cpu_kernels.prefill_attention_paged(
            q, k_cache, v_cache, slots, prefix_lens, new_lens, SCALE
        )


@needs_rust
def test_the_backend_attends_a_pass_in_one_call_with_each_sequences_bits(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bf16 model's extend passes (two prompts together, then one after a cached prefix)
    give the same logits through the paged call as one sequence at a time."""
    path = make_tiny_model("llama", tmp_path_factory.mktemp("hd64"), preset="tiny-hd64")
    calls: list[int] = []
    paged = cpu_kernels.prefill_attention_paged

    def counted(*args: Any) -> torch.Tensor:
        calls.append(len(args[5]))
        return paged(*args)

    monkeypatch.setattr(cpu_kernels, "prefill_attention_paged", counted)
    in_one_call = extend_and_decode_logits(path, dtype="bfloat16", device="cpu")
    layers = AutoConfig.from_pretrained(path).num_hidden_layers
    assert calls == [2] * layers + [1] * layers
    monkeypatch.setattr(cpu_backend, "kernel_takes", lambda dtype, head_dim: False)
    one_by_one = extend_and_decode_logits(path, dtype="bfloat16", device="cpu")
    assert len(calls) == 2 * layers
    for ours, theirs in zip(in_one_call, one_by_one, strict=True):
        assert torch.equal(ours, theirs)
