"""Kernel plans measured at an earlier start, kept on disk for the next one.

Why: which path takes a quantized product of each row count (`quant_kernels`: the few-row
kernel, the one-int8 kernel or the dense matmul) is measured, at a cost of 0.05 to 1 s per
weight shape; for SmolLM2 on a busy 2-core machine that was 6 to 11 of the 25 s a start took.
A plan depends only on the machine and the shape, so it is measured once and read at every
later start.

Where: one JSON file per plan under `<cache dir>/kernel-plans/` (`SRT_CACHE_DIR`, default
`~/.cache/srt`), named by a hash of its whole key, which the file also holds: the plan's own key
(the weight's format and shape, the activations' dtype, ...) and the machine's (`machine_key`:
the CPU's model and every feature flag it reports, the instruction set srt's kernels run within
`SRT_CPU_ISA`, PyTorch's and oneDNN's vector instruction sets (which `ATEN_CPU_CAPABILITY` and
`ONEDNN_MAX_CPU_ISA` may cap), the versions of srt, its Rust extension's bytes and PyTorch, and
the compute threads). A change of any of them is another file: the plan is measured again.
Files are written to a temporary name and renamed into place, so that processes starting
together (tensor-parallel ranks, router replicas) read a whole file or none; one that does not
hold a valid plan of its key (corrupt, truncated, edited) is ignored with a log line, measured
again and written over.
`SRT_DISABLE_KERNEL_PLAN_CACHE=1` neither reads nor writes: every start measures (delete the
directory to have the next start measure afresh and keep what it measures).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import tempfile
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeVar

import torch

from srt import _rust, envs
from srt.kernels.cpu import cpu_kernels

logger = logging.getLogger(__name__)

T = TypeVar("T")
DIRECTORY = "kernel-plans"


def directory() -> Path:
    """Where plans are kept (read at each call: tests and users may move the cache)."""
    return envs.cache_dir() / DIRECTORY


@functools.cache
def _fixed_machine_key() -> dict[str, Any]:
    """The parts of `machine_key` that cannot change while a process runs."""
    model, flags = _cpu()
    return {
        "cpu": model,
        "cpu_flags": flags,
        "arch": platform.machine(),
        "srt": _distribution_version(),
        "srt_rust": _file_digest(_rust.__file__),
        "torch": torch.__version__,
        # The dense path's speed: PyTorch's vector kernels and oneDNN's, each of which an
        # environment variable may cap below the CPU's best.
        "torch_cpu": torch.backends.cpu.get_cpu_capability(),
        "onednn_isa": os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA"),
    }


def machine_key() -> dict[str, Any]:
    """What a measured plan depends on besides its own key: the CPU, the code, and the
    instruction set and threads the kernels run with now."""
    active, _ = cpu_kernels.isa()
    return {
        **_fixed_machine_key(),
        "isa": active,
        "packed_kernel": cpu_kernels.quant_packed_kernel(),
        "threads": torch.get_num_threads(),
    }


def _cpu() -> tuple[str, str]:
    """The CPU's model name and feature flags as Linux reports them for its first processor
    (x86's `model name` and `flags`; ARM's `CPU implementer`/`CPU part` and `Features`), or
    `platform`'s processor name and no flags without /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor(), ""
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    model = fields.get("model name") or " ".join(
        fields.get(name, "") for name in ("CPU implementer", "CPU part", "CPU variant")
    )
    return model, fields.get("flags") or fields.get("Features", "")


def _distribution_version() -> str:
    try:
        return version("srt")
    except PackageNotFoundError:  # run from a source tree never installed
        return "unknown"


def _file_digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def enabled() -> bool:
    return not envs.disable_kernel_plan_cache()


def _path_of(full_key: dict[str, Any]) -> Path:
    name = hashlib.sha256(json.dumps(full_key, sort_keys=True).encode()).hexdigest()[:32]
    return directory() / f"{name}.json"


def load(key: dict[str, Any], parse: Callable[[Any], T]) -> T | None:
    """The plan kept for `key` on this machine, as `parse` reads its JSON value (raising
    ValueError, TypeError or KeyError where it is no plan); None when there is none, the cache
    is off, or the file does not hold a valid plan of this key (then with a log line)."""
    if not enabled():
        return None
    full_key = {"machine": machine_key(), "plan": key}
    path = _path_of(full_key)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        logger.warning("kernel plan cache: cannot read %s (%s); measuring again", path, e)
        return None
    try:
        kept = json.loads(text)
        if kept["key"] != full_key:
            raise ValueError("it holds another key")
        return parse(kept["plan"])
    except (ValueError, TypeError, KeyError) as e:
        logger.warning(
            "kernel plan cache: ignoring %s, which holds no valid plan (%s); measuring again",
            path,
            e,
        )
        return None


def store(key: dict[str, Any], plan: Any) -> None:
    """Keeps `plan` (a JSON value) for `key` on this machine, replacing the file whole; a
    cache that cannot be written is logged and left alone (the plan is measured next time)."""
    if not enabled():
        return
    full_key = {"machine": machine_key(), "plan": key}
    path = _path_of(full_key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, staging = tempfile.mkstemp(prefix=".plan-", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"key": full_key, "plan": plan}, f, sort_keys=True)
            os.chmod(staging, 0o644)
            os.replace(staging, path)
        except BaseException:
            Path(staging).unlink(missing_ok=True)
            raise
    except OSError as e:
        logger.warning("kernel plan cache: cannot write %s (%s)", path, e)
