"""Soak: many mixed requests against one srt server, to show that none of them takes it down,
leaks memory or loses a request.

    python benches/soak.py --requests 1000 --json OUT [--model PATH | --url http://127.0.0.1:PORT]

Without `--url` it starts `srt-serve` itself (SmolLM2 unless `--model`, with a random API key so
that the key checks are exercised; `--server-arg=--flag` passes more flags) and stops it at the
end. Only servers on this machine (127.0.0.1) are targeted.

The traffic (`soak_traffic.py`): native and OpenAI requests, streamed or not, of varied lengths,
with clients that disconnect mid-request and requests aborted by id, and the hostile requests of
`soak_hostile.HOSTILE_REQUESTS` spread among them (each `--hostile-rounds` times). A warm-up of
the same ordinary mix runs first; at most `--concurrency` requests are in flight, and no new one
starts after `--max-seconds`.

Reported (JSON on stdout and in `--json`): counts per outcome, 5xx answers, lost requests, each
hostile request's statuses, throughput, the RSS of the main, scheduler and detokenizer processes
after the warm-up and at the end (and the growth in %), the scheduler's KV integrity violations
and used KV slots once idle at both points, and whether every process is still the one found at
the start. Exits 1 on any 5xx, lost request, integrity violation, KV slot not returned, server
not idle at the end, or changed process (and, for a server it started, an unclean stop); 2 when
the soak cannot start.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import platform
import random
import secrets
import signal
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from bench_utils import emit
from soak_hostile import HOSTILE_REQUESTS, HostileRequest, Target
from soak_server import (
    get_load,
    listener_pid,
    rss_bytes,
    same_processes,
    server_processes,
    start_server,
    stop_server,
    wait_idle,
)
from soak_traffic import (
    ABORT_END_S,
    Action,
    Outcome,
    Planned,
    Result,
    Shape,
    plan_traffic,
    run_planned,
)

from srt.testing.server_process import ServerProcess

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
RSS_SAMPLE_S = 1.0
MIB = 1 << 20
MAX_PROBLEMS = 20
SIMD_FLAG_PREFIXES = ("sse", "ssse", "avx", "fma", "f16c", "amx", "asimd", "sve", "neon", "bf16")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--model", help="start srt-serve on this model (default: SmolLM2)")
    where.add_argument("--url", help="soak a running server instead (on 127.0.0.1)")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="one more srt-serve flag for the server the soak starts (repeatable)",
    )
    parser.add_argument("--server-pid", type=int, help="with --url: the server's main process")
    parser.add_argument(
        "--api-key", help="the server's key (default for a server the soak starts: a random one)"
    )
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup-requests", type=int, help="default: a tenth, 20 to 200")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-prompt-len", type=int, default=128, help="words or token ids")
    parser.add_argument("--max-output-len", type=int, default=32)
    parser.add_argument(
        "--long-output-len", type=int, default=128, help="for requests cut mid-generation"
    )
    parser.add_argument(
        "--request-timeout", type=float, default=300.0, help="seconds (a small machine is slow)"
    )
    parser.add_argument(
        "--abort-deadline",
        type=float,
        default=ABORT_END_S,
        help="seconds an aborted request may run on after its abort was accepted",
    )
    parser.add_argument("--max-seconds", type=float, default=3600.0, help="for the whole soak")
    parser.add_argument("--idle-timeout", type=float, default=120.0, help="seconds")
    parser.add_argument(
        "--hostile", default="all", help="all, none, or hostile request names (comma-separated)"
    )
    parser.add_argument("--skip-hostile", default="", help="hostile request names to leave out")
    parser.add_argument("--hostile-rounds", type=int, help="default: one per 1000 requests")
    parser.add_argument("--seed", type=int, help="default: a fresh one, recorded in the JSON")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    for name in ("requests", "concurrency", "max_prompt_len", "max_output_len", "long_output_len"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup_requests is None:
        args.warmup_requests = min(200, max(20, args.requests // 10))
    if args.hostile_rounds is None:
        args.hostile_rounds = max(1, args.requests // 1000)
    if args.warmup_requests < 0 or args.hostile_rounds < 0:
        parser.error("--warmup-requests and --hostile-rounds cannot be negative")
    if args.url is not None:
        args.url = args.url.rstrip("/")
        parsed = urllib.parse.urlsplit(args.url)
        if parsed.scheme != "http" or parsed.hostname not in LOCAL_HOSTS or not parsed.port:
            parser.error(f"--url must be http://127.0.0.1:PORT (this machine), got {args.url}")
    elif args.server_pid is not None:
        parser.error("--server-pid goes with --url")
    try:
        args.hostile_requests = select_hostile(args.hostile, args.skip_hostile)
    except ValueError as e:
        parser.error(str(e))
    return args


def select_hostile(chosen: str, skipped: str) -> list[HostileRequest]:
    """The hostile requests named by `--hostile` and not by `--skip-hostile`."""
    by_name = {h.name: h for h in HOSTILE_REQUESTS}
    names = {"all": list(by_name), "none": []}.get(chosen, _names(chosen))
    unknown = [n for n in [*names, *_names(skipped)] if n not in by_name]
    if unknown:
        raise ValueError(f"unknown hostile request {unknown[0]!r} (known: {', '.join(by_name)})")
    return [by_name[n] for n in names if n not in _names(skipped)]


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def machine() -> dict[str, Any]:
    """The CPU (model, SIMD flags, cores) and software the numbers came from."""
    model, flags = platform.processor(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags = sorted(f for f in value.split() if f.startswith(SIMD_FLAG_PREFIXES))
    except OSError:
        pass
    return {
        "cpu_model": model,
        "cpu_flags": flags,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


@dataclass
class Phase:
    """One run of planned requests: results in request order and how long it took."""

    results: list[Result]
    abort_statuses: list[int]
    duration_s: float
    not_sent: int


async def run_phase(
    session: aiohttp.ClientSession,
    base_url: str,
    target: Target,
    plans: list[Planned],
    args: argparse.Namespace,
    deadline: float,
) -> Phase:
    """Runs `plans` with at most `args.concurrency` in flight; none starts after `deadline`."""
    pending = collections.deque(plans)
    results: list[Result] = []
    abort_statuses: list[int] = []

    async def worker() -> None:
        while pending and time.monotonic() < deadline:
            planned = pending.popleft()
            result, statuses = await run_planned(
                session, base_url, target, planned, args.request_timeout, args.abort_deadline
            )
            results.append(result)
            abort_statuses.extend(statuses)

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    results.sort(key=lambda r: r.index)
    return Phase(results, abort_statuses, time.monotonic() - start, len(pending))


async def sample_peak_rss(
    processes: dict[str, psutil.Process], peak: dict[str, int], stop: asyncio.Event
) -> None:
    """Keeps the largest RSS seen of each process in `peak` until `stop`."""
    while not stop.is_set():
        for role, rss in rss_bytes(processes).items():
            if rss is not None:
                peak[role] = max(peak.get(role, 0), rss)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), RSS_SAMPLE_S)


async def discover(session: aiohttp.ClientSession, base_url: str) -> dict[str, Any]:
    """The served model's name (from `/v1/models`), vocabulary size and context length."""
    async with session.get(f"{base_url}/v1/models") as response:
        if response.status != 200:
            raise ValueError(f"GET /v1/models answered {response.status}")
        model = (await response.json())["data"][0]["id"]
    async with session.get(f"{base_url}/get_model_info") as response:
        if response.status != 200:
            raise ValueError(f"GET /get_model_info answered {response.status}")
        info = await response.json()
    return {"model": model} | {k: info[k] for k in ("vocab_size", "context_length")}


async def soak(
    args: argparse.Namespace,
    base_url: str,
    api_key: str | None,
    processes: dict[str, psutil.Process],
    seed: int,
) -> dict[str, Any]:
    deadline = time.monotonic() + args.max_seconds
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    # A connection per request: a cut request must close its own connection and nothing else's.
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(
        connector=connector, headers=headers, read_bufsize=1 << 20
    ) as session:
        facts = await discover(session, base_url)
        port = urllib.parse.urlsplit(base_url).port
        assert port is not None
        target = Target(port, facts["model"], facts["vocab_size"], api_key)
        shape = Shape(
            facts["model"],
            facts["vocab_size"],
            facts["context_length"],
            args.max_prompt_len,
            args.max_output_len,
            args.long_output_len,
        )
        hostile = [h for h in args.hostile_requests if api_key or not h.needs_api_key]
        rng = random.Random(seed)
        run_id = f"{seed:x}"
        warm_plans = plan_traffic(rng, args.warmup_requests, shape, f"{run_id}-w")
        plans = plan_traffic(rng, args.requests, shape, run_id, hostile * args.hostile_rounds)
        load_first = await get_load(session, base_url)

        warm = await run_phase(session, base_url, target, warm_plans, args, deadline)
        load_start = await wait_idle(session, base_url, args.idle_timeout)
        rss_start = rss_bytes(processes)
        peak: dict[str, int] = {}
        stop_sampling = asyncio.Event()
        sampler = asyncio.create_task(sample_peak_rss(processes, peak, stop_sampling))
        measured = await run_phase(session, base_url, target, plans, args, deadline)
        load_end = await wait_idle(session, base_url, args.idle_timeout)
        stop_sampling.set()
        await sampler
        rss_end = rss_bytes(processes)
    report: dict[str, Any] = {
        "base_url": base_url,
        "model": facts["model"],
        "seed": seed,
        "machine": machine(),
        "requests": len(plans),
        "warmup_requests": len(warm_plans),
        "hostile_rounds": args.hostile_rounds if hostile else 0,
        "concurrency": args.concurrency,
    }
    report |= phase_summary(warm, measured, hostile)
    report["rss"] = rss_summary(rss_start, rss_end, peak)
    report["kv"] = kv_summary(load_first, load_start, load_end)
    report["pids"] = {role: p.pid for role, p in processes.items()}
    report["same_process"] = same_processes(processes)
    return report


def phase_summary(warm: Phase, main: Phase, hostile: list[HostileRequest]) -> dict[str, Any]:
    every = warm.results + main.results
    statuses = warm.abort_statuses + main.abort_statuses
    by_action: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in main.results:
        by_action[r.action][r.outcome] += 1
    hostile_statuses: dict[str, list[int | None]] = {h.name: [] for h in hostile}
    for r in main.results:
        if r.action is Action.HOSTILE:
            hostile_statuses[r.api].append(r.status)
    problems = [
        {"index": r.index, "api": r.api, "action": r.action, "outcome": r.outcome}
        | {"status": r.status, "detail": r.detail}
        for r in every
        if r.outcome in (Outcome.LOST, Outcome.SERVER_ERROR)
        or (r.outcome is Outcome.REFUSED and r.action is not Action.HOSTILE)
    ]
    output_tokens = sum(r.output_tokens for r in main.results)
    latencies = [r.abort_latency_s for r in every if r.abort_latency_s is not None]
    return {
        "duration_s": main.duration_s,
        "warmup_duration_s": warm.duration_s,
        "not_sent": warm.not_sent + main.not_sent,
        "outcomes": dict(collections.Counter(r.outcome.value for r in main.results)),
        "outcomes_by_action": {action: dict(c) for action, c in sorted(by_action.items())},
        "warmup_outcomes": dict(collections.Counter(r.outcome.value for r in warm.results)),
        "server_errors": sum(r.outcome is Outcome.SERVER_ERROR for r in every)
        + sum(s >= 500 for s in statuses),
        "lost": sum(r.outcome is Outcome.LOST for r in every),
        "ordinary_refused": sum(
            r.outcome is Outcome.REFUSED and r.action is not Action.HOSTILE for r in every
        ),
        "abort_request_statuses": dict(collections.Counter(str(s) for s in statuses)),
        "abort_latency_s": {
            "max": max(latencies, default=None),
            "mean": sum(latencies) / len(latencies) if latencies else None,
        },
        # An accepted abort, yet another finish reason: it landed as the request finished, or
        # the server dropped it.
        "aborts_ignored": sum(
            r.abort_latency_s is not None and r.outcome is Outcome.OK for r in every
        ),
        "hostile": hostile_statuses,
        "hostile_failed": sorted(
            r.api
            for r in main.results
            if r.action is Action.HOSTILE and r.outcome in (Outcome.LOST, Outcome.SERVER_ERROR)
        ),
        "hostile_not_refused": sorted(
            {r.api for r in main.results if r.action is Action.HOSTILE and r.outcome is Outcome.OK}
        ),
        "request_throughput": len(main.results) / main.duration_s if main.duration_s else 0.0,
        "output_tokens": output_tokens,
        "output_throughput": output_tokens / main.duration_s if main.duration_s else 0.0,
        "problems": problems[:MAX_PROBLEMS],
    }


def rss_summary(
    start: dict[str, int | None], end: dict[str, int | None], peak: dict[str, int]
) -> dict[str, Any]:
    """RSS in MiB after the warm-up, at the end and at its peak, and the growth in %."""

    def mib(value: int | None) -> float | None:
        return None if value is None else round(value / MIB, 1)

    growth: dict[str, float | None] = {}
    for role in start:
        before, after = start[role], end.get(role)
        growth[role] = None if not before or after is None else 100 * (after - before) / before
    if all(v is not None for v in [*start.values(), *end.values()]):
        total_before = sum(v or 0 for v in start.values())
        total_after = sum(v or 0 for v in end.values())
        growth["total"] = 100 * (total_after - total_before) / total_before
    return {
        "start_mib": {role: mib(v) for role, v in start.items()},
        "end_mib": {role: mib(v) for role, v in end.items()},
        "peak_mib": {role: mib(v) for role, v in peak.items()},
        "growth_pct": {role: None if g is None else round(g, 2) for role, g in growth.items()},
    }


def kv_summary(
    first: dict[str, int], start: dict[str, int] | None, end: dict[str, int] | None
) -> dict[str, Any]:
    """The integrity check's violations (before anything ran, and at the end) and the KV slots
    in use when idle after the warm-up and at the end: they must match (all returned)."""
    return {
        "violations_before": first["invariant_violations"],
        "violations_after": None if end is None else end["invariant_violations"],
        "used_slots_idle_start": None if start is None else start["num_used_tokens"],
        "used_slots_idle_end": None if end is None else end["num_used_tokens"],
        "max_total_tokens": first["max_total_tokens"],
        "idle_after_warmup": start is not None,
        "idle_at_end": end is not None,
        "slots_returned": (
            start is not None
            and end is not None
            and end["num_used_tokens"] == start["num_used_tokens"]
        ),
    }


def failures(report: dict[str, Any]) -> list[str]:
    """Why the soak failed (empty: it passed)."""
    out = []
    if report["server_errors"]:
        out.append(f"{report['server_errors']} answers were 5xx")
    if report["lost"]:
        out.append(f"{report['lost']} requests were lost")
    kv = report["kv"]
    if not (kv["idle_after_warmup"] and kv["idle_at_end"]):
        out.append("the scheduler was not idle (or not answering) when it should have been")
    elif kv["violations_after"] > kv["violations_before"]:
        out.append(f"{kv['violations_after'] - kv['violations_before']} KV integrity violations")
    elif not kv["slots_returned"]:
        out.append("the KV slots in use when idle did not return to their start value")
    changed = [role for role, same in report["same_process"].items() if not same]
    if changed:
        out.append(f"process changed or gone: {', '.join(changed)}")
    stop = report.get("server_stop")
    if stop is not None and (stop["exit_code"] != 0 or stop["left_running"]):
        out.append(f"the server did not stop cleanly: {stop}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    with tempfile.TemporaryDirectory(prefix="srt-soak-") as log_dir:
        server: ServerProcess | None = None
        processes: dict[str, psutil.Process] = {}
        try:
            if args.url is None:
                api_key = args.api_key or secrets.token_hex(16)
                print("soak: starting srt-serve", file=sys.stderr)
                server = start_server(args.model, api_key, args.server_arg, Path(log_dir))
                base_url, main_pid = server.url, server.process.pid
            else:
                api_key, base_url = args.api_key, args.url
                port = urllib.parse.urlsplit(base_url).port
                pid = args.server_pid or (listener_pid(port) if port else None)
                if pid is None:
                    raise ValueError(f"no process listens on {base_url}; pass --server-pid")
                main_pid = pid
            processes = server_processes(main_pid)
            report = asyncio.run(soak(args, base_url, api_key, processes, seed))
        except (ValueError, RuntimeError, aiohttp.ClientError) as e:
            print(f"soak: {e}", file=sys.stderr)
            if server is not None:
                print(server.output_tail(), file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("soak: interrupted", file=sys.stderr)
            return 130
        finally:
            stopped = None
            if server is not None:
                stages = [p for role, p in processes.items() if role != "main"]
                stopped = stop_server(server, stages)
        if stopped is not None:
            report["server_stop"] = stopped
    report["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    report["args"] |= {"api_key": "***" if args.api_key else None}
    report["args"]["hostile_requests"] = [h.name for h in args.hostile_requests]
    report["failures"] = failures(report)
    report["passed"] = not report["failures"]
    emit(report, args.json)
    for failure in report["failures"]:
        print(f"soak: FAILED: {failure}", file=sys.stderr)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    # SIGTERM unwinds like ^C, so that a server the soak started is stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
