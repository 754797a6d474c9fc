"""The CSR page table of a batch (page size 1) against a plain per-sequence reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from srt.layers.attention.kv_indices import build_kv_indices, indptr_of


def test_indptr_of() -> None:
    assert indptr_of([3, 1, 4]).tolist() == [0, 3, 4, 8]
    assert indptr_of([]).tolist() == [0]
    assert indptr_of([0, 2]).dtype == torch.int32
    with pytest.raises(ValueError, match="negative"):
        indptr_of([2, -1])


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_kv_indices_concatenate_each_sequence_slots(data: st.DataObject) -> None:
    rows, columns = 6, 12
    req_to_token = torch.randperm(rows * columns, dtype=torch.int32).view(rows, columns) + 1
    batch = data.draw(st.integers(0, rows))
    pool_rows = data.draw(st.permutations(range(rows)))[:batch]
    seq_lens = data.draw(st.lists(st.integers(0, columns), min_size=batch, max_size=batch))
    kv_indptr = indptr_of(seq_lens)
    kv_indices = build_kv_indices(
        req_to_token, torch.tensor(pool_rows, dtype=torch.int64), seq_lens, kv_indptr
    )
    expected = [int(s) for r, n in zip(pool_rows, seq_lens, strict=True)
                for s in req_to_token[r, :n]]  # fmt: skip
    assert kv_indices.dtype == torch.int32
    assert kv_indices.tolist() == expected
    for i, (row, n) in enumerate(zip(pool_rows, seq_lens, strict=True)):
        start, end = int(kv_indptr[i]), int(kv_indptr[i + 1])
        assert kv_indices[start:end].tolist() == req_to_token[row, :n].tolist()


def test_a_padding_row_maps_to_the_padding_slot() -> None:
    req_to_token = torch.zeros(3, 4, dtype=torch.int32)
    req_to_token[0] = torch.tensor([5, 6, 7, 8])
    kv_indices = build_kv_indices(
        req_to_token, torch.tensor([0, 2, 2]), [3, 1, 1], indptr_of([3, 1, 1])
    )
    assert kv_indices.tolist() == [5, 6, 7, 0, 0]


@pytest.mark.parametrize(
    ("req_to_token", "rows", "lens", "indptr", "message"),
    [
        (torch.zeros(2, 4, dtype=torch.int64), [0], [1], [0, 1], "int32"),
        (torch.zeros(2, 4, dtype=torch.int32), [0, 1], [1], [0, 1], "one row per sequence"),
        (torch.zeros(2, 4, dtype=torch.int32), [0], [1], [0, 1, 2], "2 entries"),
        (torch.zeros(2, 4, dtype=torch.int32), [0], [5], [0, 5], "exceeds the 4 columns"),
        (torch.zeros(2, 4, dtype=torch.int32), [0], [2], [0, 3], "not at sum"),
    ],
)
def test_bad_inputs_are_refused(
    req_to_token: torch.Tensor, rows: list[int], lens: list[int], indptr: list[int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_kv_indices(
            req_to_token, torch.tensor(rows), lens, torch.tensor(indptr, dtype=torch.int32)
        )
