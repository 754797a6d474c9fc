"""One static batch through the model runner, beside Hugging Face transformers in the same run.

    python benches/bench_one_batch.py --model PATH --json OUT [--batch-sizes 1 8 32 64]
        [--input-len 32] [--output-len 8] [--dtype auto|float32|bfloat16] [--load-format dummy]
        [--quantization auto|none|gguf|int8]

SGLang's `bench_one_batch` shape: for each batch size, a prefill of `input-len` random tokens per
sequence, then `output-len` decode steps. transformers runs the same shapes, in the same dtype,
through its forward with a `DynamicCache` (unless `--load-format dummy`: random weights of a
config's shapes, no baseline). The two alternate `--repeats` times (a shared machine is noisy);
each reports its best prefill latency and its best median decode-step latency, and
`decode_speedup_vs_hf_bs32` = HF's decode step time over ours at batch 32.

Every figure is also set beside the machine's limits, measured in the same run (roofline.py):
a decode step's weight and KV-cache bytes over its time (`decode_GBps`) as a fraction of the
bandwidth of a large tensor copy (`decode_step_floor_s`: the step at that bandwidth), and the
useful FLOPs of prefill and decode over their time
(`prefill_TFLOPs`) as a fraction of a large `torch.matmul`'s rate in the model's dtype. A table
of them goes to stderr at the end.

A quantized model (`--quantization`, `auto` for a GGUF file: its blocks) counts the bytes its
quantized weights hold (`decode_weight_bytes`), so `decode_GBps` is the bandwidth it achieves
on what it actually reads; transformers, which dequantizes a GGUF file to float as it loads,
is set against its own float weights' bytes (`hf_decode_weight_bytes`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch
from bench_utils import emit, machine_info
from roofline import (
    copy_bandwidth,
    decode_flops,
    decode_weight_bytes,
    gemm_rate,
    linear_params,
    prefill_flops,
    timed,
)
from transformers import AutoModelForCausalLM, DynamicCache

from srt.mem_cache.memory_pool import KVPool
from srt.model_executor.cpu_threads import bind_cpu_threads
from srt.model_executor.model_runner import ModelRunner
from srt.model_executor.resolve import resolve_device
from srt.server_args import ServerArgs


def bench_srt(runner: ModelRunner, prompts: torch.Tensor, output_len: int) -> dict[str, float]:
    batch_size, input_len = prompts.shape
    device = runner.device
    rows = list(range(batch_size))  # the pool has max_running_requests = batch_size rows
    next_slot = 1

    def slots(n: int) -> list[int]:
        nonlocal next_slot
        taken = list(range(next_slot, next_slot + n))
        next_slot += n
        return taken

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


def machine_limits(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The copy bandwidth and the GEMM rates (float32, bfloat16 and the model's dtype)."""
    dtypes = dict.fromkeys([torch.float32, torch.bfloat16, dtype])
    return {
        "copy_bandwidth_GBps": copy_bandwidth(device) / 1e9,
        "gemm_TFLOPs": {dtype_name(d): gemm_rate(d, device) / 1e12 for d in dtypes},
    }


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def step_work(
    runner: ModelRunner, batch_size: int, input_len: int, output_len: int
) -> dict[str, int]:
    """What the batch's prefill and its median decode step must do (see roofline.py)."""
    config = runner.model_config
    shape = (config.num_layers, int(config.hf_config.num_attention_heads), config.head_dim)
    per_token, lm_head = linear_params(runner.model)
    # The median decode step's sequences hold the prompt and about half the output.
    context = input_len + output_len // 2
    weights = decode_weight_bytes(runner.model, batch_size)
    return {
        "decode_weight_bytes": weights,
        "decode_step_bytes": weights + batch_size * context * kv_bytes_per_token(runner),
        "decode_step_flops": decode_flops(per_token, lm_head, *shape, batch_size, context),
        "prefill_flops": prefill_flops(per_token, lm_head, *shape, batch_size, input_len),
    }


def against_limits(
    timings: dict[str, Any], work: dict[str, int], limits: dict[str, Any], dtype: str
) -> dict[str, Any]:
    """`timings` with the rates they reach, and those rates as fractions of the machine's."""
    copy_bps = limits["copy_bandwidth_GBps"] * 1e9
    gemm = limits["gemm_TFLOPs"][dtype] * 1e12
    decode_bps = work["decode_step_bytes"] / timings["decode_step_s"]
    decode_fps = work["decode_step_flops"] / timings["decode_step_s"]
    prefill_fps = work["prefill_flops"] / timings["prefill_s"]
    return timings | {
        "decode_GBps": decode_bps / 1e9,
        "decode_fraction_of_copy_bw": decode_bps / copy_bps,
        "decode_TFLOPs": decode_fps / 1e12,
        "decode_fraction_of_gemm_rate": decode_fps / gemm,
        "prefill_TFLOPs": prefill_fps / 1e12,
        "prefill_fraction_of_gemm_rate": prefill_fps / gemm,
    }


def table(results: dict[str, Any]) -> str:
    """The figures against the limits, one row per batch size and engine, for people."""
    machine = machine_info()
    limits = results["limits"]
    gemm = ", ".join(f"{d} {r:.3g}" for d, r in limits["gemm_TFLOPs"].items())
    lines = [
        f"{results['model']} in {results['dtype']} (quantization {results['quantization']},"
        f" {results['weight_bytes'] / 2**20:.0f} MB of weights) on {machine['cpu_model']}"
        f" ({machine['torch_threads']} threads; {' '.join(machine['cpu_flags'])})",
        f"limits: copy {limits['copy_bandwidth_GBps']:.3g} GB/s; GEMM TFLOP/s: {gemm}",
        f"{'bs':>4} {'engine':<6} {'decode ms':>9} {'GB/s':>7} {'of copy':>7}"
        f" {'prefill ms':>10} {'TFLOP/s':>8} {'of GEMM':>7}",
    ]
    for batch_size, entry in results["batches"].items():
        for engine in ("srt", "hf"):
            if engine not in entry:
                continue
            r = entry[engine]
            lines.append(
                f"{batch_size:>4} {engine:<6} {r['decode_step_s'] * 1e3:>9.2f}"
                f" {r['decode_GBps']:>7.2f} {r['decode_fraction_of_copy_bw']:>7.2f}"
                f" {r['prefill_s'] * 1e3:>10.1f} {r['prefill_TFLOPs']:>8.3f}"
                f" {r['prefill_fraction_of_gemm_rate']:>7.2f}"
            )
    return "\n".join(lines)


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
    parser.add_argument(
        "--cpu-omp-threads-bind", default="auto", help="as srt-serve's flag (CPU only)"
    )
    parser.add_argument("--load-format", default="auto", help="dummy: random weights, no HF")
    parser.add_argument(
        "--quantization", default="auto", help="srt's weight format (as srt-serve's flag)"
    )
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
        quantization=args.quantization,
    )
    if resolve_device(args.device).type == "cpu":
        bind_cpu_threads(args.cpu_omp_threads_bind)
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
    dtype = dtype_name(runner.model_config.dtype)
    limits = machine_limits(device, runner.model_config.dtype)
    results: dict[str, Any] = {
        "model": args.model,
        "device": str(device),
        "dtype": dtype,
        "torch_threads": torch.get_num_threads(),
        "cuda_graph": runner.cuda_graph_runner is not None,
        "quantization": runner.model_config.quantization,
        "weight_bytes": runner.weight_bytes,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "copy_bandwidth_GBps": limits["copy_bandwidth_GBps"],
        "limits": limits,
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
        work = step_work(runner, batch_size, args.input_len, args.output_len)
        entry: dict[str, Any] = {
            **work,
            # The least time a decode step can take: reading every weight and the KV cache once.
            "decode_step_floor_s": work["decode_step_bytes"]
            / (limits["copy_bandwidth_GBps"] * 1e9),
            "srt": against_limits(best(srt_runs), work, limits, dtype),
        }
        if hf is not None:
            hf_weights = decode_weight_bytes(hf, batch_size)
            entry["hf_decode_weight_bytes"] = hf_weights
            hf_work = work | {
                "decode_step_bytes": work["decode_step_bytes"]
                - work["decode_weight_bytes"]
                + hf_weights
            }
            entry["hf"] = against_limits(best(hf_runs), hf_work, limits, dtype)
            entry["decode_speedup_vs_hf"] = (
                entry["hf"]["decode_step_s"] / entry["srt"]["decode_step_s"]
            )
            entry["prefill_speedup_vs_hf"] = entry["hf"]["prefill_s"] / entry["srt"]["prefill_s"]
        results["batches"][str(batch_size)] = entry
        print(f"bs={batch_size}: {json.dumps(entry)}", file=sys.stderr)
    if "32" in results["batches"] and "hf" in results["batches"]["32"]:
        results["decode_speedup_vs_hf_bs32"] = results["batches"]["32"]["decode_speedup_vs_hf"]
    print(table(results), file=sys.stderr)
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
