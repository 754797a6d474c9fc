"""Pure-Python baselines for `rust_core_radix.py`: SGLang's radix-tree algorithm and a free list.

Written in the style of SGLang's `mem_cache/radix_cache.py` (TreeNode with a children dict keyed by
the first token, a Python `_key_match` loop, `_split_node`, leaf collection and `heapq` eviction),
with lists instead of tensors as values, which only makes the baseline faster. The API is the one
of the facades in `srt.mem_cache`, so one driver runs both.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any


class TreeNode:
    """One edge of the tree: a run of tokens and their KV slots."""

    __slots__ = ("children", "key", "last_access_time", "lock_ref", "parent", "value")

    def __init__(self) -> None:
        self.children: dict[int, TreeNode] = {}
        self.parent: TreeNode | None = None
        self.key: list[int] = []
        self.value: list[int] = []
        self.lock_ref = 0
        self.last_access_time = 0

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access_time < other.last_access_time


def _key_match(key0: Sequence[int], key1: Sequence[int]) -> int:
    i = 0
    for k0, k1 in zip(key0, key1, strict=False):
        if k0 != k1:
            break
        i += 1
    return i


class PyRadixCache:
    """SGLang's radix cache algorithm in Python (page size 1)."""

    def __init__(self, token_to_kv_pool_allocator: Any = None) -> None:
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.reset()

    def reset(self) -> None:
        self.root_node = TreeNode()
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.clock = 0

    def _tick(self) -> int:
        # SGLang stamps time.monotonic(); a counter is cheaper and orders the same way.
        self.clock += 1
        return self.clock

    def match_prefix(self, key: list[int]) -> tuple[list[int], TreeNode]:
        now = self._tick()
        node = self.root_node
        node.last_access_time = now
        value: list[list[int]] = []
        while len(key) > 0 and key[0] in node.children:
            child = node.children[key[0]]
            child.last_access_time = now
            prefix_len = _key_match(child.key, key)
            if prefix_len < len(child.key):
                new_node = self._split_node(child.key, child, prefix_len)
                value.append(new_node.value)
                node = new_node
                break
            value.append(child.value)
            node = child
            key = key[prefix_len:]
        slots: list[int] = []
        for v in value:
            slots.extend(v)
        return slots, node

    def insert(self, key: list[int], value: list[int]) -> int:
        now = self._tick()
        node = self.root_node
        node.last_access_time = now
        total_prefix_length = 0
        while len(key) > 0 and key[0] in node.children:
            node = node.children[key[0]]
            node.last_access_time = now
            prefix_len = _key_match(node.key, key)
            total_prefix_length += prefix_len
            key = key[prefix_len:]
            value = value[prefix_len:]
            if prefix_len < len(node.key):
                node = self._split_node(node.key, node, prefix_len)
                break
        if len(key):
            new_node = TreeNode()
            new_node.parent = node
            new_node.key = key
            new_node.value = value
            new_node.last_access_time = self._tick()  # stamped after the walk, as in SGLang
            node.children[key[0]] = new_node
            self.evictable_size_ += len(value)
        return total_prefix_length

    def _split_node(self, key: list[int], child: TreeNode, split_len: int) -> TreeNode:
        new_node = TreeNode()
        new_node.children = {key[split_len]: child}
        new_node.parent = child.parent
        new_node.lock_ref = child.lock_ref
        new_node.last_access_time = child.last_access_time
        new_node.key = child.key[:split_len]
        new_node.value = child.value[:split_len]
        child.parent = new_node
        child.key = child.key[split_len:]
        child.value = child.value[split_len:]
        assert new_node.parent is not None
        new_node.parent.children[key[0]] = new_node
        return new_node

    def inc_lock_ref(self, node: TreeNode) -> int:
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.value)
                self.protected_size_ += len(node.value)
                delta -= len(node.value)
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.value)
                self.protected_size_ -= len(node.value)
                delta += len(node.value)
            node.lock_ref -= 1
            assert node.parent is not None
            node = node.parent
        return delta

    def _collect_leaves(self) -> list[TreeNode]:
        leaves = []
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            if not node.children:
                leaves.append(node)
            else:
                stack.extend(node.children.values())
        return leaves

    def evict(self, num_tokens: int) -> int:
        leaves = self._collect_leaves()
        heapq.heapify(leaves)
        evicted: list[int] = []
        while len(evicted) < num_tokens and leaves:
            x = heapq.heappop(leaves)
            if x is self.root_node:
                break
            if x.lock_ref > 0:
                continue
            evicted.extend(x.value)
            parent = x.parent
            assert parent is not None
            del parent.children[x.key[0]]
            self.evictable_size_ -= len(x.key)
            if len(parent.children) == 0:
                heapq.heappush(leaves, parent)
        if self.token_to_kv_pool_allocator is not None:
            self.token_to_kv_pool_allocator.free(evicted)
        return len(evicted)

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_


class PyFreeList:
    """A Python free list of KV slots with the Rust allocator's checks and order (page size 1):
    the lowest free slots first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.clear()

    def clear(self) -> None:
        self.free_slots = list(range(1, self.size + 1))
        self.allocated = bytearray(self.size + 1)

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> list[int] | None:
        if need_size > len(self.free_slots):
            return None
        free_slots = self.free_slots
        out = [heapq.heappop(free_slots) for _ in range(need_size)]
        allocated = self.allocated
        for slot in out:
            allocated[slot] = 1
        return out

    def free(self, free_index: Sequence[int]) -> None:
        allocated = self.allocated
        seen = set()
        for slot in free_index:
            if not 0 < slot <= self.size or not allocated[slot] or slot in seen:
                raise ValueError(f"cannot free slot {slot}")
            seen.add(slot)
        for slot in free_index:
            allocated[slot] = 0
        for slot in free_index:
            heapq.heappush(self.free_slots, slot)
