"""`srt.kernels.cpu.quant_kernels` against the `gguf` package: blocks made by
`gguf.quants.quantize`, dequantized by `gguf.quants.dequantize` (the reference), and products
against `F.linear` with the dequantized weight.

Tolerances: the float kernel accumulates in float32 like the reference, so results agree to
float rounding over the inner dimension (1e-4 relative to the output scale). The integer kernel
(where the CPU has one: the weight is then packed) first splits the activations into two int8
parts per block of 32: it agrees to 1e-4 with the reference applied to those rounded
activations, and to 1e-3 with the reference on the exact ones. The dense path in bfloat16
rounds inputs to 8 bits of mantissa (2e-2 relative).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from srt import _rust
from srt.kernels.cpu.quant_kernels import (
    BLOCK_BYTES,
    SUPER_BLOCK_BYTES,
    QuantizedWeight,
)

FORMATS = {
    "q4_0": GGMLQuantizationType.Q4_0,
    "q4_1": GGMLQuantizationType.Q4_1,
    "q5_0": GGMLQuantizationType.Q5_0,
    "q5_1": GGMLQuantizationType.Q5_1,
    "q8_0": GGMLQuantizationType.Q8_0,
}


def make(fmt: str, out: int, inp: int, seed: int = 0) -> tuple[QuantizedWeight, torch.Tensor]:
    """A random weight quantized by gguf, and gguf's dequantization of it (float32)."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((out, inp)).astype(np.float32) * 0.1
    blocks = quantize(dense, FORMATS[fmt])
    reference = torch.from_numpy(dequantize(blocks, FORMATS[fmt]).astype(np.float32))
    return QuantizedWeight(torch.from_numpy(blocks), fmt, inp), reference


def close(got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    """`got` equals `want` within `rtol` of the largest magnitude of `want`."""
    scale = float(want.abs().max()) + 1e-6
    err = float((got.float() - want.float()).abs().max())
    assert err <= rtol * scale, f"max error {err} vs scale {scale}"


def split_rounded(x: torch.Tensor) -> torch.Tensor:
    """`x` (float32) as the integer kernel rounds it: per block of 32, a high int8 part in
    steps of the block's largest magnitude / 127 and a low one 256 times finer, in float32
    steps as rust/kernels/src/quant/packed.rs takes them; returned exactly, in float64."""
    blocks = x.float().reshape(*x.shape[:-1], -1, 32)
    largest = blocks.abs().amax(-1, keepdim=True)
    safe = torch.where(largest == 0, torch.ones_like(largest), largest)
    t = blocks * (127.0 / safe)
    high = torch.round(t).clamp(-127, 127)
    low = torch.round((t - high) * 256.0).clamp(-127, 127)
    unit = torch.where(largest == 0, torch.zeros_like(largest), safe / 127.0 / 256.0)
    return ((high.double() * 256 + low.double()) * unit.double()).reshape(x.shape)


PACKED = _rust.quant_packed_kernel() is not None

K_FORMATS = {
    "q4_k": GGMLQuantizationType.Q4_K,
    "q5_k": GGMLQuantizationType.Q5_K,
    "q6_k": GGMLQuantizationType.Q6_K,
}


def make_k(fmt: str, out: int, inp: int, seed: int = 0) -> tuple[QuantizedWeight, torch.Tensor]:
    """A K-quant weight of random super-blocks (the `gguf` package cannot quantize to them:
    every byte random, the half scales of moderate size), and gguf's dequantization of it."""
    rng = np.random.default_rng(seed)
    size = SUPER_BLOCK_BYTES[fmt]
    blocks = rng.integers(0, 256, (out * inp // 256, size), dtype=np.uint8)
    d_at = 208 if fmt == "q6_k" else 0
    halves = rng.uniform(1e-3, 3e-2, (len(blocks), 2)).astype(np.float16).view(np.uint8)
    blocks[:, d_at : d_at + 2] = halves[:, :2]
    if fmt != "q6_k":
        blocks[:, 2:4] = halves[:, 2:]
    blocks = blocks.reshape(out, -1)
    reference = torch.from_numpy(dequantize(blocks, K_FORMATS[fmt]).astype(np.float32))
    return QuantizedWeight(torch.from_numpy(blocks), fmt, inp), reference


@pytest.mark.parametrize("fmt", sorted(K_FORMATS))
def test_k_quants_dequantize_as_gguf_from_blocks_and_tiles(fmt: str) -> None:
    weight, reference = make_k(fmt, 37, 512)
    assert SUPER_BLOCK_BYTES[fmt] == _rust.quant_block_bytes(fmt)
    assert torch.equal(weight.select_columns(256, 512).dequantize(), reference[:, 256:])
    ids = torch.tensor([[36, 0], [5, 5]])
    for _ in ("blocks", "tiles"):
        assert torch.equal(weight.dequantize(), reference)
        assert torch.equal(weight.dequantize(torch.bfloat16), reference.to(torch.bfloat16))
        assert torch.equal(weight.rows(ids), reference[ids])
        assert weight.pack() == PACKED == weight.packed
    # The tiles hold about the file's bytes (Q4_K 2.8% more, Q5_K 2.3%, Q6_K as many).
    file_bytes = 64 * 1024 // 256 * SUPER_BLOCK_BYTES[fmt]
    assert file_bytes <= _rust.quant_packed_len(fmt, 64, 1024) <= 1.03 * file_bytes


@pytest.mark.parametrize("fmt", sorted(K_FORMATS))
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_k_quant_kernel_matches_the_dequantized_reference(fmt: str, rows: int) -> None:
    weight, reference = make_k(fmt, 45, 512, seed=rows)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    bias = torch.randn(45)
    got = weight._kernel(x, bias)
    if not weight.pack():
        close(got, F.linear(x, reference, bias), 1e-4)
        return
    close(got, F.linear(split_rounded(x), reference.double(), bias.double()), 1e-4)
    close(got, F.linear(x, reference, bias), 1e-3)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_layout_and_dequantize_match_gguf(fmt: str) -> None:
    weight, reference = make(fmt, 37, 96)
    assert BLOCK_BYTES[fmt] == _rust.quant_block_bytes(fmt)
    assert weight.blocks is not None
    assert weight.blocks.shape == (37, 96 // 32 * BLOCK_BYTES[fmt])
    assert weight.nbytes == weight.blocks.numel()
    ids = torch.tensor([[36, 0], [5, 5]])
    for _ in ("blocks", "tiles"):
        assert torch.equal(weight.dequantize(), reference)
        assert torch.equal(weight.dequantize(torch.bfloat16), reference.to(torch.bfloat16))
        assert torch.equal(weight.rows(ids), reference[ids])
        assert torch.equal(weight.rows(ids, torch.bfloat16), reference[ids].to(torch.bfloat16))
        assert weight.pack() == PACKED == weight.packed
    if PACKED:
        assert weight.blocks is None
        assert weight.nbytes == _rust.quant_packed_len(fmt, 37, 96)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 13, 32, 33])
def test_kernel_matches_the_dequantized_reference(fmt: str, rows: int) -> None:
    weight, reference = make(fmt, 45, 160, seed=rows)
    x = torch.randn(rows, 160, generator=torch.Generator().manual_seed(rows))
    bias = torch.randn(45)
    got = weight._kernel(x, bias)
    if not weight.pack():
        close(got, F.linear(x, reference, bias), 1e-4)
        return
    close(got, F.linear(split_rounded(x), reference.double(), bias.double()), 1e-4)
    close(got, F.linear(x, reference, bias), 1e-3)
    # bfloat16 activations are rounded from their exact values: the float32 product of the
    # same values, rounded once.
    halves = x.to(torch.bfloat16)
    out = weight._kernel(halves, bias)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, weight._kernel(halves.float(), bias).to(torch.bfloat16))


def printed(script: str, isa: str | None) -> list[str]:
    """The words `script` prints in a fresh Python process (as a server starts), run beside
    this file with the kernels capped at `isa` (`SRT_CPU_ISA`; None: this CPU's best)."""
    env = {k: v for k, v in os.environ.items() if k != "SRT_CPU_ISA"}
    if isa is not None:
        env["SRT_CPU_ISA"] = isa
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=os.path.dirname(__file__),
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


def test_the_float_kernel_runs_where_the_integer_one_is_capped_away() -> None:
    """Under `SRT_CPU_ISA=scalar` (or on a CPU without AVX2) weights stay in blocks and the
    float kernel's results agree with the reference to float rounding."""
    script = (
        "import torch, torch.nn.functional as F\n"
        "from test_quant_kernels import make, make_k, close\n"
        "for weight, reference in (make('q4_1', 45, 160), make_k('q6_k', 45, 512)):\n"
        "    x = torch.randn(5, weight.in_features)\n"
        "    close(weight.linear(x), F.linear(x, reference), 1e-4)\n"
        "print(weight.packed, weight.blocks is not None)\n"
    )
    assert printed(script, "scalar") == ["False", "True"]


@pytest.mark.skipif(not PACKED, reason="no integer kernel on this CPU")
@pytest.mark.parametrize("cap", ["avx2", "avx2_vnni"])
def test_the_avx2_integer_kernels_give_the_best_kernels_bits(cap: str) -> None:
    """Under `SRT_CPU_ISA=avx2` weights are packed for the AVX2 integer kernels (`avx2_vnni`:
    with AVX-VNNI's products), whose few-row (two int8 parts) and many-row (one int8) products,
    and the K-quants' few-row products and dequantized tiles, equal, bit for bit, those of this
    CPU's best kernel (each run in a fresh process, as a server starts)."""
    script = (
        "import hashlib, torch\n"
        "from test_quant_kernels import make, make_k\n"
        "from srt.kernels.cpu import cpu_kernels\n"
        "digest = hashlib.sha256()\n"
        "for fmt in ('q4_0', 'q4_1', 'q8_0'):\n"
        "    weight, _ = make(fmt, 45, 160)\n"
        "    seeded = torch.Generator().manual_seed(0)\n"
        "    bias = torch.randn(45, generator=seeded)\n"
        "    for rows, path in ((5, weight._kernel), (40, weight._one_int8)):\n"
        "        for dtype in (torch.float32, torch.bfloat16):\n"
        "            x = torch.randn(rows, 160, generator=seeded)\n"
        "            out = path(x.to(dtype), bias)\n"
        "            digest.update(out.float().numpy().tobytes())\n"
        "for fmt in ('q4_k', 'q5_k', 'q6_k'):\n"
        "    weight, _ = make_k(fmt, 45, 512)\n"
        "    seeded = torch.Generator().manual_seed(0)\n"
        "    for dtype in (torch.float32, torch.bfloat16):\n"
        "        x = torch.randn(5, 512, generator=seeded)\n"
        "        digest.update(weight._kernel(x.to(dtype), None).float().numpy().tobytes())\n"
        "        digest.update(weight.dequantize(dtype).float().numpy().tobytes())\n"
        "print(cpu_kernels.quant_packed_kernel(), weight.packed, digest.hexdigest())\n"
    )
    capped = printed(script, cap)
    best = printed(script, None)
    if cap == "avx2_vnni" and capped[0] == "avx2":
        pytest.skip("this CPU has no AVX-VNNI")
    assert capped[:2] == [cap, "True"]
    assert capped[2] == best[2]


@pytest.mark.parametrize("fmt", sorted(FORMATS) + sorted(K_FORMATS))
def test_dense_path_matches_the_dequantized_reference(fmt: str) -> None:
    inputs = 512 if fmt in K_FORMATS else 64
    weight, reference = (make_k if fmt in K_FORMATS else make)(fmt, 70, inputs, seed=3)
    x = torch.randn(300, inputs)
    close(weight._dense(x, None), F.linear(x, reference), 1e-4)
    bf16 = weight._dense(x.to(torch.bfloat16), None)
    assert bf16.dtype == torch.bfloat16
    close(bf16.float(), F.linear(x, reference), 2e-2)


def test_select_rows_and_cat_compose_shards() -> None:
    q, q_ref = make("q8_0", 40, 64, seed=1)
    k, k_ref = make("q8_0", 24, 64, seed=2)
    both = QuantizedWeight.cat([q, k])
    assert both.out_features == 64
    shard = both.select_rows(30, 50)
    assert torch.equal(both.dequantize(), torch.cat([q_ref, k_ref]))
    assert torch.equal(shard.dequantize(), torch.cat([q_ref, k_ref])[30:50])
    x = torch.randn(3, 64)
    close(shard.linear(x), F.linear(x, torch.cat([q_ref, k_ref])[30:50]), 1e-3)
    if shard.packed:
        with pytest.raises(ValueError, match="is packed"):
            shard.select_rows(0, 1)


def test_bad_arguments_raise_value_error() -> None:
    weight, _ = make("q4_0", 8, 64)
    blocks = weight.blocks
    assert blocks is not None
    out = np.empty((8, 64), dtype=np.float32)
    x, y, y16 = np.zeros((1, 64), np.float32), np.empty((1, 8), np.float32), np.empty(8, np.int16)
    tiles = np.empty(_rust.quant_packed_len("q4_0", 8, 64), np.uint8)
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: QuantizedWeight(blocks, "q3_0", 64), "unknown format"),
        (lambda: QuantizedWeight(blocks, "q4_0", 96), r"\[out, 54\]"),
        (lambda: QuantizedWeight(blocks, "q4_0", 48), "multiple of 32"),
        (lambda: QuantizedWeight(blocks, "q4_k", 128), "multiple of 256"),
        (lambda: QuantizedWeight(blocks[:, :-1], "q4_0", 64), r"\[out, 36\]"),
        (lambda: QuantizedWeight(blocks.to(torch.int16), "q4_0", 64), "uint8"),
        (lambda: weight.linear(torch.randn(2, 32)), "expected x"),
        (lambda: _rust.quant_packed_len("q4_0", 8, 48), "multiple of 32"),
        (lambda: _rust.quant_pack("q4_0", blocks.numpy(), 8, 64, out.view(np.uint8)), "bytes"),
        (lambda: _rust.quant_packed_linear("q4_0", x, 1, blocks.numpy(), 8, 64, None, y), "640"),
        (lambda: _rust.quant_packed_linear("q4_0", x, 1, tiles, 8, 64, None, x), "overlaps"),
        (lambda: _rust.quant_packed_linear("q4_0", x, 1, tiles, 8, 64, None, y16), "both"),
        (lambda: weight.rows(torch.tensor([8])), "ids must lie"),
        (lambda: weight.rows(torch.tensor([-1])), "ids must lie"),
        (lambda: weight.select_rows(4, 4), "non-empty range"),
        (lambda: QuantizedWeight.cat([weight, make("q8_0", 8, 64)[0]]), "one format"),
        (lambda: _rust.quant_dequantize("q4_0", blocks.numpy(), 8, 96, out), "bytes, expected"),
        (lambda: _rust.quant_dequantize("q4_0", blocks.numpy(), 8, 64, out[:1]), "floats"),
        (lambda: _rust.quant_linear("q4_0", out, 1, blocks.numpy(), 8, 64, None, out), "input"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
