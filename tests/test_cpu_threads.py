"""`--cpu-omp-threads-bind`: the CPU lists it takes, and the pinning of the scheduler's OpenMP
threads (checked in a fresh process each, from the kernel's own record of every thread)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from srt.server_args_check import parse_cpu_list


@pytest.mark.parametrize(
    ("spec", "cpus"),
    [("0", [0]), ("0-3", [0, 1, 2, 3]), ("5,1-2", [5, 1, 2]), ("1,1-2", [1, 2]), (" 2 ", [2])],
)
def test_cpu_lists(spec: str, cpus: list[int]) -> None:
    assert parse_cpu_list(spec) == cpus


@pytest.mark.parametrize("spec", ["", "a", "1-", "-1", "3-1", "0,,1", "1.5"])
def test_bad_cpu_lists(spec: str) -> None:
    with pytest.raises(ValueError, match=r"CPU list|runs backwards"):
        parse_cpu_list(spec)


def _run(code: str) -> str:
    """Runs `code` in a fresh interpreter (pinning changes the whole process) and returns what
    it prints."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# Prints as JSON, after `bind_cpu_threads(SPEC)` and a parallel PyTorch operator: the bound
# CPUs, the thread count, and the CPU of every thread of the process that is pinned to one CPU.
_PROBE = """
    import json
    from pathlib import Path
    import torch
    from srt.model_executor.cpu_threads import bind_cpu_threads
    cpus = bind_cpu_threads(SPEC)
    torch.ones(1 << 22).sum()  # a parallel region of PyTorch's, on the same team
    single = []
    for status in Path("/proc/self/task").glob("*/status"):
        line = next(l for l in status.read_text().splitlines() if l.startswith("Cpus_allowed_list"))
        value = line.split(":")[1].strip()
        if value.isdigit():
            single.append(int(value))
    print(json.dumps({"cpus": cpus, "threads": torch.get_num_threads(), "single": single}))
"""


def _probe(spec: str) -> dict[str, list[int] | int]:
    result: dict[str, list[int] | int] = json.loads(_run(_PROBE.replace("SPEC", repr(spec))))
    return result


def test_auto_pins_one_thread_to_each_usable_cpu() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    result = _probe("auto")
    assert result["cpus"] == allowed
    assert result["threads"] == len(allowed)
    # Every CPU has its own pinned worker (the main thread is worker 0).
    assert isinstance(result["single"], list)
    assert sorted(set(result["single"])) == allowed


def test_a_cpu_list_sizes_the_team() -> None:
    first = min(os.sched_getaffinity(0))
    result = _probe(str(first))
    assert (result["cpus"], result["threads"]) == ([first], 1)


def test_nobind_pins_nothing() -> None:
    result = _probe("nobind")
    assert result["cpus"] == []
    # No thread is held to one CPU (unless the whole process may use only one).
    assert result["single"] == [] or len(os.sched_getaffinity(0)) == 1


def test_a_cpu_outside_the_process_is_refused() -> None:
    beyond = max(os.sched_getaffinity(0)) + 1
    code = f"""
        from srt.model_executor.cpu_threads import bind_cpu_threads
        try:
            bind_cpu_threads("{beyond}")
        except ValueError as e:
            print("refused:", e)
    """
    assert "refused:" in _run(code)
