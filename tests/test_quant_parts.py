"""A weight of parts in different GGUF formats (`QuantizedParts`): each part's product in its
columns, as the parts' own products; its dequantization the parts' rows; its refusals."""

from __future__ import annotations

import pytest
import torch
from test_quant_kernels import make, make_k

from srt.kernels.cpu.quant_kernels import QuantizedWeight
from srt.kernels.cpu.quant_parts import QuantizedParts


def parts_of(*specs: tuple[str, int]) -> tuple[list[QuantizedWeight], torch.Tensor]:
    """Random weights of 512 inputs, one per (format, rows), and gguf's dequantization of
    them stacked."""
    weights, references = [], []
    for seed, (fmt, rows) in enumerate(specs):
        weight, reference = (make_k if fmt.endswith("_k") else make)(fmt, rows, 512, seed)
        weights.append(weight)
        references.append(reference)
    return weights, torch.cat(references)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_each_part_writes_its_columns_of_one_output(rows: int, dtype: torch.dtype) -> None:
    weights, reference = parts_of(("q4_k", 64), ("q4_k", 32), ("q6_k", 32), ("q8_0", 48))
    parts = QuantizedParts(weights)
    # Neighbours in one format are one part.
    assert parts.formats == ("q4_k", "q6_k", "q8_0")
    assert parts.shape == (176, 512)
    assert torch.equal(parts.dequantize(), reference)
    x = torch.randn(2, rows, 512, generator=torch.Generator().manual_seed(rows)).to(dtype)
    bias = torch.randn(176, generator=torch.Generator().manual_seed(7))
    got = parts.linear(x, bias)
    assert got.shape == (2, rows, 176)
    assert got.dtype == dtype
    # Bit for bit each part's own product (each by its own plan) on its rows of the bias.
    expected = torch.cat(
        [
            parts.parts[0].linear(x, bias[:96]),
            parts.parts[1].linear(x, bias[96:128]),
            parts.parts[2].linear(x, bias[128:]),
        ],
        dim=-1,
    )
    assert torch.equal(got, expected)
    unbiased = torch.cat([p.linear(x) for p in parts.parts], dim=-1)
    assert torch.equal(parts.linear(x), unbiased)


def test_packing_and_bytes_are_the_parts() -> None:
    weights, reference = parts_of(("q4_0", 32), ("q5_k", 32))
    parts = QuantizedParts(weights)
    before = parts.nbytes
    assert before == sum(w.nbytes for w in weights)
    packed = parts.pack()
    assert packed == all(p.packed for p in parts.parts)
    assert parts.nbytes == sum(p.nbytes for p in parts.parts)
    assert torch.equal(parts.dequantize(), reference)


def test_what_is_not_a_weight_of_parts_is_refused() -> None:
    (q4_k, q6_k, narrow), _ = parts_of(("q4_k", 32), ("q6_k", 32), ("q8_0", 32))
    with pytest.raises(ValueError, match="at least one part"):
        QuantizedParts([])
    with pytest.raises(ValueError, match="parts all in q4_k make one weight"):
        QuantizedParts([q4_k, q4_k])
    with pytest.raises(ValueError, match=r"one in_features, got \[512, 256\]"):
        QuantizedParts([q4_k, narrow.select_columns(0, 256)])
    parts = QuantizedParts([q4_k, q6_k])
    with pytest.raises(ValueError, match=r"a bias of 64, got \(32,\)"):
        parts.linear(torch.randn(1, 512), torch.randn(32))
    with pytest.raises(ValueError, match=r"expected x\[\.\.\., 512\]"):
        parts.linear(torch.randn(1, 256))
