"""The CPU the peers run on: its model and the flags that decide which kernels an engine can use,
and the llama.cpp build options for it (or for an `SRT_CPU_ISA` cap below it)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class CpuInfo:
    model: str
    flags: list[str]
    """Those that decide which kernels an engine can use."""
    logical_cpus: int
    usable_cpus: list[int]


def cpu_info() -> CpuInfo:
    """The CPU model and its relevant flags, from /proc/cpuinfo."""
    model = ""
    flags: set[str] = set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    relevant = sorted(
        f
        for f in flags
        if f in {"avx2", "avx_vnni", "fma", "f16c"} or f.startswith(("avx512", "amx"))
    )
    return CpuInfo(model, relevant, os.cpu_count() or 1, sorted(os.sched_getaffinity(0)))


_GGML_NO_AVX = ("-DGGML_AVX=OFF", "-DGGML_AVX2=OFF", "-DGGML_FMA=OFF", "-DGGML_F16C=OFF")
_LLAMA_CAPPED_OPTIONS = {
    "scalar": ("-DGGML_NATIVE=OFF", *_GGML_NO_AVX, "-DGGML_BMI2=OFF"),
    "avx2": ("-DGGML_NATIVE=OFF",),
    "avx2_vnni": ("-DGGML_NATIVE=OFF", "-DGGML_AVX_VNNI=ON"),
}
"""ggml's CPU options for each `SRT_CPU_ISA` cap below AVX-512. Without native flags ggml
builds AVX, AVX2, FMA, F16C and BMI2 (Haswell and Zen 1 on) and no AVX-512."""


def llama_cpu_options(cap: str | None) -> tuple[str, tuple[str, ...]]:
    """The name of the llama-server build for `cap` and its CMake CPU options: native, or under
    a cap below AVX-512 the instruction sets srt may use under it, so that a capped run measures
    llama-server as on a CPU without AVX-512 (native flags would run AVX-512 and AMX code)."""
    if cap in _LLAMA_CAPPED_OPTIONS:
        return cap, _LLAMA_CAPPED_OPTIONS[cap]
    return "native", ("-DGGML_NATIVE=ON",)


def has_amx() -> bool:
    return "amx_tile" in cpu_info().flags
