"""The linear layers of a decode or prefill step, per kernel: srt's own float32 `Linear` beside
PyTorch's `F.linear` in float32 (MKL) and bfloat16 (oneDNN), on SmolLM2-135M's shapes.

    python benches/bench_linear.py [--rows 1 16 2048] [--json OUT]

Each shape runs with its weight warm in cache (the best of `--repeats` timings of `--calls`
calls), so the figures are each kernel's compute rate, not the memory-bound rate of a real step
that streams every layer's weights. Which kernel wins differs between CPUs (AVX2, AVX-512,
AVX-512 BF16, AMX): the ratios `bf16_vs_srt_fp32` and `srt_vs_torch_fp32` say which to pick on
the machine in the JSON's `machine` record.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from bench_utils import emit

from srt.layers.linear import Linear

# SmolLM2-135M: hidden 576, intermediate 1536, vocabulary 49152 (in, out features).
SHAPES = {
    "qkv": (576, 960),
    "o_proj": (576, 576),
    "gate_up": (576, 3072),
    "down": (1536, 576),
    "lm_head": (576, 49152),
}


def best_seconds(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    """The best time per call over `repeats` runs of `calls` calls, after a warm-up."""
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def bench_shape(rows: int, k: int, n: int, calls: int, repeats: int) -> dict[str, float]:
    """GFLOP/s of each kernel on `rows` by `k` inputs and an `n` by `k` weight."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(n, k, generator=generator)
    x = torch.randn(rows, k, generator=generator)
    layer = Linear(k, n, bias=False)
    layer.weight.data.copy_(weight)
    layer.prepare_for_device()  # packs the weight for srt's kernel, as model loading does
    weight_bf16, x_bf16 = weight.bfloat16(), x.bfloat16()
    kernels: dict[str, Callable[[], Any]] = {
        "srt_fp32": lambda: layer(x),
        "torch_fp32": lambda: F.linear(x, weight),
        "torch_bf16": lambda: F.linear(x_bf16, weight_bf16),
    }
    flops = 2 * rows * k * n
    with torch.inference_mode():
        return {
            f"{name}_GFLOPs": round(flops / best_seconds(fn, calls, repeats) / 1e9, 1)
            for name, fn in kernels.items()
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 2048])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {"torch_threads": torch.get_num_threads(), "shapes": {}}
    for rows in args.rows:
        for name, (k, n) in SHAPES.items():
            rates = bench_shape(rows, k, n, args.calls, args.repeats)
            rates["bf16_vs_srt_fp32"] = round(
                rates["torch_bf16_GFLOPs"] / rates["srt_fp32_GFLOPs"], 2
            )
            rates["srt_vs_torch_fp32"] = round(
                rates["srt_fp32_GFLOPs"] / rates["torch_fp32_GFLOPs"], 2
            )
            results["shapes"][f"{rows}x{k}x{n} {name}"] = rates
    emit(results, args.json)


if __name__ == "__main__":
    main()
