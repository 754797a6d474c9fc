"""Strided rows read in place on the CPU: the rotation of q and the KV store of k, as the
attention layers call them on views into the fused qkv projection's output.

    python benches/bench_kv_store_rotary.py [--json OUT] [--tokens 1 8 2048] [--threads 1]
        [--repeats 200]

SmolLM2-135M's shapes (9 query and 3 K/V heads of 64: rows of q 576 and of k 192 elements,
960 apart), bf16. Per token count, each timed warm as the best of `--repeats` calls:
`rotary_q` srt's kernel on the strided view (`srt_us`), on a contiguous copy made first as the
wrapper did before it took strides (`copy_us`, the copy included), and PyTorch's formula
(`torch_us`); `store_k` srt's row scatter (`srt_us`) and `index_copy_` (`torch_us`) of k into
a pool of `max(tokens) + 1` slots at shuffled slots.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from bench_utils import emit

from srt.kernels.cpu import cpu_kernels
from srt.mem_cache.row_scatter import RowScatter
from srt.timing import best_of

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def torch_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    swapped = x.unflatten(-1, (2, HEAD_DIM // 2)).flip(-2).flatten(-2)
    return x * cos + swapped * sin


def run(tokens: int, slots: int, repeats: int) -> dict[str, dict[str, float]]:
    bf16 = torch.bfloat16
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=bf16)
    q, k, _ = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    q, k = q.view(tokens, HEADS, HEAD_DIM), k.view(tokens, KV_HEADS, HEAD_DIM)
    cos = torch.randn(tokens, 1, HEAD_DIM, dtype=bf16)
    sin = torch.randn(tokens, 1, HEAD_DIM, dtype=bf16)
    buffer = torch.zeros(slots + 1, KV_HEADS, HEAD_DIM, dtype=bf16)
    where = torch.randperm(slots)[:tokens] + 1
    scatter = RowScatter(buffer)
    rotary = {
        "srt_us": best_of(lambda: cpu_kernels.rotary(q, cos, sin), repeats),
        "copy_us": best_of(lambda: cpu_kernels.rotary(q.contiguous(), cos, sin), repeats),
        "torch_us": best_of(lambda: torch_rotary(q, cos, sin), repeats),
    }
    store = {
        "srt_us": best_of(lambda: scatter(where, k), repeats),
        "torch_us": best_of(lambda: buffer.index_copy_(0, where, k), repeats),
    }
    for row in (rotary, store):
        for name in list(row):
            row[name] *= 1e6
    store["srt_gb_s"] = k.numel() * k.element_size() / store["srt_us"] / 1e3
    store["torch_gb_s"] = k.numel() * k.element_size() / store["torch_us"] / 1e3
    return {"rotary_q": rotary, "store_k": store}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 2048])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    isa, best = cpu_kernels.isa()
    results: dict[str, Any] = {"isa": isa, "best_isa": best, "threads": args.threads}
    with torch.inference_mode():
        results["tokens"] = {n: run(n, max(args.tokens), args.repeats) for n in args.tokens}
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
