"""What each part of a server's start costs: one log line per stage, with its seconds.

    [scheduler] INFO start-up: weights read: 1.21 s
    [scheduler] INFO start-up: kernel plans: 0.01 s (5 read from /root/.cache/srt/kernel-plans)

Why: how long `srt-serve` takes to answer `/health` with 200 is the sum of several processes'
work (imports, reading and packing weights, measuring kernel plans, a warm-up generation), and
which part dominates differs by machine; a user waiting on a start can read where it goes.
"""

from __future__ import annotations

import logging
import os
import time

logger = logging.getLogger(__name__)


def log_stage(name: str, seconds: float, detail: str = "") -> None:
    """One line: stage `name` took `seconds` (and `detail`, when given, in parentheses)."""
    logger.info("start-up: %s: %.2f s%s", name, seconds, f" ({detail})" if detail else "")


class Stages:
    """The consecutive stages of one part of a start, each timed from the end of the one before
    (the first from when this was made)."""

    def __init__(self) -> None:
        self.last = time.perf_counter()

    def done(self, name: str, detail: str = "") -> None:
        """Logs the stage that just ended."""
        now = time.perf_counter()
        log_stage(name, now - self.last, detail)
        self.last = now


def process_age() -> float | None:
    """Seconds since this process began (its interpreter's start, before any import), from
    Linux's `/proc/self/stat`; None where there is none."""
    try:
        with open("/proc/self/stat") as stat:
            # Fields after the command name (which may hold spaces), from field 3; the 22nd
            # is the start time, in clock ticks since boot.
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started


def log_process_start(name: str = "launch and imports", age: float | None = None) -> None:
    """Logs the time from this process's start until now, or until `age` seconds after it
    (nothing where that is unknown)."""
    if age is None:
        age = process_age()
    if age is not None:
        log_stage(name, age)
