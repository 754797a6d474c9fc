"""One layer's extend (prefill) attention on the CPU: srt's route against plain SDPA.

    python benches/bench_extend_attention.py [--json OUT] [--lengths 256 1024 2048]
        [--prefix-cases 1024:1024 2047:1] [--dtypes bfloat16 float32] [--threads N] [--repeats 5]

SmolLM2-135M's shapes (9 query and 3 K/V heads of 64). Per dtype and case, one sequence of
`new` tokens after `prefix` cached ones: `sdpa_ms` is the route srt took before extend_cpu.py
(SDPA with `is_causal` and `enable_gqa` without a prefix; with one, SDPA over the prefix and
the new tokens with an additive float mask, built outside the timing as the backend built it
once per forward pass), `srt_ms` is `extend_attention` (srt's kernel for bf16 on AVX-512
BF16, else PyTorch's flash kernel: `SRT_CPU_ISA=avx512` times the latter), each the best of
`--repeats` warm calls. `gflops` counts the multiply-adds of the unmasked scores and weighted
sums (2 per multiply-add). Under `--threads 1` every kernel runs on the calling thread, and the
times are that thread's CPU time: on a machine shared with other work, what the kernels cost
rather than how long they waited to be scheduled.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from bench_utils import emit

from srt.kernels.cpu import cpu_kernels
from srt.layers.attention.extend_cpu import extend_attention
from srt.timing import best_of

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
SCALE = HEAD_DIM**-0.5


def prefix_mask(new: int, prefix: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The former route's additive mask: new token i sees keys up to prefix + i."""
    if not prefix:
        return None
    total = prefix + new
    mask = torch.zeros((new, total), dtype=dtype)
    query_pos = torch.arange(prefix, total)[:, None]
    return mask.masked_fill_(torch.arange(total)[None, :] > query_pos, float("-inf"))


def sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """The former route: q [new, heads, d] over k, v [prefix + new, kv_heads, d]."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=mask,
        is_causal=mask is None,
        scale=SCALE,
        enable_gqa=True,
    )
    return out.transpose(0, 1)


def run_case(dtype: torch.dtype, prefix: int, new: int, repeats: int) -> dict[str, float]:
    q = torch.randn(new, HEADS, HEAD_DIM, dtype=dtype)
    k = torch.randn(prefix + new, KV_HEADS, HEAD_DIM, dtype=dtype)
    v = torch.randn(prefix + new, KV_HEADS, HEAD_DIM, dtype=dtype)
    # One thread: its CPU time, which other processes on the machine do not inflate.
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    srt_s = best_of(lambda: extend_attention(q, k, v, prefix, SCALE), repeats, clock)
    mask = prefix_mask(new, prefix, dtype)
    sdpa_s = best_of(lambda: sdpa(q, k, v, mask), repeats, clock)
    pairs = new * prefix + new * (new + 1) // 2  # (query, key) pairs attended
    flops = 4 * pairs * HEADS * HEAD_DIM
    return {
        "srt_ms": srt_s * 1e3,
        "sdpa_ms": sdpa_s * 1e3,
        "speedup": sdpa_s / srt_s,
        "srt_gflops": flops / srt_s / 1e9,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--prefix-cases", nargs="+", default=["1024:1024", "2047:1"])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cases = [(0, n) for n in args.lengths]
    cases += [(int(p), int(n)) for p, n in (c.split(":") for c in args.prefix_cases)]
    isa, _ = cpu_kernels.isa()
    results: dict[str, Any] = {"threads": args.threads, "isa": isa, "cases": {}}
    with torch.inference_mode():
        for name in args.dtypes:
            dtype = getattr(torch, name)
            for prefix, new in cases:
                key = f"{name} prefix={prefix} new={new}"
                results["cases"][key] = run_case(dtype, prefix, new, args.repeats)
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
