"""Step time of one static batch at tensor-parallel degree 1 and N (`--tp`), and whether TP=N
computes TP=1's logits: a correctness run with a clock, not a speed claim.

    python benches/scale_tp.py [--model PATH] [--tp 2] [--device cpu|cuda] [--batch-size 8]
        [--input-len 64] [--output-len 16] [--repeats 3] [--json OUT]

Each degree runs in its own spawned processes (one per rank, joined by gloo on the CPU, NCCL on
CUDA), as `srt-serve --tp-size` runs them; on the CPU the ranks split the cores this process may
use (`cpu_threads.share_of`), so TP=1 and TP=N use the same cores. A run is a prefill of
`batch-size` random prompts of `input-len` tokens, then `output-len` decode steps; each degree
reports its best prefill time and its best median decode-step time over `--repeats` runs, and
`max_abs_logit_diff` is the largest difference between TP=N's and TP=1's logits over every step
(nonzero exit past `--atol`). Without `--model`, a random-weight Llama with 8 query heads and 2
KV heads (make_tiny_model's `tiny-hd64`) is written to a temporary directory. The model's heads
must split over the ranks (SmolLM2-135M's 9 do not split over 2).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from bench_utils import emit

from srt.distributed import init_tensor_parallel
from srt.model_executor.cpu_threads import share_of
from srt.model_executor.model_runner import ModelRunner
from srt.server_args import ServerArgs
from srt.testing.make_tiny_model import make_tiny_model


def run_rank(rank: int, size: int, addr: str, opts: argparse.Namespace, out: Path) -> None:
    """One rank: its shard of the model, `opts.repeats` timed runs; rank 0 saves the result."""
    if opts.device == "cpu":
        cores = share_of(sorted(os.sched_getaffinity(0)), rank, size)
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(len(cores))
    if size > 1:
        init_tensor_parallel(rank, size, addr, opts.device, local_rank=rank)
    args = ServerArgs(
        device=opts.device,
        dtype="float32",
        max_total_tokens=opts.batch_size * (opts.input_len + opts.output_len) + 1,
        max_running_requests=opts.batch_size,
        attention_backend="cpu",
        disable_cuda_graph=True,
    )
    runner = ModelRunner(args, opts.model)
    generator = torch.Generator().manual_seed(0)
    vocab = runner.model_config.vocab_size
    prompts = torch.randint(3, vocab, (opts.batch_size, opts.input_len), generator=generator)
    prefills: list[float] = []
    decodes: list[float] = []
    logits: list[torch.Tensor] = []
    for _ in range(opts.repeats):
        prefill, steps, logits = one_run(runner, prompts.tolist(), opts.output_len)
        prefills.append(prefill)
        decodes.append(statistics.median(steps))
    if rank == 0:
        result = {"prefill_s": min(prefills), "decode_step_s": min(decodes)}
        torch.save({"result": result, "logits": logits}, out)
    if size > 1:  # leave together, past the group's destructors (they may abort without a peer)
        torch.distributed.barrier()
        sys.stdout.flush()
        os._exit(0)


def one_run(
    runner: ModelRunner, prompts: list[list[int]], output_len: int
) -> tuple[float, list[float], list[torch.Tensor]]:
    """Prefill then greedy decode steps in fresh slots; (prefill s, step s, every logit row)."""
    batch, input_len = len(prompts), len(prompts[0])
    rows = list(range(batch))
    slots = iter(range(1, runner.max_total_tokens + 1))
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else lambda: None
    start = time.perf_counter()
    forward = runner.prepare_extend(
        rows, [0] * batch, prompts, [next(slots) for _ in range(batch * input_len)]
    )
    logits = [runner.forward(forward)]
    sync()
    prefill = time.perf_counter() - start
    seq_lens, steps = [input_len] * batch, []
    for _ in range(output_len):
        seq_lens = [n + 1 for n in seq_lens]
        next_ids = logits[-1].argmax(dim=-1).tolist()
        start = time.perf_counter()
        forward = runner.prepare_decode(rows, seq_lens, next_ids, [next(slots) for _ in rows])
        logits.append(runner.forward(forward))
        sync()
        steps.append(time.perf_counter() - start)
    return prefill, steps, [row.cpu() for row in logits]


def measure(size: int, opts: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Runs `size` ranks to completion; rank 0's timings and logits."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    out = out_dir / f"tp{size}.pt"
    spawn = mp.get_context("spawn")
    ranks = [
        spawn.Process(target=run_rank, args=(rank, size, addr, opts, out)) for rank in range(size)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()
    codes = [p.exitcode for p in ranks]
    if codes != [0] * size:
        raise SystemExit(f"TP={size}: ranks exited with {codes}")
    saved: dict[str, Any] = torch.load(out)
    return saved


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--atol", type=float, default=1e-3)
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


def compare(opts: argparse.Namespace) -> dict[str, Any]:
    """TP=1 and TP=`opts.tp` measured one after the other, their step times and logits
    compared (on a tiny random Llama unless `opts.model`)."""
    with tempfile.TemporaryDirectory(prefix="srt-scale-tp-") as tmp:
        model = opts.model or str(make_tiny_model("llama", Path(tmp) / "model", preset="tiny-hd64"))
        run_opts = argparse.Namespace(**{**vars(opts), "model": model})
        one = measure(1, run_opts, Path(tmp))
        many = measure(opts.tp, run_opts, Path(tmp))
    diff = max(
        float((a - b).abs().max()) for a, b in zip(many["logits"], one["logits"], strict=True)
    )
    return {
        "bench": "scale_tp",
        "model": opts.model or "tiny-hd64 llama (random)",
        "device": opts.device,
        "batch_size": opts.batch_size,
        "input_len": opts.input_len,
        "output_len": opts.output_len,
        "tp1": one["result"],
        f"tp{opts.tp}": many["result"],
        "decode_step_ratio_tp1_over_tpN": one["result"]["decode_step_s"]
        / many["result"]["decode_step_s"],
        "prefill_ratio_tp1_over_tpN": one["result"]["prefill_s"] / many["result"]["prefill_s"],
        "max_abs_logit_diff": diff,
    }


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    results = compare(opts)
    emit(results, opts.json)
    diff = results["max_abs_logit_diff"]
    if diff > opts.atol:
        print(f"TP={opts.tp} logits differ from TP=1's by {diff} > {opts.atol}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
