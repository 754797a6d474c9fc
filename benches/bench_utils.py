"""What every benchmark does with its results: print them as JSON, and write them to `--json`,
with the machine they were measured on (a figure means little without its CPU).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

# The CPU features that decide which kernels are fast: x86 vector and matrix extensions, and
# their ARM counterparts. Only those present are recorded.
RELEVANT_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "avx_vnni",
    "amx_bf16",
    "amx_int8",
    "amx_tile",
    "asimd",
    "sve",
    "bf16",
    "i8mm",
)


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """The CPU model name and the relevant feature flags of Linux's `/proc/cpuinfo` (its first
    processor; x86 calls the list `flags`, ARM `Features`)."""
    model = None
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return {"cpu_model": model, "cpu_flags": [f for f in RELEVANT_FLAGS if f in flags]}


# Read at import, before a bench pins its threads (`--cpu-omp-threads-bind` pins the calling
# thread too, and the affinity Linux reports is the calling thread's).
_USABLE_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def machine_info() -> dict[str, Any]:
    """The CPU (model, cores, relevant flags) and the PyTorch build the numbers came from.

    `torch_threads` is this process's intra-op thread count: the bench's own compute for
    in-process benches, not a server's for `bench_serving.py`."""
    import torch

    try:
        cpu = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        cpu = {"cpu_model": None, "cpu_flags": []}
    if cpu["cpu_model"] is None:
        cpu["cpu_model"] = platform.processor() or platform.machine()
    info: dict[str, Any] = {
        **cpu,
        "cpu_count": os.cpu_count(),
        "cpus_usable": _USABLE_CPUS,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        # The widest vector ISA PyTorch's CPU kernels dispatch to here (e.g. "AVX512").
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "mkl": torch.backends.mkl.is_available(),
    }
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name()
    return info


def emit(results: dict[str, Any], path: Path | None) -> None:
    """Prints `results` as JSON, with the machine under "machine", and writes it to `path`."""
    text = json.dumps({**results, "machine": machine_info()}, indent=2)
    if path is not None:
        path.write_text(text + "\n")
    print(text)
