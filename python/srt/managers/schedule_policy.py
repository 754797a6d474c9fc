"""Which waiting requests join the next extend batch: the order (`--schedule-policy`) and the
budgets (`PrefillAdder`).

Policies, with SGLang's meanings:

- `fcfs`: first come, first served (the queue's order; retracted requests go back to its front);
- `lpm`: longest cached prefix first, so requests reuse the cache while it still holds them;
- `dfs-weight`: a depth-first walk of the cached-prefix tree, heavier subtrees (more waiting
  requests) first, so requests sharing a prefix run together;
- `lof`: longest output (max_new_tokens) first;
- `random`: a shuffle.

Cache-aware policies (`lpm`, `dfs-weight`) match every waiting request against the radix cache;
past `CACHE_AWARE_QUEUE_LIMIT` waiting requests that costs more than it saves, and they fall back
to `fcfs`, as in SGLang.
"""

from __future__ import annotations

import enum
import random
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable

import numpy as np

from srt.managers.schedule_batch import Req

CACHE_AWARE_QUEUE_LIMIT = 128
# Admission counts at most this many of a request's future tokens (SGLang's estimation clip).
CLIP_MAX_NEW_TOKENS = 4096


# A policy orders the waiting queue; `prefixes` gives each request's longest cached prefix ids
# (only cache-aware policies call it).
Policy = Callable[[Collection[Req], Callable[[Req], list[int]], random.Random], Iterable[Req]]


def _fcfs(
    queue: Collection[Req], prefix_of: Callable[[Req], list[int]], rng: random.Random
) -> Iterable[Req]:
    return queue


def _lof(
    queue: Collection[Req], prefix_of: Callable[[Req], list[int]], rng: random.Random
) -> Iterable[Req]:
    return sorted(queue, key=lambda req: -req.sampling_params.max_new_tokens)


def _random(
    queue: Collection[Req], prefix_of: Callable[[Req], list[int]], rng: random.Random
) -> Iterable[Req]:
    shuffled = list(queue)
    rng.shuffle(shuffled)
    return shuffled


def _lpm(
    queue: Collection[Req], prefix_of: Callable[[Req], list[int]], rng: random.Random
) -> Iterable[Req]:
    lengths = {id(req): len(prefix_of(req)) for req in queue}
    return sorted(queue, key=lambda req: -lengths[id(req)])


def _dfs(
    queue: Collection[Req], prefix_of: Callable[[Req], list[int]], rng: random.Random
) -> Iterable[Req]:
    return _dfs_weight(list(queue), {id(req): prefix_of(req) for req in queue})


# The `--schedule-policy` choices (`server_args.SCHEDULE_POLICIES` lists the same names, in this
# order: a test holds them equal). The cache-aware ones fall back to fcfs on long queues.
SCHEDULE_POLICIES: dict[str, Policy] = {
    "fcfs": _fcfs,
    "lpm": _lpm,
    "dfs-weight": _dfs,
    "lof": _lof,
    "random": _random,
}
CACHE_AWARE_POLICIES = frozenset({"lpm", "dfs-weight"})


def order_waiting(
    queue: Collection[Req],
    policy: str,
    prefix_len_of: Callable[[Req], list[int]],
    rng: random.Random,
) -> Iterable[Req]:
    """`queue` in the order `policy` admits it. `prefix_len_of(req)` gives the ids of a request's
    longest cached prefix (only the cache-aware policies call it). With `fcfs` this is the
    queue itself, walked lazily: a step that admits few requests from a long queue looks at
    those few."""
    if policy in CACHE_AWARE_POLICIES and len(queue) > CACHE_AWARE_QUEUE_LIMIT:
        policy = "fcfs"
    order = SCHEDULE_POLICIES.get(policy)
    if order is None:
        raise ValueError(f"unknown schedule policy {policy!r}")
    return order(queue, prefix_len_of, rng)


def _dfs_weight(queue: list[Req], prefixes: dict[int, list[int]]) -> list[Req]:
    """Depth-first over the tree that the requests' cached prefixes span: at each node, its
    subtrees, the one holding most requests first, then the requests whose prefix ends there."""
    ordered: list[Req] = []

    def walk(group: list[Req], depth: int) -> None:
        here: list[Req] = []
        children: dict[int, list[Req]] = defaultdict(list)
        for req in group:
            prefix = prefixes[id(req)]
            if len(prefix) == depth:
                here.append(req)
            else:
                children[prefix[depth]].append(req)
        for child in sorted(children.values(), key=len, reverse=True):
            walk(child, _common_prefix_len([prefixes[id(r)] for r in child], depth + 1))
        ordered.extend(here)

    walk(queue, 0)
    return ordered


def _common_prefix_len(prefixes: list[list[int]], start: int) -> int:
    """The length of the prefix all of `prefixes` share, knowing they share `start` tokens."""
    shortest = min(len(p) for p in prefixes)
    n = start
    while n < shortest and all(p[n] == prefixes[0][n] for p in prefixes):
        n += 1
    return n


class AddResult(enum.Enum):
    CONTINUE = enum.auto()  # added; try the next request
    NO_TOKEN = enum.auto()  # the KV memory budget is spent: stop admitting
    OTHER = enum.auto()  # a per-step budget (prefill tokens, chunk, rows) is spent: stop


class PrefillAdder:
    """Fills one extend step within its budgets.

    - `rem_total_tokens`: KV slots free or evictable, minus what running requests are expected
      to still produce (their remaining max_new_tokens times `new_token_ratio`); a new request
      needs its extend tokens plus all of its own remaining max_new_tokens (clipped);
    - `rem_input_tokens`: `--max-prefill-tokens` per step (a first request may exceed it alone);
    - `rem_chunk_tokens`: `--chunked-prefill-size`; a request that does not fit is cut to a chunk
      and continues in the next steps (one chunked request at a time);
    - `rem_requests`: `--max-running-requests` and free request rows.
    """

    def __init__(
        self,
        rem_total_tokens: float,
        rem_input_tokens: int,
        rem_chunk_tokens: int | None,
        rem_requests: int,
    ) -> None:
        self.rem_total_tokens = rem_total_tokens
        self.rem_input_tokens = rem_input_tokens
        self.rem_chunk_tokens = rem_chunk_tokens
        self.rem_requests = rem_requests
        self.can_run: list[Req] = []
        self.new_chunked_req: Req | None = None

    def budget_spent(self) -> AddResult | None:
        if self.rem_total_tokens <= 0:
            return AddResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or self.rem_requests <= 0:
            return AddResult.OTHER
        if self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0:
            return AddResult.OTHER
        return None

    def add_chunked_req(self, req: Req, rest: list[int], rest_len: int) -> None:
        """The next chunk of the request being prefilled in chunks (already holding its row):
        at most `rest` (what memory allows) of its `rest_len` remaining prompt tokens."""
        take = len(rest) if self.rem_chunk_tokens is None else min(len(rest), self.rem_chunk_tokens)
        self.new_chunked_req = req  # until its last chunk: then it runs
        req.extend_ids = rest[:take]
        if take == 0:
            return
        last = take == rest_len
        self._take(req, take, future_tokens=_future_tokens(req) if last else 0)
        if last:
            self.new_chunked_req = None
            self.can_run.append(req)

    def add_one_req(self, req: Req, rest: list[int]) -> AddResult:
        """Tries to admit `req`, whose `rest` tokens follow its cached prefix."""
        if (spent := self.budget_spent()) is not None:
            return spent
        total = len(rest) + _future_tokens(req)
        if total > self.rem_total_tokens:
            return AddResult.NO_TOKEN
        if len(rest) > self.rem_input_tokens and self.can_run:
            return AddResult.OTHER
        self.rem_requests -= 1
        if self.rem_chunk_tokens is not None and len(rest) > self.rem_chunk_tokens:
            req.extend_ids = rest[: self.rem_chunk_tokens]
            self._take(req, len(req.extend_ids), future_tokens=0)
            self.new_chunked_req = req
            return AddResult.OTHER  # one chunked request per step, and it fills the chunk
        req.extend_ids = rest
        self._take(req, len(rest), _future_tokens(req))
        self.can_run.append(req)
        return AddResult.CONTINUE

    def _take(self, req: Req, extend_len: int, future_tokens: int) -> None:
        self.rem_total_tokens -= extend_len + future_tokens
        self.rem_input_tokens -= extend_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_len


def _future_tokens(req: Req) -> int:
    return min(req.remaining_new_tokens, CLIP_MAX_NEW_TOKENS)


def fill_array(req: Req) -> np.ndarray:
    """A request's prompt and output ids as an int32 array (no copy of the ids)."""
    return np.frombuffer(req.fill_ids(), dtype=np.int32)


def shared_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading ids `a` and `b` have in common."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
