"""Offline throughput: the same prompts through srt's Engine and through Hugging Face
transformers `generate` with static batches, in the same run.

    python benches/bench_offline_throughput.py --model PATH --json OUT [--num-prompts 48]

Two workloads (SGLang's `bench_offline_throughput` datasets, scaled to a CPU):

- random: prompts of random token ids, input lengths uniform in [input_len/4, input_len] and
  output lengths uniform in [output_len/4, output_len] (SGLang's random dataset with a range
  ratio of 0.25);
- shared prefix (SGLang's generated-shared-prefix): `--groups` system prompts of
  `--system-len` tokens, each followed by `--questions` questions of `--question-len` tokens,
  all asking for `output_len` tokens.

Every request is greedy and ignores EOS, so both sides produce exactly the requested tokens.
transformers runs the prompts in order, in static batches of `--hf-batch-size` (left-padded; a
batch decodes until its longest request is done). Output tokens/s counts the requested tokens
only. srt gets every request at once, as SGLang's offline benchmark does. Keys:
`speedup_vs_hf_random`, `speedup_vs_hf_shared_prefix` (srt's output tokens/s over HF's) and
`cache_hit_rate_shared_prefix` (prompt tokens the radix cache served over all prompt tokens).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from bench_utils import emit
from transformers import AutoModelForCausalLM

from srt.entrypoints.engine import Engine
from srt.server_args_check import split_gguf_path


def random_workload(
    rng: random.Random, n: int, input_len: int, output_len: int, vocab: int
) -> list[tuple[list[int], int]]:
    return [
        (
            [rng.randrange(100, vocab) for _ in range(rng.randint(input_len // 4, input_len))],
            rng.randint(max(1, output_len // 4), output_len),
        )
        for _ in range(n)
    ]


def shared_prefix_workload(
    rng: random.Random, args: argparse.Namespace, vocab: int
) -> list[tuple[list[int], int]]:
    def tokens(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    work = []
    for _ in range(args.groups):
        system = tokens(args.system_len)
        questions = [tokens(args.question_len) for _ in range(args.questions)]
        work += [(system + question, args.output_len) for question in questions]
    return work


def run_srt(engine: Engine, work: list[tuple[list[int], int]]) -> dict[str, Any]:
    params: list[Mapping[str, Any]] = [
        {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True} for _, n in work
    ]
    start = time.perf_counter()
    results = engine.generate(input_ids=[ids for ids, _ in work], sampling_params=params)
    seconds = time.perf_counter() - start
    assert isinstance(results, list)
    output_tokens = sum(len(r["output_ids"]) for r in results)
    assert output_tokens == sum(n for _, n in work), "srt stopped a request early"
    prompt_tokens = sum(r["meta_info"]["prompt_tokens"] for r in results)
    cached = sum(r["meta_info"]["cached_tokens"] for r in results)
    return {
        "seconds": seconds,
        "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / seconds,
        "prompt_tokens": prompt_tokens,
        "cached_prompt_tokens": cached,
        "cache_hit_rate": cached / prompt_tokens,
    }


@torch.inference_mode()
def run_hf(model: Any, work: list[tuple[list[int], int]], batch_size: int) -> dict[str, Any]:
    pad = 0
    start = time.perf_counter()
    for i in range(0, len(work), batch_size):
        batch = work[i : i + batch_size]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids, _ in batch])
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids, _ in batch])
        steps = max(n for _, n in batch)
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            pad_token_id=pad,
        )
        assert out.shape[1] == width + steps
    seconds = time.perf_counter() - start
    output_tokens = sum(n for _, n in work)
    return {
        "seconds": seconds,
        "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--questions", type=int, default=12)
    parser.add_argument("--system-len", type=int, default=384)
    parser.add_argument("--question-len", type=int, default=32)
    parser.add_argument("--hf-batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    with Engine(model_path=args.model, dtype="float32") as engine:
        vocab = len(engine.tokenizer)
        workloads = {
            "random": random_workload(
                rng, args.num_prompts, args.input_len, args.output_len, vocab
            ),
            "shared_prefix": shared_prefix_workload(rng, args, vocab),
        }
        run_srt(engine, random_workload(rng, 4, 16, 4, vocab))  # warm-up
        srt = {name: run_srt(engine, work) for name, work in workloads.items()}
        engine.flush_cache()
    results: dict[str, Any] = {
        "model": args.model,
        "torch_threads": torch.get_num_threads(),
        "args": vars(args) | {"json": str(args.json)},
        "srt": srt,
    }
    if not args.no_hf:
        path, gguf_file = split_gguf_path(args.model)
        model = AutoModelForCausalLM.from_pretrained(path, gguf_file=gguf_file, dtype=torch.float32)
        model.eval()
        run_hf(model, random_workload(rng, 4, 16, 4, vocab), 4)  # warm-up
        hf = {name: run_hf(model, work, args.hf_batch_size) for name, work in workloads.items()}
        results["hf"] = hf
        for name in workloads:
            results[f"speedup_vs_hf_{name}"] = (
                srt[name]["output_tokens_per_s"] / hf[name]["output_tokens_per_s"]
            )
    results["cache_hit_rate_shared_prefix"] = srt["shared_prefix"]["cache_hit_rate"]
    results["prefill_tokens_saved_shared_prefix"] = srt["shared_prefix"]["cached_prompt_tokens"]
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
