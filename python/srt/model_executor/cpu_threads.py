"""The scheduler's compute threads on the CPU: how many, and on which cores
(`--cpu-omp-threads-bind`).

PyTorch's operators and srt's kernels share one OpenMP team (rust/core/src/parallel.rs). A
decode step is hundreds of short parallel regions, each ending at a barrier where every thread
waits for the slowest: a worker that the OS moves between cores, or parks behind another
process, stalls the whole step. Pinning gives each worker a core of its own for the life of the
process. `auto` uses every core the process may run on; `nobind` leaves PyTorch's defaults; a
list (`0-3,6`) names the cores, one thread each.
"""

from __future__ import annotations

import logging
import os

import torch

from srt import _rust
from srt.server_args import parse_cpu_list

logger = logging.getLogger(__name__)


def bind_cpu_threads(spec: str) -> list[int]:
    """Sizes PyTorch's thread team to the cores `spec` names and pins one thread to each;
    returns those cores (empty for `nobind`). A core this process may not run on is a
    ValueError, raised before anything changes."""
    if spec == "nobind":
        logger.info("CPU threads: %d, not pinned (nobind)", torch.get_num_threads())
        return []
    allowed = sorted(os.sched_getaffinity(0))
    cpus = allowed if spec == "auto" else parse_cpu_list(spec)
    outside = [cpu for cpu in cpus if cpu not in allowed]
    if outside:
        raise ValueError(
            f"--cpu-omp-threads-bind {spec}: CPUs {outside} are not among the {allowed} "
            "this process may run on"
        )
    torch.set_num_threads(len(cpus))
    pinned = _rust.pin_threads(cpus)
    logger.info("CPU threads: %d, pinned to CPUs %s (%s)", pinned, cpus[:pinned], spec)
    return cpus[:pinned]
