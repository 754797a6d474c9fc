"""Online serving benchmark against any OpenAI-compatible server, in the shape of SGLang's
`bench_serving`, so srt and another server are measured with the same tool.

    python benches/bench_serving.py --base-url http://127.0.0.1:30000 --dataset-name random \
        --num-prompts 200 --random-input-len 128 --random-output-len 128 --max-concurrency 32 \
        [--server-pid PID] [--json OUT]

Every request streams `/v1/completions` greedily with `ignore_eos` and `max_tokens`, so output
lengths are the ones asked for, over a new connection of its own. Requests arrive as a Poisson
process of `--request-rate` per second (all at once by default), at most `--max-concurrency` in
flight. Before the run: one warm-up request, then `POST /flush_cache` where the server offers
it. Each run draws a fresh seed (recorded; `--seed` repeats a run), so no run is served from an
earlier run's cache.

Reported (JSON on stdout and in `--json`, a summary on stderr): TTFT, TPOT, ITL and E2E (mean,
median, p99, ms), request/input/output throughput, the server's prefix-cache hit rate beside the
best a perfect cache could reach on the same prompts (`best_cache_hit_rate`), and with
`--server-pid` the CPU seconds of the server's whole process tree per 1,000 output tokens. A run
with a failed request lists the errors, says it is not a result and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from bench_utils import emit
from serving_client import (
    ProcessTreeCpu,
    discover_model,
    discover_tokenizer,
    flush_cache,
    new_session,
    send_request,
)
from serving_datasets import (
    BenchRequest,
    BenchTokenizer,
    best_cache_hit_rate,
    prompt_token_ids,
    random_requests,
    random_text,
    shared_prefix_requests,
    sharegpt_requests,
)
from serving_metrics import RequestResult, summarize
from tqdm import tqdm

DATASETS = ("random", "generated-shared-prefix", "sharegpt")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:30000")
    parser.add_argument("--model", help="default: the first model of /v1/models")
    parser.add_argument(
        "--tokenizer", help="a local tokenizer directory; default: the server's, if it says"
    )
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    parser.add_argument("--dataset-name", choices=DATASETS, default="random")
    parser.add_argument("--dataset-path", type=Path, help="the ShareGPT-format JSON file")
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--random-input-len", type=int, default=1024)
    parser.add_argument("--random-output-len", type=int, default=1024)
    parser.add_argument("--random-range-ratio", type=float, default=0.0)
    parser.add_argument("--gsp-num-groups", type=int, default=16)
    parser.add_argument("--gsp-prompts-per-group", type=int, default=16)
    parser.add_argument("--gsp-system-prompt-len", type=int, default=1024)
    parser.add_argument("--gsp-question-len", type=int, default=128)
    parser.add_argument("--gsp-output-len", type=int, default=128)
    parser.add_argument(
        "--request-rate", type=float, default=float("inf"), help="requests per second (Poisson)"
    )
    parser.add_argument("--max-concurrency", type=int)
    parser.add_argument("--disable-ignore-eos", action="store_true")
    parser.add_argument("--seed", type=int, help="default: a fresh one, recorded in the JSON")
    parser.add_argument("--server-pid", type=int)
    parser.add_argument("--request-timeout", type=float, default=3600.0, help="seconds")
    parser.add_argument("--disable-tqdm", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.num_prompts < 1:
        parser.error(f"--num-prompts must be at least 1, got {args.num_prompts}")
    if not args.request_rate > 0:
        parser.error(f"--request-rate must be positive, got {args.request_rate}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        parser.error(f"--max-concurrency must be at least 1, got {args.max_concurrency}")
    if (args.dataset_name == "sharegpt") != (args.dataset_path is not None):
        parser.error("--dataset-path goes with --dataset-name sharegpt, and only with it")
    args.base_url = args.base_url.rstrip("/")
    return args


def build_requests(
    args: argparse.Namespace, tokenizer: BenchTokenizer, rng: random.Random
) -> list[BenchRequest]:
    if args.dataset_name == "random":
        return random_requests(
            tokenizer,
            rng,
            args.num_prompts,
            args.random_input_len,
            args.random_output_len,
            args.random_range_ratio,
        )
    if args.dataset_name == "generated-shared-prefix":
        return shared_prefix_requests(
            tokenizer,
            rng,
            args.gsp_num_groups,
            args.gsp_prompts_per_group,
            args.gsp_system_prompt_len,
            args.gsp_question_len,
            args.gsp_output_len,
        )
    return sharegpt_requests(tokenizer, rng, args.dataset_path, args.num_prompts)


def arrival_gaps(rng: random.Random, n: int, rate: float) -> list[float]:
    """Seconds to wait before each of `n` requests: exponential gaps of mean 1/rate (a Poisson
    process), none at an infinite rate."""
    if rate == float("inf"):
        return [0.0] * n
    return [rng.expovariate(rate) for _ in range(n)]


async def run_requests(
    session: aiohttp.ClientSession,
    args: argparse.Namespace,
    model: str,
    requests: list[BenchRequest],
    gaps: list[float],
) -> tuple[list[RequestResult], float]:
    """Sends every request on its schedule; returns the results in request order and the
    seconds from the first send to the last answer."""
    limit = asyncio.Semaphore(args.max_concurrency or len(requests))
    progress = tqdm(total=len(requests), disable=args.disable_tqdm)

    async def one(index: int, request: BenchRequest) -> RequestResult:
        async with limit:
            result = await send_request(
                session, args.base_url, model, request, index, not args.disable_ignore_eos
            )
        progress.update(1)
        return result

    start = time.perf_counter()
    tasks = []
    for index, (request, gap) in enumerate(zip(requests, gaps, strict=True)):
        if gap:
            await asyncio.sleep(gap)
        tasks.append(asyncio.create_task(one(index, request)))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    progress.close()
    return list(results), duration


async def benchmark(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    cpu = ProcessTreeCpu(args.server_pid) if args.server_pid is not None else None
    async with new_session(args.api_key, args.request_timeout) as session:
        model = args.model or await discover_model(session, args.base_url)
        tokenizer_path = args.tokenizer or await discover_tokenizer(session, args.base_url)
        if tokenizer_path is None:
            raise ValueError("the server does not say its tokenizer; pass --tokenizer PATH")
        tokenizer = BenchTokenizer(tokenizer_path)
        rng = random.Random(seed)
        requests = build_requests(args, tokenizer, rng)
        gaps = arrival_gaps(rng, len(requests), args.request_rate)
        best = best_cache_hit_rate([prompt_token_ids(tokenizer, r.prompt) for r in requests])

        # A prompt of its own, so the warm-up leaves nothing in the cache the run could use.
        warm_prompt = random_text(tokenizer, rng, 16, tokenizer.ordinary_ids())
        warm_up = BenchRequest(warm_prompt, len(prompt_token_ids(tokenizer, warm_prompt)), 4)
        warm = await send_request(
            session, args.base_url, model, warm_up, -1, not args.disable_ignore_eos
        )
        if not warm.success:
            raise ValueError(f"the warm-up request failed: {warm.error}")
        flushed = await flush_cache(session, args.base_url)

        if cpu is not None:
            cpu.start()
        results, duration = await run_requests(session, args, model, requests, gaps)
        cpu_s = cpu.seconds() if cpu is not None else None
    summary = summarize(results, duration)
    output_tokens = summary["total_output_tokens"]
    return {
        "base_url": args.base_url,
        "model": model,
        "tokenizer": str(tokenizer_path),
        "dataset": args.dataset_name,
        "seed": seed,
        "num_prompts": len(requests),
        "request_rate": json_value(args.request_rate),
        "max_concurrency": args.max_concurrency,
        "cache_flushed": flushed,
        "is_result": summary["failed"] == 0,
        **summary,
        "best_cache_hit_rate": best,
        "server_cpu_s": cpu_s,
        "server_cpu_s_per_1k_output_tokens": (
            cpu_s / output_tokens * 1000 if cpu_s is not None and output_tokens else None
        ),
        "args": {k: json_value(v) for k, v in vars(args).items()}
        | {"api_key": "***" if args.api_key else None},
    }


def json_value(value: Any) -> Any:
    """An argument as strict JSON holds it: paths as strings, an infinite rate as null."""
    if isinstance(value, Path):
        return str(value)
    return None if value == float("inf") else value


def print_summary(results: dict[str, Any]) -> None:
    def line(label: str, value: Any) -> None:
        if isinstance(value, float):
            value = f"{value:.4f}" if value < 10 else f"{value:.2f}"
        print(f"{label:<44}{value}", file=sys.stderr)

    print(f"{' serving benchmark ':=^60}", file=sys.stderr)
    for key in (
        "model",
        "dataset",
        "seed",
        "completed",
        "failed",
        "duration_s",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "input_throughput",
        "output_throughput",
        "cache_hit_rate",
        "best_cache_hit_rate",
        "server_cpu_s_per_1k_output_tokens",
    ):
        line(key, results[key])
    for metric in ("ttft", "tpot", "itl", "e2e"):
        for stat in ("mean", "median", "p99"):
            line(f"{stat}_{metric}_ms", results[f"{stat}_{metric}_ms"])
    if results["output_len_mismatches"]:
        print(
            f"warning: {results['output_len_mismatches']} requests did not produce the output "
            "length asked for (does the server honour ignore_eos?)",
            file=sys.stderr,
        )
    if results["failed"]:
        for error in results["errors"]:
            print(f"request {error['request']} failed: {error['error']}", file=sys.stderr)
        print(
            f"{results['failed']} of {results['num_prompts']} requests failed: "
            "this run is not a result",
            file=sys.stderr,
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    try:
        results = asyncio.run(benchmark(args, seed))
    except ValueError as e:
        print(f"bench_serving: {e}", file=sys.stderr)
        return 2
    print_summary(results)
    emit(results, args.json)
    return 0 if results["is_result"] else 1


if __name__ == "__main__":
    sys.exit(main())
