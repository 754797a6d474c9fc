"""The scheduler's compute threads on the CPU: how many, and on which cores
(`--cpu-omp-threads-bind`).

PyTorch's operators and srt's kernels share one OpenMP team (rust/kernels/src/parallel.rs). A
decode step is hundreds of short parallel regions, each ending at a barrier where every thread
waits for the slowest: a worker that the OS moves between cores, or parks behind another
process, stalls the whole step. Pinning gives each worker a core of its own for the life of the
process. `auto` uses every core the process may run on; `nobind` leaves PyTorch's defaults; a
list (`0-3,6`) names the cores, one thread each. With several tensor-parallel ranks on one
machine, each rank's process takes its share of those cores (`share`), never another's: ranks
wait for each other at every all-reduce, so one rank slowed by a shared core slows them all.
"""

from __future__ import annotations

import logging
import os

import torch

from srt import _rust
from srt.server_args_check import parse_cpu_list

logger = logging.getLogger(__name__)


def bind_cpu_threads(spec: str, share: tuple[int, int] = (0, 1)) -> list[int]:
    """Sizes PyTorch's thread team to the cores `spec` names and pins one thread to each;
    returns those cores (empty for `nobind`). With `share` (index, count), the cores are
    split into `count` equal runs and this process takes run `index` (one core, shared
    round-robin, when there are fewer cores than shares). A core this process may not run on
    is a ValueError, raised before anything changes."""
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
    cpus = share_of(cpus, *share)
    torch.set_num_threads(len(cpus))
    pinned = _rust.pin_threads(cpus)
    logger.info("CPU threads: %d, pinned to CPUs %s (%s)", pinned, cpus[:pinned], spec)
    return cpus[:pinned]


def share_of(cpus: list[int], index: int, count: int) -> list[int]:
    """Run `index` of `cpus` split into `count` equal runs (the first runs take one more when
    it does not divide); one core, round-robin, when there are fewer cores than runs."""
    if not 0 <= index < count:
        raise ValueError(f"share {index} of {count} does not exist")
    if len(cpus) < count:
        return [cpus[index % len(cpus)]]
    size, extra = divmod(len(cpus), count)
    start = index * size + min(index, extra)
    return cpus[start : start + size + (index < extra)]
