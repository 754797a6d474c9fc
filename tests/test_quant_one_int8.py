"""The one-int8 path of `srt.kernels.cpu.quant_kernels` (activations rounded to one int8 per
value per block of 32 on the packed tiles, rust/kernels/src/quant/packed/one_int8.rs) against a
dequantized reference, and the plan by which `linear` picks a path for a row count.

Tolerances: the kernel accumulates in float32, so it agrees to 1e-4 (relative to the output's
largest magnitude) with the float64 product of the reference weight and the activations as it
rounds them; against the exact activations, rounding each to 1/127 of its block's largest
magnitude (half a step at most, about 0.4%) leaves errors within 2e-2.
"""

from __future__ import annotations

import itertools
import sys

import pytest
import torch
import torch.nn.functional as F
from test_quant_kernels import FORMATS, K_FORMATS, PACKED, close, make, make_k

from srt.kernels.cpu import quant_kernels
from srt.kernels.cpu.quant_kernels import DENSE, KERNEL, ONE_INT8

needs_packed = pytest.mark.skipif(not PACKED, reason="CPU without AVX-512 VNNI")


def int8_rounded(x: torch.Tensor) -> torch.Tensor:
    """`x` (float32) as the one-int8 kernel rounds it: per block of 32, int8 values in steps of
    the block's largest magnitude / 127, in float32 steps as the kernel takes them; returned
    exactly, in float64."""
    blocks = x.float().reshape(*x.shape[:-1], -1, 32)
    largest = blocks.abs().amax(-1, keepdim=True)
    safe = torch.where(largest == 0, torch.ones_like(largest), largest)
    values = torch.round(blocks * (127.0 / safe)).clamp(-127, 127)
    unit = torch.where(largest == 0, torch.zeros_like(largest), safe / 127.0)
    return (values.double() * unit.double()).reshape(x.shape)


@needs_packed
@pytest.mark.parametrize("fmt", sorted(FORMATS) + sorted(K_FORMATS))
@pytest.mark.parametrize("rows", [1, 6, 7, 13, 64, 65, 200])
def test_prefill_matches_the_dequantized_reference(fmt: str, rows: int) -> None:
    """Every format, the K-quants' super-blocks of 256 each meeting their activations by
    sub-blocks of 32."""
    inputs = 512 if fmt in K_FORMATS else 160
    weight, reference = (make_k if fmt in K_FORMATS else make)(fmt, 45, inputs, seed=rows)
    assert weight.pack()
    x = torch.randn(rows, inputs, generator=torch.Generator().manual_seed(rows))
    bias = torch.randn(45)
    got = weight._one_int8(x, bias)
    close(got, F.linear(int8_rounded(x), reference.double(), bias.double()), 1e-4)
    close(got, F.linear(x, reference, bias), 2e-2)
    # bfloat16 activations are widened exactly: the float32 product of the same values,
    # rounded once.
    halves = x.to(torch.bfloat16)
    out = weight._one_int8(halves, bias)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, weight._one_int8(halves.float(), bias).to(torch.bfloat16))
    # A row's result does not depend on the other rows of its call.
    assert torch.equal(weight._one_int8(x[-1:], bias), got[-1:])


def test_prefill_needs_the_tiles() -> None:
    weight, _ = make("q4_1", 16, 64)
    with pytest.raises(ValueError, match="not packed"):
        weight._one_int8(torch.randn(3, 64), None)


def timings(*fastest: str) -> list[dict[str, float]]:
    """Probe timings where `fastest[i]` wins at probe `i` (among the others, dense is faster
    than prefill)."""
    assert len(fastest) == len(quant_kernels._PROBE_ROWS)
    losing = {KERNEL: 4.0, ONE_INT8: 3.0, DENSE: 2.0}
    return [{name: 1.0 if name == win else t for name, t in losing.items()} for win in fastest]


def test_a_path_takes_over_where_it_wins_twice_in_a_row() -> None:
    probes = quant_kernels._PROBE_ROWS
    k, p, d = KERNEL, ONE_INT8, DENSE
    # A lone win is noise; a second one confirms the first.
    assert quant_kernels._plan_from(timings(k, p, k, p, p, p, p, p, p)) == ((0, k), (probes[3], p))
    # The kernel gives way past the last probe to the faster many-row path there.
    plan = quant_kernels._plan_from(timings(k, k, k, k, k, k, k, k, k))
    assert plan == ((0, k), (2 * probes[-1], d))
    # One win at the last probe counts; paths may follow one another.
    assert quant_kernels._plan_from(timings(k, k, p, p, d, d, d, d, p)) == (
        (0, k),
        (probes[2], p),
        (probes[4], d),
        (probes[8], p),
    )
    # Without tiles (no integer kernel) only two paths are timed.
    two = [{KERNEL: 1.0, DENSE: 2.0}] * len(probes)
    assert quant_kernels._plan_from(two) == ((0, k), (2 * probes[-1], d))


@needs_packed
def test_the_prefill_kernel_is_timed_only_where_offered_and_from_its_least_rows() -> None:
    weight, _ = make("q4_1", 32, 64)
    assert weight.pack()
    generator = torch.Generator().manual_seed(0)
    least = quant_kernels.INT8_ACTIVATION_MIN_ROWS

    def timed(rows: int, offered: bool) -> set[str]:
        return set(quant_kernels._probe(weight, rows, torch.float32, offered, generator))

    assert timed(64, False) == {KERNEL, DENSE}
    assert timed(least - 1, True) == {KERNEL, DENSE}
    assert timed(least, True) == {KERNEL, ONE_INT8, DENSE}


@needs_packed
def test_products_round_activations_to_int8_only_inside_the_offer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    least = quant_kernels.INT8_ACTIVATION_MIN_ROWS
    monkeypatch.setattr(quant_kernels, "_plans", {})
    monkeypatch.setattr(
        quant_kernels,
        "_measure_plan",
        lambda weight, dtype, offered: ((0, KERNEL), (least, ONE_INT8 if offered else DENSE)),
    )
    weight, _ = make("q4_1", 32, 64)
    assert weight.pack()
    x = torch.randn(least, 64)
    exact, rounded = weight._dense(x, None), weight._one_int8(x, None)
    assert not torch.equal(exact, rounded)
    assert torch.equal(weight.linear(x), exact)
    with quant_kernels.int8_activations(True):
        assert torch.equal(weight.linear(x), rounded)
        with quant_kernels.int8_activations(False):
            assert torch.equal(weight.linear(x), exact)
        assert torch.equal(weight.linear(x[:-1]), weight._kernel(x[:-1], None))
    assert torch.equal(weight.linear(x), exact)


@pytest.mark.parametrize(
    ("plan", "stacked"),
    [
        (((0, KERNEL), (16, ONE_INT8), (64, DENSE)), (16, ((0, 64),))),
        (((0, KERNEL), (16, ONE_INT8), (32, KERNEL)), (16, ((0, 32),))),
        (((0, KERNEL), (16, ONE_INT8)), (16, ((0, sys.maxsize),))),
        (((0, KERNEL), (8, DENSE), (16, ONE_INT8)), (16, ((0, 8), (16, sys.maxsize)))),
        (
            ((0, KERNEL), (4, DENSE), (16, ONE_INT8), (1024, DENSE)),
            (16, ((0, 4), (16, 1024))),
        ),
        (((0, KERNEL), (8, DENSE), (32, KERNEL)), (None, ((0, 8), (32, sys.maxsize)))),
        (((0, KERNEL),), (None, ((0, sys.maxsize),))),
    ],
)
def test_stack_rows_reads_where_the_stacks_kernels_follow_the_plan(
    plan: quant_kernels.Plan,
    stacked: tuple[int | None, quant_kernels.Windows],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a decode stack running only the few-row and one-int8 kernels needs of a plan: from
    which rows it rounds activations to one int8, and the windows of rows where that gives the
    plan's own path."""
    monkeypatch.setattr(quant_kernels, "_plans", {})
    monkeypatch.setattr(quant_kernels, "_measure_plan", lambda weight, dtype, offered: plan)
    weight, _ = make("q4_1", 16, 64)
    assert weight.stack_rows(torch.float32, True) == stacked


@pytest.mark.parametrize("offered", [False, True])
def test_linear_takes_the_path_its_measured_plan_gives(
    offered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quant_kernels, "_plans", {})
    weight, reference = make("q4_1", 96, 128)
    for dtype in (torch.float32, torch.bfloat16):
        plan = weight.plan(dtype, offered)
        assert plan[0] == (0, KERNEL)
        assert all(path in (KERNEL, ONE_INT8, DENSE) for _, path in plan)
        assert [start for start, _ in plan] == sorted({start for start, _ in plan})
        if offered:
            assert all(
                start >= quant_kernels.INT8_ACTIVATION_MIN_ROWS
                for start, path in plan
                if path == ONE_INT8
            )
        else:
            assert ONE_INT8 not in dict(plan).values()
            one_int8_from, windows = weight.stack_rows(dtype, offered)
            assert one_int8_from is None
            assert windows[0] == (0, plan[1][0])
        boundaries = [(1, KERNEL)] + [
            (rows, path)
            for (_, below), (start, path) in itertools.pairwise(plan)
            for rows, path in ((start - 1, below), (start, path))
        ]
        for rows, path in boundaries:
            x = torch.randn(rows, 128).to(dtype)
            expected = getattr(weight, path)(x, None)
            with quant_kernels.int8_activations(offered):
                product = weight.linear(x.view(1, rows, 128))
            assert torch.equal(product, expected.view(1, rows, 96))
            close(product.view(rows, 96).float(), F.linear(x.float(), reference), 5e-2)
