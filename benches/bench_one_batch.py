"""One static batch through the model runner, beside Hugging Face transformers in the same run.

    python benches/bench_one_batch.py --model PATH --json OUT [--batch-sizes 1 8 32 64]
        [--input-len 32] [--output-len 8] [--load-format dummy]

SGLang's `bench_one_batch` shape: for each batch size, a prefill of `input-len` random tokens per
sequence, then `output-len` decode steps. transformers runs the same shapes through its forward
with a `DynamicCache` (unless `--load-format dummy`: random weights of a config's shapes, no
baseline). Each decode step is also set beside its memory-bandwidth floor: weight and KV-cache
bytes over the bandwidth a large tensor copy reaches on the device. The two alternate
`--repeats` times (a shared machine is noisy); each reports its best prefill latency and its
best median decode-step latency, and
`decode_speedup_vs_hf_bs32` = HF's decode step time over ours at batch 32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from bench_utils import emit
from transformers import AutoModelForCausalLM, DynamicCache

from srt.mem_cache.memory_pool import KVPool
from srt.model_executor.model_runner import ModelRunner
from srt.server_args import ServerArgs


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def bench_srt(runner: ModelRunner, prompts: torch.Tensor, output_len: int) -> dict[str, float]:
    batch_size, input_len = prompts.shape
    device = runner.device
    rows = runner.req_to_token_pool.alloc(batch_size)
    assert rows is not None
    next_slot = 1

    def slots(n: int) -> torch.Tensor:
        nonlocal next_slot
        taken = torch.arange(next_slot, next_slot + n, device=device)
        next_slot += n
        return taken

    try:
        batch = runner.prepare_extend(
            rows, [0] * batch_size, prompts.tolist(), slots(batch_size * input_len)
        )
        prefill_s, logits = timed(partial(runner.forward, batch), device)
        seq_lens = [input_len] * batch_size
        steps = []
        for _ in range(output_len):
            next_ids = logits.argmax(-1).tolist()
            seq_lens = [n + 1 for n in seq_lens]
            batch = runner.prepare_decode(rows, seq_lens, next_ids, slots(batch_size))
            step_s, logits = timed(partial(runner.forward, batch), device)
            steps.append(step_s)
    finally:
        runner.req_to_token_pool.free(rows)
    return {"prefill_s": prefill_s, "decode_step_s": statistics.median(steps)}


@torch.inference_mode()
def bench_hf(model: Any, prompts: torch.Tensor, output_len: int) -> dict[str, float]:
    device = prompts.device
    cache = DynamicCache()
    prefill_s, out = timed(partial(model, prompts, past_key_values=cache, use_cache=True), device)
    steps = []
    for _ in range(output_len):
        next_ids = out.logits[:, -1].argmax(-1, keepdim=True)
        step_s, out = timed(partial(model, next_ids, past_key_values=cache, use_cache=True), device)
        steps.append(step_s)
    return {"prefill_s": prefill_s, "decode_step_s": statistics.median(steps)}


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 28) -> float:
    """Bytes per second moved (read plus written) by a large tensor copy on `device`."""
    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    seconds = min(timed(partial(target.copy_, source), device)[0] for _ in range(5))
    return 2 * nbytes / seconds


def weight_bytes(runner: ModelRunner) -> int:
    return sum(p.numel() * p.element_size() for p in runner.model.parameters())


def kv_bytes_per_token(runner: ModelRunner) -> int:
    config = runner.model_config
    return KVPool.bytes_per_slot(
        config.num_layers, config.num_kv_heads, config.head_dim, config.dtype
    )


def best(runs: list[dict[str, float]]) -> dict[str, Any]:
    """The fastest of each measurement over the runs, with every run's figures beside."""
    return {
        "prefill_s": min(r["prefill_s"] for r in runs),
        "decode_step_s": min(r["decode_step_s"] for r in runs),
        "decode_step_runs_s": [r["decode_step_s"] for r in runs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--load-format", default="auto", help="dummy: random weights, no HF")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    parser.add_argument(
        "--disable-cuda-graph", action="store_true", help="decode eagerly on CUDA too"
    )
    args = parser.parse_args(argv)

    max_bs = max(args.batch_sizes)
    server_args = ServerArgs(
        device=args.device,
        dtype=args.dtype,
        max_total_tokens=max_bs * (args.input_len + args.output_len) + 1,
        max_running_requests=max_bs,
        load_format=args.load_format,
        disable_cuda_graph=args.disable_cuda_graph,
    )
    runner = ModelRunner(server_args, args.model)
    device = runner.device
    hf: Any = None
    if not args.no_hf and args.load_format != "dummy":
        hf = AutoModelForCausalLM.from_pretrained(
            runner.model_config.model_path,
            gguf_file=runner.model_config.gguf_file,
            dtype=runner.model_config.dtype,
            device_map=str(device),
        )
        hf.eval()

    generator = torch.Generator().manual_seed(0)
    results: dict[str, Any] = {
        "model": args.model,
        "device": str(device),
        "dtype": str(runner.model_config.dtype),
        "torch_threads": torch.get_num_threads(),
        "cuda_graph": runner.cuda_graph_runner is not None,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "copy_bandwidth_GBps": copy_bandwidth(device) / 1e9,
        "batches": {},
    }
    for batch_size in args.batch_sizes:
        prompts = torch.randint(
            100, runner.model_config.vocab_size, (batch_size, args.input_len), generator=generator
        )
        srt_runs, hf_runs = [], []
        for _ in range(args.repeats):
            srt_runs.append(bench_srt(runner, prompts, args.output_len))
            if hf is not None:
                hf_runs.append(bench_hf(hf, prompts.to(device), args.output_len))
        entry: dict[str, Any] = {"srt": best(srt_runs)}
        # The least time a decode step can take: reading every weight and the KV cache once.
        context = args.input_len + args.output_len // 2
        step_bytes = weight_bytes(runner) + batch_size * context * kv_bytes_per_token(runner)
        entry["decode_step_floor_s"] = step_bytes / (results["copy_bandwidth_GBps"] * 1e9)
        if hf is not None:
            entry["hf"] = best(hf_runs)
            entry["decode_speedup_vs_hf"] = (
                entry["hf"]["decode_step_s"] / entry["srt"]["decode_step_s"]
            )
            entry["prefill_speedup_vs_hf"] = entry["hf"]["prefill_s"] / entry["srt"]["prefill_s"]
        results["batches"][str(batch_size)] = entry
        print(f"bs={batch_size}: {json.dumps(entry)}", file=sys.stderr)
    if "32" in results["batches"] and "hf" in results["batches"]["32"]:
        results["decode_speedup_vs_hf_bs32"] = results["batches"]["32"]["decode_speedup_vs_hf"]
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
