"""srt's decode attention as a decode step runs it: every layer's K/V caches in turn, so that
the rows stream from memory as in serving (a single layer's caches, timed again and again, stay
in the processor's caches and hide what the kernel's prefetching is worth).

    python benches/bench_decode_attention.py [--json OUT] [--batch-size 16]
        [--contexts 300 1060] [--layers 30] [--threads 2] [--repeats 5]

SmolLM2-135M's shapes (9 query and 3 K/V heads of 64), bf16 caches of `--layers` layers, each
sequence's slots contiguous and apart from the others'; a case with `shared` has the batch in
two groups whose sequences share all but their last 36 tokens (a cached system prompt). Per
case: the best step time over `--repeats`, and the K/V bytes the step reads once (shared rows
counted once) per second, beside the machine's copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from bench_utils import emit
from roofline import copy_bandwidth

from srt.kernels.cpu import cpu_kernels

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
# Tokens of each sequence that no other shares, in a shared case.
OWN = 36


def slot_rows(batch: int, context: int, shared: bool) -> torch.Tensor:
    """[batch, context] int32 slots: apart per sequence, or two groups sharing a prefix."""
    if not shared:
        return (torch.arange(batch * context).view(batch, context) + 1).to(torch.int32)
    prefix = context - OWN
    rows = [
        torch.cat(
            [
                torch.arange(prefix) + (s * 2 // batch) * prefix,
                2 * prefix + s * OWN + torch.arange(OWN),
            ]
        )
        for s in range(batch)
    ]
    return (torch.stack(rows) + 1).to(torch.int32)


def step_seconds(
    rows: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]], repeats: int
) -> float:
    batch, context = rows.shape
    q = torch.randn(batch, HEADS, HEAD_DIM).bfloat16()
    lens = torch.full((batch,), context, dtype=torch.int32)
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for k_cache, v_cache in caches:
            cpu_kernels.decode_attention(q, k_cache, v_cache, rows, lens, HEAD_DIM**-0.5)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--contexts", type=int, nargs="+", default=[300, 1060])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    slots = args.batch_size * max(args.contexts) + 1
    caches = [
        (
            torch.randn(slots, KV_HEADS, HEAD_DIM).bfloat16(),
            torch.randn(slots, KV_HEADS, HEAD_DIM).bfloat16(),
        )
        for _ in range(args.layers)
    ]
    copy = copy_bandwidth(torch.device("cpu"))
    results: dict[str, Any] = {
        "isa": cpu_kernels.isa()[0],
        "threads": args.threads,
        "layers": args.layers,
        "copy_gb_s": copy / 1e9,
        "cases": [],
    }
    row_bytes = 2 * KV_HEADS * HEAD_DIM * 2 * args.layers
    with torch.inference_mode():
        for context in args.contexts:
            for shared in (False, True) if context > OWN else (False,):
                rows = slot_rows(args.batch_size, context, shared)
                seconds = step_seconds(rows, caches, args.repeats)
                read = rows.unique().numel() * row_bytes
                results["cases"].append(
                    {
                        "batch_size": args.batch_size,
                        "context": context,
                        "shared": shared,
                        "step_ms": seconds * 1e3,
                        "kv_gb_s": read / seconds / 1e9,
                        "of_copy": read / seconds / copy,
                    }
                )
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
