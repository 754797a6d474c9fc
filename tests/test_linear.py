"""The models' `Linear`: srt's packed CPU kernel (`srt._rust.linear`) equals `F.linear` on the
same weight, a row's result does not depend on the rest of the batch, bad buffers are refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from runner_helpers import make_runner

from srt import _rust
from srt.layers.linear import Linear, prepare_for_device

needs_kernel = pytest.mark.skipif(not _rust.linear_supported(), reason="CPU without AVX2 and FMA")


def prepared_linear(in_features: int, out_features: int, bias: bool) -> Linear:
    torch.manual_seed(0)
    layer = Linear(in_features, out_features, bias=bias).requires_grad_(False)
    prepare_for_device(layer)
    return layer


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max() / reference.abs().max())


@needs_kernel
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 64, 300])
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


@needs_kernel
def test_a_row_does_not_depend_on_the_other_rows() -> None:
    layer = prepared_linear(576, 960, bias=True)
    x = torch.randn(256, 576)
    with torch.inference_mode():
        together = layer(x)
        for rows in (1, 2, 5, 32, 100):
            assert torch.equal(layer(x[:rows]), together[:rows])
        assert torch.equal(layer(x[7:8]), together[7:8])


@needs_kernel
def test_weights_changed_after_packing_are_packed_again() -> None:
    layer = prepared_linear(32, 48, bias=False)
    x = torch.randn(8, 32)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(48, 32))
    with torch.inference_mode():
        ours = layer(x)
    assert relative_error(ours, F.linear(x, layer.weight)) < 1e-5


@needs_kernel
def test_a_bias_replaced_after_packing_is_used() -> None:
    layer = prepared_linear(32, 48, bias=True)
    x = torch.randn(8, 32)
    layer.bias.data = torch.randn(48)  # new storage, as a reload may give
    with torch.inference_mode():
        ours = layer(x)
    assert relative_error(ours, F.linear(x, layer.weight, layer.bias)) < 1e-5


@needs_kernel
def test_leading_dimensions_and_strided_inputs_are_accepted() -> None:
    layer = prepared_linear(24, 40, bias=True)
    x = torch.randn(3, 5, 48)[..., ::2]  # [3, 5, 24], not contiguous
    with torch.inference_mode():
        ours = layer(x)
        empty = layer(torch.empty(0, 24))
    assert ours.shape == (3, 5, 40)
    assert relative_error(ours, F.linear(x, layer.weight, layer.bias)) < 1e-5
    assert empty.shape == (0, 40)


@needs_kernel
def test_an_input_that_requires_grad_keeps_autograd() -> None:
    layer = prepared_linear(16, 32, bias=False)
    x = torch.randn(4, 16, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None
    assert torch.allclose(x.grad, layer.weight.sum(0).expand(4, 16))


@needs_kernel
def test_the_kernel_refuses_buffers_that_do_not_fit() -> None:
    layer = prepared_linear(16, 32, bias=False)
    assert layer._packed is not None
    packed = layer._packed.packed.numpy()
    x = torch.randn(4, 16).numpy()
    out = torch.empty(4, 32).numpy()
    with pytest.raises(ValueError, match="the output has 127 floats, expected 128"):
        _rust.linear(x, 4, packed, 32, 16, None, out.reshape(-1)[:127])
    with pytest.raises(ValueError, match="overlaps"):
        _rust.linear(out.reshape(-1)[:64], 4, packed, 32, 16, None, out)
    with pytest.raises(ValueError, match="not C-contiguous"):
        _rust.linear(torch.randn(4, 32).numpy()[:, ::2], 4, packed, 32, 16, None, out)
    readonly = out.copy()
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _rust.linear(x, 4, packed, 32, 16, None, readonly)


# (2^63 + 1) · 2 is 2 and (2^63 + 1) · 16 is 16 modulo 2^64: buffers of those lengths passed
# the length checks of `m * k` and `m * n`, and the kernel then ran 2^63 rows (a segfault).
WRAPPING_ROWS = 2**63 + 1


def test_sizes_whose_products_overflow_are_value_errors() -> None:
    packed = torch.zeros(_rust.packed_weight_len(16, 2)).numpy()
    for m, k, x, out in [
        (WRAPPING_ROWS, 2, torch.ones(2), torch.zeros(16)),
        (2**64 // 2 - 1, 3, torch.ones(3), torch.zeros(16)),
    ]:
        with pytest.raises(ValueError, match="more elements than memory can hold"):
            _rust.linear(x.numpy(), m, packed, 16, k, None, out.numpy())
    with pytest.raises(ValueError, match="more elements than memory can hold"):
        _rust.linear(
            torch.ones(2).numpy(), 1, packed, WRAPPING_ROWS, 2, None, torch.zeros(16).numpy()
        )
    with pytest.raises(ValueError, match="more elements than memory can hold"):
        _rust.packed_weight_len(2**62, 2**10)
    with pytest.raises(ValueError, match="more elements than memory can hold"):
        _rust.pack_weight(torch.ones(2).numpy(), WRAPPING_ROWS, 2, torch.zeros(32).numpy())


def test_half_precision_keeps_f_linear() -> None:
    layer = Linear(32, 48).to(torch.bfloat16)
    prepare_for_device(layer)
    assert not layer.packed
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


@needs_kernel
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
