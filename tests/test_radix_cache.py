"""The radix cache and its allocator against a plain-Python radix tree, same random operations.

The cache is fed token ids the ways srt and its callers hold them (`array('i')`, numpy int32,
lists); slots come back as `array('i')` and are compared as lists with the reference.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from srt import _rust
from srt.mem_cache import RadixCache, TokenToKVPoolAllocator

POOL = 64


class RefNode:
    def __init__(self, key: list[int], value: list[int], parent: RefNode | None, t: int) -> None:
        self.key, self.value, self.parent, self.time = key, value, parent, t
        self.children: dict[tuple[int, ...], RefNode] = {}
        self.lock = 0
        self.alive = True


class RefTree:
    """The simplest radix tree with SGLang's semantics: split on partial match, LRU leaves."""

    def __init__(self, page: int) -> None:
        self.page = page
        self.root = RefNode([], [], None, 0)
        self.clock = 0

    def nodes(self) -> list[RefNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out[1:]

    def _walk(self, key: list[int]) -> tuple[RefNode, int]:
        """Follows `key` (whole pages), splitting the last edge if matched part-way."""
        self.clock += 1
        key = key[: len(key) - len(key) % self.page]
        node, pos = self.root, 0
        while pos < len(key) and tuple(key[pos : pos + self.page]) in node.children:
            child = node.children[tuple(key[pos : pos + self.page])]
            child.time = self.clock
            n = 0
            while n < len(child.key) and pos + n < len(key) and child.key[n] == key[pos + n]:
                n += 1
            n -= n % self.page
            pos += n
            if n < len(child.key):
                upper = RefNode(child.key[:n], child.value[:n], node, self.clock)
                upper.lock = child.lock
                child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
                upper.children[tuple(child.key[: self.page])] = child
                node.children[tuple(upper.key[: self.page])] = upper
                return upper, pos
            node = child
        return node, pos

    def match(self, key: list[int]) -> tuple[list[int], RefNode]:
        node, _ = self._walk(key)
        end, slots = node, list[int]()
        while node is not self.root:
            assert node.parent is not None
            slots[:0] = node.value
            node = node.parent
        return slots, end

    def insert(self, key: list[int], value: list[int]) -> int:
        aligned = len(key) - len(key) % self.page
        node, pos = self._walk(key)
        if pos < aligned:
            self.clock += 1  # a new leaf is newer than the path it hangs from
            leaf = RefNode(key[pos:aligned], value[pos:aligned], node, self.clock)
            node.children[tuple(leaf.key[: self.page])] = leaf
        return pos

    def lock(self, node: RefNode, by: int) -> int:
        delta = 0
        while node is not self.root:
            if by > 0 and node.lock == 0:
                delta -= len(node.value)
            if by < 0 and node.lock == 1:
                delta += len(node.value)
            node.lock += by
            assert node.parent is not None
            node = node.parent
        return delta

    def evict(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            leaves = [x for x in self.nodes() if not x.children and x.lock == 0]
            if not leaves:
                break
            leaf = min(leaves, key=lambda x: x.time)
            out += leaf.value
            leaf.alive = False
            assert leaf.parent is not None
            del leaf.parent.children[tuple(leaf.key[: self.page])]
        return out


tokens = st.lists(st.integers(0, 3), max_size=14)


def _array(ids: list[int]) -> Any:
    return array("i", ids)


def _numpy(ids: list[int]) -> Any:
    return np.asarray(ids, dtype=np.int32)


def _strided(ids: list[int]) -> Any:
    """A non-contiguous int32 view: every other element of a buffer twice as long."""
    return np.repeat(np.asarray(ids, dtype=np.int32), 2)[::2]


# How a caller may hand over a run of ids: the first is what srt's scheduler passes.
containers = st.sampled_from([_array, _array, _numpy, _strided, list])


class RadixMachine(RuleBasedStateMachine):
    ops = 0

    @initialize(page=st.sampled_from([1, 1, 2]))
    def setup(self, page: int) -> None:
        self.page = page
        self.alloc = TokenToKVPoolAllocator(POOL, page)
        self.cache = RadixCache(page, self.alloc)
        self.ref = RefTree(page)
        self.handles: list[tuple[int, RefNode]] = []
        self.locked: list[tuple[int, RefNode]] = []

    def _handle(self, handle: int, node: RefNode) -> None:
        self.handles = [*self.handles[-15:], (handle, node)]

    @rule(key=tokens, wrap=containers)
    def insert(self, key: list[int], wrap: Callable[[list[int]], Any]) -> None:
        n = len(key) + (-len(key)) % self.page
        if self.alloc.available_size() < n:
            assert self.cache.evict(n) == len(self.ref.evict(n))
        full = self.alloc.alloc(n)
        if full is None:
            return
        assert full.typecode == "i"
        cached = self.cache.insert(wrap(key), wrap(full[: len(key)].tolist()))
        assert cached == self.ref.insert(key, full[: len(key)].tolist())
        # The caller frees its slots for the cached prefix and for a tail shorter than a page.
        self.alloc.free(full[:cached] + full[len(key) - len(key) % self.page :])

    @rule(key=tokens, wrap=containers)
    def match(self, key: list[int], wrap: Callable[[list[int]], Any]) -> None:
        slots, handle = self.cache.match_prefix(wrap(key))
        ref_slots, node = self.ref.match(key)
        assert slots.typecode == "i"
        assert slots.tolist() == ref_slots
        if node is self.ref.root:
            assert handle == self.cache.root_node
        self._handle(handle, node)

    @precondition(lambda self: bool(self.handles))
    @rule(data=st.data())
    def lock(self, data: st.DataObject) -> None:
        handle, node = data.draw(st.sampled_from(self.handles))
        if not node.alive:
            with pytest.raises(ValueError, match="stale"):
                self.cache.inc_lock_ref(handle)
            return
        assert self.cache.inc_lock_ref(handle) == self.ref.lock(node, +1)
        self.locked.append((handle, node))

    @precondition(lambda self: bool(self.locked))
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.locked) - 1))
        handle, node = self.locked.pop(i)
        assert self.cache.dec_lock_ref(handle) == self.ref.lock(node, -1)

    @precondition(lambda self: any(n.alive and n.lock == 0 for _, n in self.handles))
    @rule(data=st.data())
    def unlock_unlocked(self, data: st.DataObject) -> None:
        free = [(h, n) for h, n in self.handles if n.alive and n.lock == 0]
        handle, node = data.draw(st.sampled_from(free))
        if node is not self.ref.root:
            with pytest.raises(ValueError, match="not locked"):
                self.cache.dec_lock_ref(handle)

    @rule(n=st.integers(0, 20))
    def evict(self, n: int) -> None:
        assert self.cache.evict(n) == len(self.ref.evict(n))

    @rule(n=st.integers(0, 20))
    def evict_slots(self, n: int) -> None:
        slots = self.cache.evict_slots(n)
        assert slots.tolist() == self.ref.evict(n)
        self.alloc.free(slots)

    @rule()
    def reset(self) -> None:
        slots = [s for node in self.ref.nodes() for s in node.value]
        for node in self.ref.nodes():
            node.alive = False
        self.cache.reset()
        self.alloc.free(slots)
        self.ref = RefTree(self.page)
        self.handles, self.locked = [], []

    @invariant()
    def agrees_with_reference_and_allocator(self) -> None:
        if not hasattr(self, "cache"):
            return
        RadixMachine.ops += 1
        self.cache.check_invariants()
        nodes = self.ref.nodes()
        in_tree = [s for node in nodes for s in node.value]
        evictable = sum(len(x.value) for x in nodes if x.lock == 0)
        assert self.cache.evictable_size() == evictable
        assert self.cache.protected_size() == len(in_tree) - evictable
        assert self.cache.total_size() == len(in_tree)
        assert len(set(in_tree)) == len(in_tree), "a slot is in the tree twice"
        assert all(self.alloc.is_allocated(s) for s in in_tree), "a tree slot is free"
        assert self.alloc.available_size() + len(in_tree) == self.alloc.size, "slots leaked"
        assert all(s >= self.page for s in in_tree), "the padding page is in the tree"


RadixMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=70, deadline=None)
TestRadixAgainstReference = RadixMachine.TestCase


def test_stale_handles_and_unlock_below_zero_raise() -> None:
    alloc = TokenToKVPoolAllocator(16)
    cache = RadixCache(1, alloc)
    slots = alloc.alloc(3)
    assert slots is not None
    assert cache.insert([1, 2, 3], slots) == 0
    matched, node = cache.match_prefix([1, 2, 3, 4])
    assert matched == slots
    with pytest.raises(ValueError, match="not locked"):
        cache.dec_lock_ref(node)
    assert cache.evict(1) == 3
    assert alloc.available_size() == 16
    with pytest.raises(ValueError, match="stale"):
        cache.inc_lock_ref(node)
    with pytest.raises(ValueError, match="stale"):
        cache.inc_lock_ref(12345)
    root = cache.root_node
    cache.reset()
    with pytest.raises(ValueError, match="stale"):
        cache.inc_lock_ref(root)


def test_locked_prefix_survives_eviction_and_bad_arguments_raise() -> None:
    cache = RadixCache(1)
    cache.insert([5, 6, 7], [1, 2, 3])
    _, node = cache.match_prefix([5, 6])
    assert cache.inc_lock_ref(node) == -2
    assert cache.evict_slots(10) == array("i", [3])
    assert (cache.protected_size(), cache.evictable_size()) == (2, 0)
    with pytest.raises(ValueError, match="evict needs an allocator"):
        cache.evict(1)
    with pytest.raises(ValueError, match="2 tokens but 1 slots"):
        cache.insert([1, 2], [3])
    bad: Any = [1, "x"]
    with pytest.raises(TypeError):
        cache.match_prefix(bad)
    with pytest.raises(OverflowError):
        cache.insert([1], [-1])
    assert isinstance(_rust.InvariantError("x"), RuntimeError)


def test_ids_must_be_a_one_dimensional_int32_buffer_of_non_negative_ids() -> None:
    cache = RadixCache(1)
    cache.insert(array("i", [5, 6]), _numpy([1, 2]))
    row: Any = np.array([[5, 6]], dtype=np.int32)
    assert cache.match_prefix(row[0]).device_indices.tolist() == [1, 2]
    assert cache.match_prefix(array("i")).device_indices == array("i")
    with pytest.raises(TypeError, match='buffer format "q"'):
        cache.match_prefix(array("q", [5]))
    with pytest.raises(TypeError, match='buffer format "f"'):
        cache.insert(array("i", [7]), np.array([1.0], dtype=np.float32))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got str"):
        cache.match_prefix("56")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="1-D"):
        cache.match_prefix(row)
    with pytest.raises(OverflowError, match="id -3 is negative"):
        cache.insert(array("i", [7, 8]), array("i", [4, -3]))
    assert cache.total_size() == 2, "a rejected insert changed the tree"
