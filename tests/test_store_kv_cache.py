"""The KV-store kernel against plain torch indexing (in Triton's interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch
from runner_helpers import TEST_DEVICE

from srt.kernels.triton.store_kv_cache import store_kv_cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_matches_indexing(dtype: torch.dtype, slot_dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    tokens, heads, head_dim, slots_total = 5, 2, 8, 16
    k = torch.randn(tokens, heads, head_dim, generator=generator).to(dtype)
    v = torch.randn(tokens, heads, head_dim, generator=generator).to(dtype)
    k_cache = torch.zeros(slots_total, heads, head_dim, dtype=dtype, device=TEST_DEVICE)
    v_cache = torch.zeros(slots_total, heads, head_dim, dtype=dtype, device=TEST_DEVICE)
    slots = torch.tensor([3, 9, 1, 15, 4], dtype=slot_dtype)

    store_kv_cache(k.to(TEST_DEVICE), v.to(TEST_DEVICE), k_cache, v_cache, slots.to(TEST_DEVICE))
    k_cache, v_cache = k_cache.cpu(), v_cache.cpu()

    expected_k = torch.zeros_like(k_cache)
    expected_v = torch.zeros_like(v_cache)
    expected_k[slots.long()] = k
    expected_v[slots.long()] = v
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)


def test_rows_wider_than_one_block() -> None:
    k = torch.randn(2, 3, 512, device=TEST_DEVICE)
    v = torch.randn(2, 3, 512, device=TEST_DEVICE)
    k_cache = torch.zeros(4, 3, 512, device=TEST_DEVICE)
    v_cache = torch.zeros(4, 3, 512, device=TEST_DEVICE)
    store_kv_cache(k, v, k_cache, v_cache, torch.tensor([2, 0], device=TEST_DEVICE))
    assert torch.equal(k_cache[2], k[0])
    assert torch.equal(v_cache[0], v[1])
    assert not k_cache[1].any()


def test_rejects_mismatched_shapes() -> None:
    k = torch.randn(2, 2, 4)
    cache = torch.zeros(4, 2, 4)
    with pytest.raises(ValueError, match="slots"):
        store_kv_cache(k, k, cache, cache.clone(), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="caches"):
        store_kv_cache(k, k, torch.zeros(4, 2, 8), torch.zeros(4, 2, 8), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="dtype"):
        store_kv_cache(k, k.half(), cache, cache.clone(), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="contiguous"):
        store_kv_cache(
            k.transpose(1, 2).contiguous().transpose(1, 2), k, cache, cache.clone(),
            torch.tensor([0, 1]),
        )  # fmt: skip
