"""Weights kept in GGUF's quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the K-quants
Q4_K, Q5_K, Q6_K) and the products computed from them: the Rust `quant` kernels
(rust/kernels/src/quant.rs) as a tensor class.

The K-quants (super-blocks of 256 weights, `SUPER_BLOCK_BYTES`) take every path, their kernels
meeting each sub-block of 32 with its block of activations. The GGUF loader keeps every format
here in blocks (`FORMATS`).

Why: decoding on the CPU is bound by the bytes of weights each step reads; blocks of 4.5 to 8.5
bits per weight read 4 to 7 times fewer than float32. Where the CPU has integer dot products
(AVX-512 VNNI's `vpdpbusd`, or AVX2's `vpmaddubsw` at about 60% of its rate per core), a weight
is repacked at its first use into the tiles of the integer kernel
(rust/kernels/src/quant/packed.rs: activations split into two int8 parts per block of 32, to about
15 bits), and its blocks are released; elsewhere (CPUs below AVX2) the portable float kernel
expands the blocks and keeps float32's results. Both take few rows (decode). Many rows (prefill)
may instead take one of two paths: on tiles, the one-int8 kernel (`_one_int8`: activations
rounded to ONE int8 per value per block of 32, as llama.cpp's Q8 activations, so one `vpdpbusd`
per four weights: twice the split kernel's rate, and above a bfloat16 matmul's where int8
products run at twice bf16's); or the dense path, which dequantizes the weight for the call and
runs PyTorch's matrix multiply in the activations' dtype (oneDNN's bf16 products where
`--dtype auto` chose bf16).

The one-int8 kernel is offered only inside `int8_activations(True)`, which the model runner
enters for every pass (prefill and decode) of `--quantization gguf` models unless
`--disable-int8-activations`; from `INT8_ACTIVATION_MIN_ROWS` rows a product may take it, so
prefill passes and decode steps of 16 sequences or more round activations to one int8, as
llama.cpp does at every size, and smaller decode steps keep the split kernel's ~15 bits. Why:
measured on SmolLM2-135M Q4_1 against its dequantized float32 model (24 chat prompts, 32
tokens, each step fed the reference's token), as top-1 agreement of the next token and mean KL
divergence of its distribution: with bf16 activations (the default dtype where the CPU has
AVX-512 BF16) 97.5% and 1.1e-3 without int8, 96.4% and 2.3e-3 with prefill in int8, 95.8% and
4.8e-3 when decode batches of 16 rows or more were rounded too (a decode step's error reaches
its token directly, a prefill's through the cached K and V); with float32 activations, 100%
and 3e-8 without, 97.1% and 1.2e-3 with prefill in int8. For those 0.6 points of agreement a
decode step of 16 sequences went from 28.1 to 23.0 ms and one of 32 from 58.6 to 45.5 ms (the
split kernel does twice the integer products; SmolLM2, bf16, 256-token contexts, 2 threads,
alternated in one process). The one-int8 kernel's speed on a quiet 2-core Zen 4 (SmolLM2's
projections, 256 to 4096 bf16 rows, benches/bench_quant_linear.py): 0.48 to 0.60 TOP/s, against
0.39 to 0.43 TFLOP/s for PyTorch's bf16 matmul on a dequantized weight and 0.29 to 0.41 for the
dense path (which dequantizes for each call).

Which path takes which row counts is measured, not assumed: at the first call per (format,
shape, dtype), every path is timed at a few row counts (`_measure_plan`: 0.05 to 1 s for each of
SmolLM2's projections on a busy 2-core machine, several for its 49152-row lm_head) and the plan
(`_plan_from`: from which row count each path takes over) is kept for the process, and on disk
for later starts on the same machine (`plan_cache`); the model runner plans every weight as it
loads. So a row's result can depend on how many rows share its call (which path its call
takes); each path alone is batch invariant.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from srt import _rust
from srt.kernels.cpu import cpu_kernels, plan_cache
from srt.tensor_views import numpy_view

BLOCK_SIZE = 32
SUPER_BLOCK_SIZE = 256
_ACTIVATION_DTYPES = (torch.float32, torch.bfloat16)
# Bytes per block of 32 weights.
BLOCK_BYTES: dict[str, int] = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "q8_0": 34}
# Bytes per super-block of 256 weights of the K-quants.
SUPER_BLOCK_BYTES: dict[str, int] = {"q4_k": 144, "q5_k": 176, "q6_k": 210}
# Every format `QuantizedWeight` holds: the ones the GGUF loader keeps in blocks.
FORMATS: frozenset[str] = frozenset(BLOCK_BYTES) | frozenset(SUPER_BLOCK_BYTES)
PathFn = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]

# Row counts at which the paths are compared, in order (see `_measure_plan`). Past the last, the
# few-row kernel is assumed to lose (its cost grows with rows at the rate of two int8 products
# per weight, or float32 FMAs, where a many-row path's grows at half that or better-blocked).
# 1024: prefill passes reach thousands of rows, where the dense path's dequantization, paid once
# per call, weighs least; measured with SmolLM2's Q4_1 gate_up (bf16, 2 cores with AMX), the
# one-int8 kernel took 0.99 ms at 256 rows against the dense path's 1.26, but 3.97 against 1.91
# at 1024 and 15.7 against 5.1 at 4096: a plan that stopped at 256 kept the slower path for
# every larger pass. 2048: the rows of a full prefill pass (`--chunked-prefill-size`), which
# the last probe decides alone; at 1024 two paths can lie within a busy machine's noise of each
# other, and a plan that ended there kept a path that lost at 2048. Measured on a 2-core
# Emerald Rapids guest with SmolLM2's Q4_K_M file (bf16): its Q5_0 attn_output took 1.32 ms
# one-int8 against 1.67 dense at 1024 rows, 2.09 against 0.89 at 2048; its Q4_K ffn_down 3.3
# against 2.3 at 1024 and 6.6 against 4.6 at 2048, yet one start's plan, measured during a
# burst of load elsewhere, kept it on the one-int8 kernel for every pass.
_PROBE_ROWS = (4, 8, 16, 32, 64, 128, 256, 1024, 2048)
_PROBE_REPEATS = 3
# The fewest rows of a product that may round activations to int8 (inside `int8_activations`).
INT8_ACTIVATION_MIN_ROWS = 16
# The paths `linear` chooses between (methods of QuantizedWeight), the few-row kernel first.
KERNEL, ONE_INT8, DENSE = "_kernel", "_one_int8", "_dense"
# A plan: (fewest rows, path) pairs by rising row count, the first (0, KERNEL).
Plan = tuple[tuple[int, str], ...]
# Windows [start, end) of row counts, by rising start.
Windows = tuple[tuple[int, int], ...]
# (fmt, out_features, in_features, activations' dtype, packed, int8 offered) -> the measured plan.
_plans: dict[tuple[str, int, int, torch.dtype, bool, bool], Plan] = {}
# How many of those plans this process read from the plan cache ("read") or measured
# ("measured"): the start-up log says which.
plan_sources: Counter[str] = Counter()
# Whether products may round activations to int8 now (`int8_activations`).
_int8_offered: contextvars.ContextVar[bool] = contextvars.ContextVar("int8_offered", default=False)


@contextlib.contextmanager
def int8_activations(offered: bool) -> Iterator[None]:
    """Inside, when `offered`, products of `INT8_ACTIVATION_MIN_ROWS` rows or more on tiles may
    take the one-int8 kernel (activations rounded to one int8 per value) where their plan measures
    it fastest; outside, or when not offered, none does."""
    token = _int8_offered.set(offered)
    try:
        yield
    finally:
        _int8_offered.reset(token)


def int8_offered() -> bool:
    """Whether products may round activations to int8 here (inside `int8_activations(True)`)."""
    return _int8_offered.get()


def block_shape(fmt: str) -> tuple[int, int]:
    """(weights, bytes) per block of `fmt`: 32 weights, or a K-quant's super-block of 256."""
    if fmt in BLOCK_BYTES:
        return BLOCK_SIZE, BLOCK_BYTES[fmt]
    if fmt in SUPER_BLOCK_BYTES:
        return SUPER_BLOCK_SIZE, SUPER_BLOCK_BYTES[fmt]
    known = sorted(BLOCK_BYTES) + sorted(SUPER_BLOCK_BYTES)
    raise ValueError(f"unknown format {fmt!r}, expected one of {known}")


class QuantizedWeight:
    """A [out_features, in_features] weight kept in a GGUF block format (CPU uint8 tensor
    blocks of shape [out_features, in_features // weights * bytes], `block_shape(fmt)`,
    contiguous)."""

    def __init__(self, blocks: torch.Tensor, fmt: str, in_features: int) -> None:
        width, block_bytes = block_shape(fmt)
        if in_features <= 0 or in_features % width:
            raise ValueError(
                f"in_features must be a positive multiple of {width}, got {in_features}"
            )
        row_bytes = in_features // width * block_bytes
        if blocks.dtype != torch.uint8 or not blocks.is_cpu or blocks.dim() != 2:
            raise ValueError(
                f"blocks must be a 2-D uint8 CPU tensor, got {blocks.dtype} {tuple(blocks.shape)}"
                f" on {blocks.device}"
            )
        if blocks.shape[1] != row_bytes or blocks.shape[0] == 0:
            raise ValueError(
                f"{fmt} blocks of {in_features} inputs are [out, {row_bytes}] bytes with out > 0,"
                f" got {tuple(blocks.shape)}"
            )
        if not blocks.is_contiguous():
            raise ValueError("blocks must be contiguous")
        self.fmt = fmt
        self.in_features = in_features
        self.out_features = blocks.shape[0]
        # The file's blocks until `pack` replaces them with the integer kernel's tiles; `_held`
        # is a numpy view of whichever is held, made once: each costs microseconds, and a linear
        # runs often.
        self.blocks: torch.Tensor | None = blocks
        self._packed: torch.Tensor | None = None
        # Per (dtype, int8 offered), the plan's (fewest rows, bound path) pairs, highest row
        # count first.
        self._paths: dict[tuple[torch.dtype, bool], tuple[tuple[int, PathFn], ...]] = {}
        self._held = blocks.numpy()

    @property
    def shape(self) -> tuple[int, int]:
        """[out_features, in_features], as a float weight's."""
        return (self.out_features, self.in_features)

    @property
    def nbytes(self) -> int:
        """Bytes of blocks or tiles (what a product reads)."""
        held = self.blocks if self._packed is None else self._packed
        assert held is not None
        return held.numel()

    @property
    def packed(self) -> bool:
        """Whether the weight is held in the integer kernel's tiles."""
        return self._packed is not None

    @property
    def held(self) -> np.ndarray:
        """What the products read, as a numpy uint8 view: the tiles once packed, else the
        blocks."""
        return self._held

    def __repr__(self) -> str:
        return f"QuantizedWeight({self.fmt}, [{self.out_features}, {self.in_features}])"

    def pack(self) -> bool:
        """Repacks the blocks into the integer kernel's tiles where this CPU has that kernel
        (`cpu_kernels.quant_packed_kernel()`), releasing the blocks; whether the weight is
        packed. Called once a model is loaded (`Linear.prepare_for_device`) and at the first
        product."""
        if self._packed is None and cpu_kernels.quant_packed_kernel() is not None:
            n, k = self.out_features, self.in_features
            tiles = torch.empty(_rust.quant_packed_len(self.fmt, n, k), dtype=torch.uint8)
            _rust.quant_pack(self.fmt, self._held, n, k, tiles.numpy())
            self._packed, self._held, self.blocks = tiles, tiles.numpy(), None
        return self._packed is not None

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`x · Wᵀ + bias` for x [..., in_features] (float32 or bfloat16, CPU), in x's dtype:
        from the blocks or tiles for few rows, by the path the measured plan gives for many.
        (Runs for every linear layer of every decode step: each step of Python here costs about
        a microsecond.)"""
        dtype = x.dtype
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected x[..., {self.in_features}], got {tuple(x.shape)}")
        if dtype not in _ACTIVATION_DTYPES or x.device.type != "cpu":
            raise ValueError(f"x must be float32 or bfloat16 on the CPU, got {dtype} {x.device}")
        rows = (x.detach() if x.requires_grad else x).reshape(-1, self.in_features)
        offered = _int8_offered.get()
        paths = self._paths.get((dtype, offered))
        if paths is None:
            self.plan(dtype, offered)
            paths = self._paths[dtype, offered]
        m = rows.shape[0]
        path = next(path for start, path in paths if m >= start)
        out = path(rows, bias)
        if out.dtype != dtype:
            out = out.to(dtype)
        return out.view(*x.shape[:-1], self.out_features)

    def plan(self, dtype: torch.dtype = torch.float32, int8_offered: bool = False) -> Plan:
        """From which row count of `dtype` each path takes `linear`'s products, with the one-int8
        kernel offered or not (measured once per format, shape, dtype and offer in this
        process)."""
        self.pack()
        offered = int8_offered and self.packed
        key = (self.fmt, self.out_features, self.in_features, dtype, self.packed, offered)
        found = _plans.get(key)
        if found is None:
            # The whole weight, not a slice: the dense path writes and reads back the dequantized
            # weight, which stays in cache for a slice but not for a large lm_head.
            found = _plans[key] = _measure_plan(self, dtype, offered)
        bound = tuple((start, getattr(self, path)) for start, path in reversed(found))
        self._paths[dtype, int8_offered] = bound
        return found

    def stack_rows(self, dtype: torch.dtype, int8_offered: bool) -> tuple[int | None, Windows]:
        """For a decode stack that runs the few-row and one-int8 kernels alone
        (`model_executor/cpu_decode.py`): from which row count of `dtype` the plan takes the
        one-int8 kernel (activations rounded to one int8; None: never), and the windows of row
        counts [start, end) where the stack, taking the few-row kernel below that count and the
        one-int8 kernel from it, takes the path the plan gives (`sys.maxsize`: no end)."""
        plan = self.plan(dtype, int8_offered)
        one_int8_from = next((start for start, path in plan if path == ONE_INT8), None)
        windows: list[tuple[int, int]] = []
        ends = [start for start, _ in plan[1:]] + [sys.maxsize]
        for (start, path), end in zip(plan, ends, strict=True):
            stacked = KERNEL if one_int8_from is None or start < one_int8_from else ONE_INT8
            if path != stacked:
                continue
            if windows and windows[-1][1] == start:
                start = windows.pop()[0]
            windows.append((start, end))
        return one_int8_from, tuple(windows)

    def _kernel(self, rows: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The product on the tiles (in the rows' dtype) or the blocks (in float32)."""
        if self._packed is not None or self.pack():
            return self._on_tiles(rows, bias, int8_activations=False)
        n, k, m = self.out_features, self.in_features, rows.shape[0]
        out = torch.empty(m, n)
        if m:
            inputs = rows.to(torch.float32).contiguous().numpy()
            _rust.quant_linear(self.fmt, inputs, m, self._held, n, k, _bias(bias), out.numpy())
        return out

    def _one_int8(self, rows: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The product on the tiles with activations rounded to one int8 per value (in the
        rows' dtype); only for a packed weight."""
        if self._packed is None:
            raise ValueError(f"{self!r} is not packed: the one-int8 kernel runs on tiles")
        return self._on_tiles(rows, bias, int8_activations=True)

    def _on_tiles(
        self, rows: torch.Tensor, bias: torch.Tensor | None, int8_activations: bool
    ) -> torch.Tensor:
        n, k, m = self.out_features, self.in_features, rows.shape[0]
        out = torch.empty(m, n, dtype=rows.dtype)
        if m:
            _rust.quant_packed_linear(
                self.fmt,
                numpy_view(rows.contiguous()),
                m,
                self._held,
                n,
                k,
                _bias(bias),
                numpy_view(out),
                int8_activations,
            )
        return out

    def _dense(self, rows: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The product through the dequantized weight and PyTorch's matmul."""
        dtype = rows.dtype
        weight = self.dequantize(dtype)
        return F.linear(rows, weight, None if bias is None else bias.detach().to(dtype))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight as a dense [out_features, in_features] tensor of `dtype`: from tiles, the
        transposed view of a [in_features, out_features] one (the layout the tiles decode to
        fastest, and one a matrix multiply reads as well)."""
        if self._packed is None:
            return self._decode(None, dtype).view(self.out_features, self.in_features)
        reduced = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
        out = torch.empty(self.in_features, self.out_features, dtype=reduced)
        _rust.quant_packed_dequantize_transposed(
            self.fmt, self._held, self.out_features, self.in_features, numpy_view(out)
        )
        return out.to(dtype).t()

    def rows(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Rows `ids` of the weight (an embedding lookup): [*ids.shape, in_features]."""
        flat = ids.reshape(-1)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.out_features):
            raise ValueError(f"ids must lie in [0, {self.out_features})")
        index = flat.to(torch.int32).contiguous().numpy()
        return self._decode(index, dtype).view(*ids.shape, self.in_features)

    def _decode(self, index: np.ndarray | None, dtype: torch.dtype) -> torch.Tensor:
        """Rows `index` (all when None) of the weight, float32 or bfloat16 as `dtype` asks,
        converted to `dtype`."""
        count = self.out_features if index is None else len(index)
        reduced = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
        out = torch.empty(count, self.in_features, dtype=reduced)
        n, k = self.out_features, self.in_features
        # Whichever form is held: an embedding that is no linear layer's weight is never
        # packed (lookups decode blocks as fast as tiles).
        if self._packed is not None:
            _rust.quant_packed_dequantize(self.fmt, self._held, n, k, numpy_view(out), index)
        else:
            _rust.quant_dequantize(self.fmt, self._held, n, k, numpy_view(out), index)
        return out.to(dtype)

    def _unpacked_blocks(self) -> torch.Tensor:
        if self.blocks is None:
            raise ValueError(f"{self!r} is packed: select or concatenate before its first use")
        return self.blocks

    def select_rows(self, start: int, end: int) -> QuantizedWeight:
        """Output rows `start:end` (a view of the same blocks), e.g. one shard of a layer."""
        if not 0 <= start < end <= self.out_features:
            raise ValueError(f"rows {start}:{end} are not a non-empty range of {self.out_features}")
        return QuantizedWeight(self._unpacked_blocks()[start:end], self.fmt, self.in_features)

    def select_columns(self, start: int, end: int) -> QuantizedWeight:
        """Input columns `start:end` (a copy), e.g. one rank's shard of a row-parallel layer.
        Blocks run along a row, 32 columns each (a K-quant's 256): both ends must be multiples
        of that."""
        width, block_bytes = block_shape(self.fmt)
        if not 0 <= start < end <= self.in_features or start % width or end % width:
            raise ValueError(
                f"columns {start}:{end} of {self.in_features} are not a non-empty range whose "
                f"ends are multiples of {width} (one block)"
            )
        first, last = start // width * block_bytes, end // width * block_bytes
        blocks = self._unpacked_blocks()[:, first:last]
        return QuantizedWeight(blocks.contiguous(), self.fmt, end - start)

    @staticmethod
    def zeros(rows: int, fmt: str, in_features: int) -> QuantizedWeight:
        """`rows` rows of zero blocks (a zero scale: every weight dequantizes to 0), which pad a
        rank's shard of a vocabulary to its full share."""
        width, block_bytes = block_shape(fmt)
        row_bytes = in_features // width * block_bytes
        return QuantizedWeight(torch.zeros(rows, row_bytes, dtype=torch.uint8), fmt, in_features)

    @staticmethod
    def cat(weights: list[QuantizedWeight]) -> QuantizedWeight:
        """The weights stacked along output rows (e.g. q, k and v into one qkv projection)."""
        if not weights:
            raise ValueError("cat needs at least one weight")
        fmt, in_features = weights[0].fmt, weights[0].in_features
        if any(w.fmt != fmt or w.in_features != in_features for w in weights):
            raise ValueError("cat needs weights of one format and one in_features")
        # numpy's: torch.cat of uint8 rows ran 10 to 20 times slower (SmolLM2's 60 fused
        # weights: 0.4 to 1 s of a start on 2 cores).
        blocks = np.concatenate([w._unpacked_blocks().numpy() for w in weights])
        return QuantizedWeight(torch.from_numpy(blocks), fmt, in_features)


def _probe(
    weight: QuantizedWeight,
    rows: int,
    dtype: torch.dtype,
    int8_offered: bool,
    generator: torch.Generator,
) -> dict[str, float]:
    """Seconds per call of every path the weight offers at `rows` rows of `dtype` (the one-int8
    kernel only where offered, on tiles, from `INT8_ACTIVATION_MIN_ROWS` rows): the best of
    `_PROBE_REPEATS` timings each, taken alternately so that a burst of load elsewhere hits
    all of them."""
    x = torch.randn(rows, weight.in_features, generator=generator).to(dtype)
    one_int8 = int8_offered and weight.packed and rows >= INT8_ACTIVATION_MIN_ROWS
    names = (KERNEL, ONE_INT8, DENSE) if one_int8 else (KERNEL, DENSE)
    paths = {name: functools.partial(getattr(weight, name), x, None) for name in names}
    best = dict.fromkeys(names, float("inf"))
    for path in paths.values():
        path()
    for _ in range(_PROBE_REPEATS):
        for name, path in paths.items():
            start = time.perf_counter()
            path()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def _plan_from(timings: list[dict[str, float]]) -> Plan:
    """The plan from the timings at each of `_PROBE_ROWS`: a path takes over from a probe where
    it is fastest there and at the next probe too (one win alone is taken for noise; at the last
    probe one win counts). Past the last probe, the few-row kernel gives way to the faster of
    the many-row paths there."""
    winners = [min(timing, key=timing.__getitem__) for timing in timings]
    plan: list[tuple[int, str]] = [(0, KERNEL)]
    for i, (rows, winner) in enumerate(zip(_PROBE_ROWS, winners, strict=True)):
        confirmed = i + 1 == len(winners) or winners[i + 1] == winner
        if winner != plan[-1][1] and confirmed:
            plan.append((rows, winner))
    if plan[-1][1] == KERNEL:
        last = {name: t for name, t in timings[-1].items() if name != KERNEL}
        plan.append((2 * _PROBE_ROWS[-1], min(last, key=last.__getitem__)))
    return tuple(plan)


def _measure_plan(weight: QuantizedWeight, dtype: torch.dtype, int8_offered: bool) -> Plan:
    """The plan measured on this machine (see `_plan_from`): at an earlier start, read from
    the plan cache, or now, and then kept there."""
    key = {
        "fmt": weight.fmt,
        "shape": [weight.out_features, weight.in_features],
        "dtype": str(dtype),
        "packed": weight.packed,
        "int8_offered": int8_offered,
        "probe_rows": list(_PROBE_ROWS),
        "int8_min_rows": INT8_ACTIVATION_MIN_ROWS,
    }
    plan = plan_cache.load(key, functools.partial(_parse_plan, int8_offered=int8_offered))
    if plan is not None:
        plan_sources["read"] += 1
        return plan
    generator = torch.Generator().manual_seed(0)
    timings = [_probe(weight, rows, dtype, int8_offered, generator) for rows in _PROBE_ROWS]
    plan = _plan_from(timings)
    plan_sources["measured"] += 1
    plan_cache.store(key, [list(step) for step in plan])
    return plan


def _parse_plan(kept: Any, int8_offered: bool) -> Plan:
    """A plan as the plan cache keeps it (JSON: [[fewest rows, path], ...]), checked as
    `_plan_from` makes them: from (0, KERNEL), rows rising, known paths, each unlike the one
    before, the one-int8 kernel only where offered. ValueError where it is not one."""
    plan = tuple((int(rows), str(path)) for rows, path in kept)
    paths = {KERNEL, ONE_INT8, DENSE} if int8_offered else {KERNEL, DENSE}
    if not plan or plan[0] != (0, KERNEL):
        raise ValueError("a plan starts with the few-row kernel at 0 rows")
    for (rows, path), (before, previous) in zip(plan[1:], plan, strict=False):
        if path not in paths or path == previous or rows <= before:
            raise ValueError(f"{plan} is not a plan")
    return plan


def _bias(bias: torch.Tensor | None) -> np.ndarray | None:
    """A bias as the kernels read it: float32, contiguous (numpy)."""
    return None if bias is None else bias.detach().to(torch.float32).contiguous().numpy()
