"""The bf16 CPU kernels of a decode step against the PyTorch bf16 operators they replace.

    python benches/bench_cpu_ops_bf16.py [--json OUT] [--batch-sizes 1 32] [--context 256]
        [--threads 1] [--repeats 200]

SmolLM2-135M's shapes (hidden 576, 9 query and 3 K/V heads of 64, MLP 1536): per batch size, one
call of each kernel as a decode step makes it (RMSNorm with the residual add, gated SiLU, the
rotation of q and k, and decode attention over `--context` cached tokens per sequence, read in
place by srt's kernel and gathered for SDPA by PyTorch's path), each timed warm as the best of
`--repeats` calls. `speedup` is PyTorch's time over srt's. Under `--threads 1` the numbers show
the kernels' own cost, not how a busy machine schedules OpenMP teams.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from bench_utils import emit

from srt.kernels.cpu import cpu_kernels
from srt.timing import best_of

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP = 576, 9, 3, 64, 1536


def torch_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    residual.add_(x)
    wide = residual.float()
    wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-5)
    return weight * wide.to(x.dtype)


def torch_silu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def torch_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    swapped = x.unflatten(-1, (2, HEAD_DIM // 2)).flip(-2).flatten(-2)
    return x * cos + swapped * sin


def cases(batch: int, context: int) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """Name -> (srt's kernel, PyTorch's path) on fresh bf16 inputs of a decode step."""
    bf16 = torch.bfloat16
    x = torch.randn(batch, HIDDEN, dtype=bf16)
    residual = torch.randn(batch, HIDDEN, dtype=bf16)
    weight = torch.rand(HIDDEN, dtype=bf16) + 0.5
    gate_up = torch.randn(batch, 2 * MLP, dtype=bf16)
    q = torch.randn(batch, HEADS, HEAD_DIM, dtype=bf16)
    cos = torch.randn(batch, 1, HEAD_DIM, dtype=bf16)
    sin = torch.randn(batch, 1, HEAD_DIM, dtype=bf16)
    slots = batch * context + 1
    k_cache = torch.randn(slots, KV_HEADS, HEAD_DIM, dtype=bf16)
    v_cache = torch.randn(slots, KV_HEADS, HEAD_DIM, dtype=bf16)
    rows = (torch.randperm(slots - 1)[: batch * context] + 1).view(batch, context)
    rows32, lens = rows.to(torch.int32), torch.full((batch,), context, dtype=torch.int32)
    flat = rows.flatten()
    scale = HEAD_DIM**-0.5

    def torch_attention() -> torch.Tensor:
        keys = k_cache[flat].view(batch, context, KV_HEADS, HEAD_DIM).transpose(1, 2)
        values = v_cache[flat].view(batch, context, KV_HEADS, HEAD_DIM).transpose(1, 2)
        query = q.view(batch, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
        return F.scaled_dot_product_attention(query, keys, values, scale=scale)

    return {
        "rms_norm_residual": (
            lambda: cpu_kernels.rms_norm(x, residual, weight, 1e-5),
            lambda: torch_rms_norm(x, residual, weight),
        ),
        "silu_and_mul": (lambda: cpu_kernels.silu_and_mul(gate_up), lambda: torch_silu(gate_up)),
        "rotary_q": (lambda: cpu_kernels.rotary(q, cos, sin), lambda: torch_rotary(q, cos, sin)),
        "decode_attention": (
            lambda: cpu_kernels.decode_attention(q, k_cache, v_cache, rows32, lens, scale),
            torch_attention,
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    isa, best = cpu_kernels.isa()
    results: dict[str, Any] = {"isa": isa, "best_isa": best, "context": args.context}
    batches: dict[int, dict[str, dict[str, float]]] = {}
    results["batches"] = batches
    with torch.inference_mode():
        for batch in args.batch_sizes:
            batches[batch] = row = {}
            for name, (ours, theirs) in cases(batch, args.context).items():
                srt_s, torch_s = best_of(ours, args.repeats), best_of(theirs, args.repeats)
                row[name] = {"srt_us": srt_s * 1e6, "torch_us": torch_s * 1e6}
                row[name]["speedup"] = torch_s / srt_s
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
