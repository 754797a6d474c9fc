"""Linear layers on GGUF blocks (`srt.kernels.cpu.quant_kernels.QuantizedWeight`) beside PyTorch's
`F.linear` in float32 and bfloat16 on the dequantized weight, on SmolLM2-135M's shapes.

    python benches/bench_quant_linear.py [--rows 1 4 16 64 2048] [--threads N] [--json OUT]
    python benches/bench_quant_linear.py --shapes qkv o_proj gate_up down --rows 256 1024 4096 \
        --kernel-max-rows 4096   # prefill: GOP/s of every path
    python benches/bench_quant_linear.py --format q5_0   # every shape in another GGUF format

Weights are read cold, as in a decode step that streams every layer: each kernel cycles over
enough copies of its weight to pass `--working-set` bytes, more than the last level cache. For
few rows the figure that matters is `quant_weight_GBps`, the bytes of blocks a call reads over
its time, beside `copy_GBps` (a large tensor copy, read plus written, measured in the same run):
decode is bound by it. `quant_linear` is the path the class picks (the in-register kernel below
its measured crossover, a dequantize-and-matmul at or above it); `quant_kernel` forces the
kernel (up to 256 rows, beyond which it is far slower than a matmul): the integer kernel on
repacked tiles where the CPU has AVX2 or AVX-512 VNNI (`quant_packed_kernel` in the JSON), else
the portable float kernel on the blocks (`SRT_CPU_ISA=scalar` forces it for comparison,
`SRT_CPU_ISA=avx2` the AVX2 integer kernel). `--format` quantizes every shape to another of the
formats srt keeps in blocks (llama.cpp's Q4_K_M holds SmolLM2's 576-wide rows in Q5_0, its down
in Q4_K or Q6_K; a K-quant needs rows of whole super-blocks of 256, so only `down` takes one).

For many rows (prefill) the figures are `*_GOPs` (2·m·n·k over the time): `quant_one_int8_bf16`,
the one-int8 kernel (activations rounded to one int8 per value) on bfloat16 activations
as the model passes them, beside `torch_bf16` (PyTorch's matmul on a dequantized bf16 weight
kept in memory), `quant_dense_bf16` (the class's dense path: dequantize for the call, then that
matmul) and `quant_kernel` (the few-row kernel, activations split into two int8 parts). `plan`
is the path the class measured for each row count in a prefill pass (float32 and bfloat16
activations; the one-int8 kernel joins it from `INT8_ACTIVATION_MIN_ROWS` rows, as in the
server, unless `--disable-int8-activations`), and `quant_linear` times the path it gives.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from bench_utils import emit
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from roofline import copy_bandwidth

from srt.kernels.cpu import cpu_kernels
from srt.kernels.cpu.quant_kernels import (
    FORMATS,
    INT8_ACTIVATION_MIN_ROWS,
    SUPER_BLOCK_BYTES,
    SUPER_BLOCK_SIZE,
    QuantizedWeight,
    int8_activations,
)
from srt.testing import gguf_kquants

# SmolLM2-135M-Instruct's GGUF: (in, out, format) per projection; the tied lm_head is Q8_0 in
# the file, and Q4_1 for comparison.
SHAPES = {
    "qkv": (576, 960, "q4_1"),
    "o_proj": (576, 576, "q4_1"),
    "gate_up": (576, 3072, "q4_1"),
    "down": (1536, 576, "q4_1"),
    "lm_head_q8_0": (576, 49152, "q8_0"),
    "lm_head_q4_1": (576, 49152, "q4_1"),
}
KERNEL_MAX_ROWS = 256


def best_seconds(fns: list[Callable[[], Any]], repeats: int) -> float:
    """The best time per call over `repeats` passes over `fns` (one call each), after one
    warm-up pass; each pass lasts at least 50 ms."""
    for fn in fns:
        fn()
    start = time.perf_counter()
    fns[0]()
    calls = max(len(fns), int(0.05 / max(time.perf_counter() - start, 1e-7)))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(calls):
            fns[i % len(fns)]()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def copies(nbytes: int, working_set: int) -> int:
    return max(2, -(-working_set // nbytes))


def bench_shape(
    k: int,
    n: int,
    fmt: str,
    rows_list: list[int],
    working_set: int,
    repeats: int,
    kernel_max_rows: int,
    int8_offered: bool,
) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    dense = (rng.standard_normal((n, k), dtype=np.float32) * 0.05).astype(np.float32)
    encode = gguf_kquants.quantize if fmt in SUPER_BLOCK_BYTES else quantize
    blocks = torch.from_numpy(encode(dense, GGMLQuantizationType[fmt.upper()]))
    del dense
    first = QuantizedWeight(blocks, fmt, k)
    count = copies(first.nbytes, working_set)
    quant = [first] + [QuantizedWeight(blocks.clone(), fmt, k) for _ in range(count - 1)]
    for weight in quant:
        weight.pack()  # as a loaded model's are (where the CPU has the integer kernel)
    w32 = first.dequantize()
    fp32 = [w32] + [w32.clone() for _ in range(copies(w32.numel() * 4, working_set) - 1)]
    w16 = first.dequantize(torch.bfloat16)
    bf16 = [w16] + [w16.clone() for _ in range(copies(w16.numel() * 2, working_set) - 1)]
    result: dict[str, Any] = {"format": fmt, "weight_bytes": first.nbytes}
    result["plan"] = {
        str(dtype): first.plan(dtype, int8_offered) for dtype in (torch.float32, torch.bfloat16)
    }
    for rows in rows_list:
        x = torch.randn(rows, k)
        x16 = x.bfloat16()
        times = {
            "quant_linear": best_seconds([partial(w.linear, x) for w in quant], repeats),
            "torch_fp32": best_seconds([partial(F.linear, x, w) for w in fp32], repeats),
            "torch_bf16": best_seconds([partial(F.linear, x16, w) for w in bf16], repeats),
        }
        if rows <= kernel_max_rows:
            times["quant_kernel"] = best_seconds(
                [partial(w._kernel, x, None) for w in quant], repeats
            )
        if first.packed:
            times["quant_one_int8_bf16"] = best_seconds(
                [partial(w._one_int8, x16, None) for w in quant], repeats
            )
            times["quant_dense_bf16"] = best_seconds(
                [partial(w._dense, x16, None) for w in quant], repeats
            )
        entry: dict[str, Any] = {f"{name}_us": round(t * 1e6, 1) for name, t in times.items()}
        entry.update(
            {f"{name}_GOPs": round(2 * rows * n * k / t / 1e9, 1) for name, t in times.items()}
        )
        entry["quant_weight_GBps"] = round(first.nbytes / times["quant_linear"] / 1e9, 1)
        entry["fp32_weight_GBps"] = round(w32.numel() * 4 / times["torch_fp32"] / 1e9, 1)
        entry["fp32_vs_quant"] = round(times["torch_fp32"] / times["quant_linear"], 2)
        entry["bf16_vs_quant"] = round(times["torch_bf16"] / times["quant_linear"], 2)
        result[f"rows_{rows}"] = entry
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 2048])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--format", choices=sorted(FORMATS), help="every shape in this format")
    parser.add_argument("--working-set", type=int, default=256 << 20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--kernel-max-rows",
        type=int,
        default=KERNEL_MAX_ROWS,
        help="time the few-row kernel alone up to this many rows",
    )
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument(
        "--disable-int8-activations",
        action="store_true",
        help="as srt-serve's flag: no product rounds its activations to int8",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.format in SUPER_BLOCK_BYTES:
        narrow = [s for s in args.shapes if SHAPES[s][0] % SUPER_BLOCK_SIZE]
        if narrow:
            parser.error(f"{args.format} needs rows of whole super-blocks of 256: not {narrow}")
    int8_offered = not args.disable_int8_activations
    if args.threads:
        torch.set_num_threads(args.threads)
    results: dict[str, Any] = {
        "quant_packed_kernel": cpu_kernels.quant_packed_kernel(),
        "torch_threads": torch.get_num_threads(),
        "int8_activations_from_rows": int8_offered and INT8_ACTIVATION_MIN_ROWS,
        "copy_GBps": round(copy_bandwidth(torch.device("cpu")) / 1e9, 1),
        "shapes": {},
    }
    with torch.inference_mode(), int8_activations(int8_offered):
        for name in args.shapes:
            k, n, fmt = SHAPES[name]
            fmt = args.format or fmt
            results["shapes"][f"{name} {k}->{n}"] = bench_shape(
                k,
                n,
                fmt,
                args.rows,
                args.working_set,
                args.repeats,
                args.kernel_max_rows,
                int8_offered,
            )
            print(name, results["shapes"][f"{name} {k}->{n}"], file=sys.stderr, flush=True)
    emit(results, args.json)


if __name__ == "__main__":
    main()
