"""Radix cache and KV-slot allocator: srt's Rust structures against SGLang's Python algorithms.

One seeded workload, a scheduler's call pattern, run twice in the same process: once through the
facades `srt.mem_cache.RadixCache` / `TokenToKVPoolAllocator` (Rust), once through the Python
baselines in `py_baselines.py`. Only the time spent inside cache and allocator calls is counted.

The workload: a few long system prompts (200-2000 tokens) shared by hundreds of multi-turn chats;
each turn's prompt is the whole conversation so far plus a new user message, so later turns hit
the cache for everything their conversation said before. Up to 32 requests run at once; each
decode step allocates one slot per running request, evicting LRU cache leaves when the pool runs
short, and a finished request inserts its tokens, frees its duplicate slots and unlocks.

Token ids are `array('i')` throughout, as srt's scheduler holds them (its `Req` gets them from
the tokenizer in that form), and both implementations get the same array objects: the Python
baseline iterates, indexes and slices them as it would lists. Slots are whatever each allocator
hands out: `array('i')` from Rust, lists from the Python free list.

    python benches/rust_core_radix.py [--repeats 5] [--json OUT]   # prints the JSON of both

Both run `--repeats` times, interleaved, in one process; each speedup compares the fastest run
of each side (the one least disturbed by other load), and the raw times of every run are kept.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import sys
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_utils import emit
from py_baselines import PyFreeList, PyRadixCache

from srt.mem_cache import RadixCache, TokenToKVPoolAllocator

VOCAB = 32_000
POOL_SIZE = 200_000
MAX_RUNNING = 32
REPEATS = 5


@dataclass
class Workload:
    """Pre-generated token ids: system prompts and, per chat, its turns (user ids, output ids)."""

    systems: list[array[int]]
    chats: list[tuple[int, list[tuple[array[int], array[int]]]]]


@dataclass
class _Req:
    chat: int
    turn: int
    tokens: array[int]
    output: array[int]
    slots: Any
    prefix_len: int
    node: Any
    generated: int = 0


@dataclass
class _Timers:
    radix: float = 0.0
    alloc: float = 0.0
    stats: dict[str, int] = field(default_factory=dict)


def make_workload(seed: int, num_chats: int = 600, max_turns: int = 6) -> Workload:
    """About 2,000 requests over 4 shared system prompts."""
    rng = random.Random(seed)

    def ids(lo: int, hi: int) -> array[int]:
        return array("i", [rng.randrange(VOCAB) for _ in range(rng.randint(lo, hi))])

    systems = [ids(200, 2000) for _ in range(4)]
    chats = [
        (rng.randrange(len(systems)), [(ids(20, 200), ids(20, 300)) for _ in range(turns)])
        for turns in (rng.randint(1, max_turns) for _ in range(num_chats))
    ]
    return Workload(systems, chats)


def simulate(cache: Any, allocator: Any, work: Workload, seed: int) -> _Timers:
    """Runs the workload through `cache` and `allocator`, timing their calls only."""
    t = _Timers()
    clock = time.perf_counter
    history = [work.systems[system] for system, _ in work.chats]
    waiting = deque((chat, 0) for chat in range(len(work.chats)))
    random.Random(seed).shuffle(waiting)
    running: list[_Req] = []
    hits = evicted = 0

    def alloc(n: int) -> Any:
        nonlocal evicted
        start = clock()
        short = allocator.available_size() < n
        t.alloc += clock() - start
        if short:
            start = clock()
            evicted += cache.evict(n)
            t.radix += clock() - start
        start = clock()
        slots = allocator.alloc(n)
        t.alloc += clock() - start
        return slots

    while waiting or running:
        while waiting and len(running) < MAX_RUNNING:
            chat, turn = waiting[0]
            user, output = work.chats[chat][1][turn]
            prompt = history[chat] + user
            start = clock()
            prefix, node = cache.match_prefix(prompt)
            cache.inc_lock_ref(node)
            t.radix += clock() - start
            new = alloc(len(prompt) - len(prefix))
            if new is None:
                start = clock()
                cache.dec_lock_ref(node)
                t.radix += clock() - start
                break
            waiting.popleft()
            hits += len(prefix)
            running.append(_Req(chat, turn, prompt, output, prefix + new, len(prefix), node))
        new = alloc(len(running))
        if new is None:
            raise RuntimeError("the KV pool is too small for the running batch")
        still_running = []
        for req, slot in zip(running, new, strict=True):
            req.tokens.append(req.output[req.generated])
            req.slots.append(slot)
            req.generated += 1
            if req.generated < len(req.output):
                still_running.append(req)
                continue
            start = clock()
            cached = cache.insert(req.tokens, req.slots)
            t.radix += clock() - start
            start = clock()
            allocator.free(req.slots[req.prefix_len : cached])
            t.alloc += clock() - start
            start = clock()
            cache.dec_lock_ref(req.node)
            t.radix += clock() - start
            history[req.chat] = req.tokens
            if req.turn + 1 < len(work.chats[req.chat][1]):
                waiting.append((req.chat, req.turn + 1))
        running = still_running
    requests = sum(len(turns) for _, turns in work.chats)
    t.stats = {"requests": requests, "cache_hit_tokens": hits, "evicted_tokens": evicted}
    t.stats["cached_tokens_at_end"] = cache.evictable_size() + cache.protected_size()
    return t


@functools.lru_cache(maxsize=4)
def _run_both(seed: int, repeats: int) -> tuple[list[_Timers], list[_Timers]]:
    """Each implementation `repeats` times, interleaved; their stats must agree every time."""
    work = make_workload(seed)
    rust_runs, python_runs = [], []
    for _ in range(repeats):
        rust_alloc = TokenToKVPoolAllocator(POOL_SIZE)
        rust = simulate(RadixCache(1, rust_alloc), rust_alloc, work, seed)
        py_alloc = PyFreeList(POOL_SIZE)
        python = simulate(PyRadixCache(py_alloc), py_alloc, work, seed)
        if rust.stats != python.stats:
            raise RuntimeError(f"Rust and Python disagree: {rust.stats} vs {python.stats}")
        rust_runs.append(rust)
        python_runs.append(python)
    return rust_runs, python_runs


def _report(rust_s: list[float], python_s: list[float], stats: dict[str, int]) -> dict[str, Any]:
    """The speedup of the fastest run of each (the least disturbed on a shared machine), and
    that of the median runs for a sense of the noise."""
    return {
        "rust_s": round(min(rust_s), 4),
        "python_s": round(min(python_s), 4),
        "speedup": round(min(python_s) / min(rust_s), 2),
        "median_speedup": round(statistics.median(python_s) / statistics.median(rust_s), 2),
        "rust_runs_s": [round(x, 4) for x in rust_s],
        "python_runs_s": [round(x, 4) for x in python_s],
        **stats,
    }


def bench_radix(seed: int = 0, repeats: int = REPEATS) -> dict[str, Any]:
    """Time in radix-cache calls (match, lock, insert, unlock, evict): Rust vs Python."""
    rust, python = _run_both(seed, repeats)
    return _report([t.radix for t in rust], [t.radix for t in python], rust[0].stats)


def bench_allocator(seed: int = 0, repeats: int = REPEATS) -> dict[str, Any]:
    """Time in allocator calls (alloc, free, available): Rust vs a Python free list."""
    rust, python = _run_both(seed, repeats)
    return _report([t.alloc for t in rust], [t.alloc for t in python], rust[0].stats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()
    radix = bench_radix(args.seed, args.repeats)
    allocator = bench_allocator(args.seed, args.repeats)
    results = {
        "radix_speedup": radix["speedup"],
        "allocator_speedup": allocator["speedup"],
        "repeats": args.repeats,
        "radix": radix,
        "allocator": allocator,
    }
    emit(results, args.json)


if __name__ == "__main__":
    main()
