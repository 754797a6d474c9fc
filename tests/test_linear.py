"""The models' `Linear`: the packed oneDNN path on the CPU equals `F.linear` on the same weight."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from runner_helpers import make_runner

from srt.layers.linear import PACKED_MIN_ROWS, Linear, onednn_linear_available, prepare_for_device

needs_onednn = pytest.mark.skipif(not onednn_linear_available(), reason="torch without oneDNN")


def prepared_linear(in_features: int, out_features: int, bias: bool) -> Linear:
    torch.manual_seed(0)
    layer = Linear(in_features, out_features, bias=bias).requires_grad_(False)
    prepare_for_device(layer)
    return layer


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max() / reference.abs().max())


@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, PACKED_MIN_ROWS, 7, 64, 300])
def test_packed_matches_f_linear(rows: int, bias: bool) -> None:
    layer = prepared_linear(96, 200, bias)
    assert layer.packed
    x = torch.randn(rows, 96)
    with torch.inference_mode():
        ours = layer(x)
    reference = F.linear(x.double(), layer.weight.double(), layer.bias.double() if bias else None)
    assert ours.dtype == torch.float32
    assert ours.shape == (rows, 200)
    assert relative_error(ours.double(), reference) < 1e-6


@needs_onednn
def test_a_row_does_not_depend_on_the_other_rows() -> None:
    layer = prepared_linear(576, 960, bias=True)
    x = torch.randn(256, 576)
    with torch.inference_mode():
        together = layer(x)
        for rows in (PACKED_MIN_ROWS, 5, 32, 100):
            assert torch.equal(layer(x[:rows]), together[:rows])


@needs_onednn
def test_weights_changed_after_packing_are_packed_again() -> None:
    layer = prepared_linear(32, 48, bias=False)
    x = torch.randn(8, 32)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(48, 32))
    with torch.inference_mode():
        ours = layer(x)
    assert relative_error(ours, F.linear(x, layer.weight)) < 1e-5


def test_half_precision_keeps_f_linear() -> None:
    layer = Linear(32, 48).to(torch.bfloat16)
    prepare_for_device(layer)
    assert not layer.packed
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


@needs_onednn
@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # separate and tied output projection
def test_runner_packs_every_projection(
    arch: str, tiny_model_factory: Callable[[str], Path]
) -> None:
    model = make_runner(tiny_model_factory(arch)).model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears
    assert all(m.packed for m in linears)
    lm_head = model.lm_head
    tied = arch.startswith("qwen")
    assert (lm_head.weight is model.model.embed_tokens.weight) == tied  # type: ignore[union-attr]
