"""Timing a call on a noisy machine: the best of several runs, since the noise only ever adds."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_of(
    fn: Callable[[], object], repeats: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    """The fewest seconds of `repeats` calls of `fn` after a warm-up call, by `clock`."""
    fn()
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)
