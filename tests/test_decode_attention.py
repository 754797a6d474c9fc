"""Float32 CPU decode attention read in place (`srt._rust.decode_attention`): it equals SDPA over
the gathered rows (GQA and not, scattered slots, sequences of different lengths), a sequence's
result is the same bits alone and in a batch, bad slots and mixed dtypes are refused, and a model
decoding through it gives the logits of the gather-and-SDPA path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from runner_helpers import extend_and_decode_logits

from srt import _rust
from srt.layers.attention.cpu_backend import CpuAttnBackend

POOL_SLOTS = 500


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, lens: torch.Tensor
) -> torch.Tensor:
    out = torch.empty_like(q)
    kv_heads, head_dim = k.shape[1], k.shape[2]
    _rust.decode_attention(
        q.numpy(), k.numpy(), v.numpy(), rows.numpy(), lens.numpy(), kv_heads, head_dim, 0.3,
        out.numpy(),
    )  # fmt: skip
    return out


def random_case(
    heads: int, kv_heads: int, lens: list[int], head_dim: int = 24
) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(heads * 10 + kv_heads)
    width = max(lens) + 3
    q = torch.randn(len(lens), heads, head_dim, generator=generator)
    k = torch.randn(POOL_SLOTS, kv_heads, head_dim, generator=generator)
    v = torch.randn(POOL_SLOTS, kv_heads, head_dim, generator=generator)
    # Distinct scattered slots; past a sequence's length, slot 0 (padding), never read.
    slots = torch.randperm(POOL_SLOTS - 1, generator=generator)[: len(lens) * width] + 1
    rows = slots.view(len(lens), width).to(torch.int32)
    for i, n in enumerate(lens):
        rows[i, n:] = 0
    return q, k, v, rows, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize(("heads", "kv_heads"), [(6, 2), (4, 4), (5, 1)])
def test_equals_sdpa_over_the_gathered_rows(heads: int, kv_heads: int) -> None:
    q, k, v, rows, lens = random_case(heads, kv_heads, [1, 9, 40, 23])
    out = attend(q, k, v, rows, lens)
    for i, n in enumerate(lens.tolist()):
        slots = rows[i, :n].long()
        expected = F.scaled_dot_product_attention(
            q[i][:, None].double(),
            k[slots].transpose(0, 1).double(),
            v[slots].transpose(0, 1).double(),
            scale=0.3,
            enable_gqa=True,
        )[:, 0]
        torch.testing.assert_close(out[i].double(), expected, rtol=1e-5, atol=1e-6)


def test_a_sequence_is_the_same_bits_alone_and_in_a_batch() -> None:
    q, k, v, rows, lens = random_case(6, 2, [3, 31, 17, 60, 8])
    together = attend(q, k, v, rows, lens)
    for i in range(len(lens)):
        alone = attend(q[i : i + 1].clone(), k, v, rows[i : i + 1].clone(), lens[i : i + 1].clone())
        assert torch.equal(alone[0], together[i])


def test_slots_outside_the_pool_and_bad_lengths_are_refused() -> None:
    q, k, v, rows, lens = random_case(6, 2, [4, 5])
    rows[1, 2] = POOL_SLOTS
    with pytest.raises(ValueError, match=f"sequence 1 names slot {POOL_SLOTS}, outside"):
        attend(q, k, v, rows, lens)
    rows[1, 2] = 1
    with pytest.raises(ValueError, match="sequence 0 has length 0"):
        attend(q, k, v, rows, torch.tensor([0, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match="the output overlaps"):
        _rust.decode_attention(
            q.numpy(), k.numpy(), v.numpy(), rows.numpy(), lens.numpy(), 2, 24, 0.3, q.numpy()
        )
    bf16_out = torch.empty_like(q, dtype=torch.bfloat16).view(torch.int16)
    with pytest.raises(ValueError, match="must all be float32 or all bfloat16"):
        _rust.decode_attention(
            q.numpy(), k.numpy(), v.numpy(), rows.numpy(), lens.numpy(), 2, 24, 0.3,
            bf16_out.numpy(),
        )  # fmt: skip


@pytest.mark.parametrize(
    ("kv_heads", "head_dim"),
    [
        (1, 2**63),  # sequences · head size wraps to 0 (a division by zero in the shape)
        (2**63 + 1, 2),  # K/V heads · head size wraps to 2: a 2-float "cache" of 2^63 slots
        (2**63, 2**63),
    ],
)
def test_head_sizes_past_the_address_space_are_value_errors(kv_heads: int, head_dim: int) -> None:
    q, cache, out = torch.zeros(2).numpy(), torch.zeros(2).numpy(), torch.zeros(2).numpy()
    slots, lens = torch.ones(2, dtype=torch.int32).numpy(), torch.ones(2, dtype=torch.int32).numpy()
    with pytest.raises(ValueError, match="do not fit in memory"):
        _rust.decode_attention(q, cache, cache.copy(), slots, lens, kv_heads, head_dim, 1.0, out)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_model_decodes_the_same_in_place_and_gathered(
    arch: str, tiny_model_factory: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiny_model_factory(arch)
    calls: list[None] = []
    kernel = _rust.decode_attention
    monkeypatch.setattr(_rust, "decode_attention", lambda *args: calls.append(kernel(*args)))
    in_place = extend_and_decode_logits(path, device="cpu")
    assert calls  # every layer of each decode step
    calls.clear()
    monkeypatch.setattr(CpuAttnBackend, "decode_in_place", False)
    gathered = extend_and_decode_logits(path, device="cpu")
    assert not calls
    for ours, expected in zip(in_place, gathered, strict=True):
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
