"""`KVPool.store` on the CPU: float32 and bf16 rows go through srt's row scatter and land where
`index_copy_` puts them (strided k/v views of the fused qkv output read in place, without a
copy); other dtypes keep `index_copy_`; a slot outside the pool is refused before anything is
written."""

from __future__ import annotations

import math

import pytest
import torch

from srt import _rust
from srt.mem_cache import memory_pool, row_scatter
from srt.mem_cache.memory_pool import KVPool

SLOTS, LAYERS, KV_HEADS, HEAD_DIM, HEADS = 40, 2, 3, 64, 9


def new_tokens(tokens: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v of `tokens` new tokens: strided views of a fused [q | k | v] projection output."""
    generator = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=generator).to(dtype)
    _, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    return k.view(tokens, KV_HEADS, HEAD_DIM), v.view(tokens, KV_HEADS, HEAD_DIM)


def store_ops(call: object) -> set[str]:
    """The ATen operators that `call` runs."""
    assert callable(call)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        call()
    return {event.key for event in profile.key_averages()}


@pytest.fixture
def scatter_from(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> float:
    """Stores of at least `request.param` rows take the row scatter (0: all; inf: none), in
    place of the measured crossover."""
    min_rows: float = request.param
    monkeypatch.setattr(memory_pool, "scatter_min_rows", lambda dtype, row_shape: min_rows)
    return min_rows


@pytest.mark.parametrize("scatter_from", [0, math.inf], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("strided", [True, False])
def test_store_equals_index_copy(dtype: torch.dtype, strided: bool, scatter_from: float) -> None:
    pool = KVPool(SLOTS, LAYERS, KV_HEADS, HEAD_DIM, dtype, torch.device("cpu"))
    k, v = new_tokens(25, dtype, seed=1)
    if not strided:
        k, v = k.contiguous(), v.contiguous()
    slots = torch.randperm(SLOTS, generator=torch.Generator().manual_seed(2))[:25] + 1
    slots[0] = SLOTS  # the last slot
    pool.store(1, slots, k, v)
    for buffers, rows in ((pool.k_buffers, k), (pool.v_buffers, v)):
        expected = torch.zeros(SLOTS + 1, KV_HEADS, HEAD_DIM, dtype=dtype)
        assert torch.equal(buffers[1], expected.index_copy_(0, slots, rows))
        assert not buffers[0].any()  # the other layer is untouched


@pytest.mark.parametrize("scatter_from", [0], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_copies_strided_rows_without_index_copy(
    dtype: torch.dtype, scatter_from: float
) -> None:
    pool = KVPool(SLOTS, LAYERS, KV_HEADS, HEAD_DIM, dtype, torch.device("cpu"))
    k, v = new_tokens(8, dtype, seed=3)
    slots = torch.arange(8) + 5
    ops = store_ops(lambda: pool.store(0, slots, k, v))
    assert not ops & {"aten::index_copy_", "aten::copy_", "aten::contiguous"}, ops
    assert torch.equal(pool.k_buffers[0][5:13], k)
    assert torch.equal(pool.v_buffers[0][5:13], v)


@pytest.mark.parametrize("scatter_from", [0], indirect=True)
@pytest.mark.parametrize("bad", [SLOTS + 1, -1])
def test_a_slot_outside_the_pool_is_refused_and_nothing_is_written(
    bad: int, scatter_from: float
) -> None:
    pool = KVPool(SLOTS, LAYERS, KV_HEADS, HEAD_DIM, torch.bfloat16, torch.device("cpu"))
    k, v = new_tokens(3, torch.bfloat16, seed=4)
    with pytest.raises(ValueError, match=f"slot {bad} is not one of the buffer's {SLOTS + 1} rows"):
        pool.store(0, torch.tensor([1, bad, 2]), k, v)
    assert not pool.k_buffers[0].any()
    assert not pool.v_buffers[0].any()


@pytest.mark.parametrize("scatter_from", [0], indirect=True)
def test_no_new_tokens_store_nothing(scatter_from: float) -> None:
    pool = KVPool(SLOTS, LAYERS, KV_HEADS, HEAD_DIM, torch.float32, torch.device("cpu"))
    k, v = new_tokens(0, torch.float32, seed=5)
    pool.store(0, torch.empty(0, dtype=torch.int64), k, v)
    assert not pool.k_buffers[0].any()


def test_rows_that_do_not_fit_the_buffer_are_refused() -> None:
    buffer, slots = torch.zeros(4, 8), torch.tensor([0, 1])
    rows = torch.randn(2, 16)
    # The source's last row would end past it; rows closer than their width; mixed dtypes.
    with pytest.raises(ValueError, match="end at"):
        _rust.scatter_rows(rows.view(-1)[:23].numpy(), 16, 8, slots.numpy(), buffer.numpy())
    with pytest.raises(ValueError, match="less than their width"):
        _rust.scatter_rows(rows.view(-1).numpy(), 4, 8, slots.numpy(), buffer.numpy())
    bits = rows.bfloat16().view(torch.int16).view(-1).numpy()
    with pytest.raises(ValueError, match="must both be float32 or both bfloat16"):
        _rust.scatter_rows(bits, 16, 8, slots.numpy(), buffer.numpy())
    with pytest.raises(ValueError, match="overlaps"):
        _rust.scatter_rows(buffer.view(-1)[:8].numpy(), 8, 8, slots[:1].numpy(), buffer.numpy())


def test_the_crossover_is_the_first_probe_won_from_there_on() -> None:
    probes = row_scatter._PROBE_ROWS
    assert row_scatter.min_rows_from([True] * len(probes)) == probes[0]
    assert row_scatter.min_rows_from([False, True, False] + [True] * (len(probes) - 3)) == probes[3]
    assert row_scatter.min_rows_from([True] * (len(probes) - 1) + [False]) == math.inf


def test_the_crossover_is_measured_once_per_dtype_and_width(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = row_scatter.scatter_min_rows(torch.bfloat16, (3, 64))
    assert first == math.inf or first in row_scatter._PROBE_ROWS

    def measure_again(*args: object) -> bool:
        raise AssertionError("measured twice")

    monkeypatch.setattr(row_scatter, "_scatter_wins", measure_again)
    assert row_scatter.scatter_min_rows(torch.bfloat16, torch.Size([3, 64])) == first
