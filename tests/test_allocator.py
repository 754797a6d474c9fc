"""The KV-slot allocator against a plain-Python free list, with the same random operations."""

from __future__ import annotations

import heapq
from array import array

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from srt.mem_cache import TokenToKVPoolAllocator

SIZE = 40


class RefAllocator:
    """Free pages in a heap: alloc takes the lowest ones, page 0 is padding."""

    def __init__(self, size: int, page_size: int) -> None:
        self.page_size = page_size
        self.num_pages = size // page_size
        self.free_pages = list(range(1, self.num_pages + 1))

    def alloc(self, n: int) -> list[int] | None:
        pages = n // self.page_size
        if pages > len(self.free_pages):
            return None
        out = [heapq.heappop(self.free_pages) for _ in range(pages)]
        return [p * self.page_size + i for p in out for i in range(self.page_size)]

    def free(self, slots: list[int]) -> None:
        for slot in slots:
            page = slot // self.page_size
            if page not in self.free_pages:
                heapq.heappush(self.free_pages, page)


class AllocatorMachine(RuleBasedStateMachine):
    ops = 0

    def __init__(self) -> None:
        super().__init__()
        self.held: list[int] = []

    @initialize(page_size=st.sampled_from([1, 1, 2, 4]))
    def setup(self, page_size: int) -> None:
        self.page_size = page_size
        self.alloc = TokenToKVPoolAllocator(SIZE, page_size)
        self.ref = RefAllocator(SIZE, page_size)

    @rule(pages=st.integers(0, 12))
    def alloc_pages(self, pages: int) -> None:
        n = pages * self.page_size
        got, want = self.alloc.alloc(n), self.ref.alloc(n)
        assert (got if got is None else got.tolist()) == want
        if got is not None:
            assert got.typecode == "i"
            assert not set(got) & set(self.held), "a slot was handed out twice"
            self.held += got

    @precondition(lambda self: self.page_size > 1)
    @rule(n=st.integers(1, 7))
    def alloc_part_of_a_page(self, n: int) -> None:
        if n % self.page_size:
            with pytest.raises(ValueError, match="whole number of pages"):
                self.alloc.alloc(n)

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def free_pages(self, data: st.DataObject) -> None:
        pages = sorted({s // self.page_size for s in self.held})
        chosen = data.draw(st.lists(st.sampled_from(pages), min_size=1, unique=True))
        # Name each chosen page through one or more of its slots, in a random order.
        slots = [
            p * self.page_size + i
            for p in chosen
            for i in data.draw(
                st.lists(st.integers(0, self.page_size - 1), min_size=1, max_size=2, unique=True)
            )
        ]
        slots = data.draw(st.permutations(slots))
        self.alloc.free(array("i", slots))
        self.ref.free(slots)
        self.held = [s for s in self.held if s // self.page_size not in chosen]

    @rule(data=st.data())
    def bad_free(self, data: st.DataObject) -> None:
        limit = (SIZE // self.page_size + 1) * self.page_size + 3
        not_held = [s for s in range(limit) if s not in self.held]
        bad = data.draw(st.sampled_from(not_held))
        good = data.draw(st.lists(st.sampled_from(self.held), unique=True)) if self.held else []
        batch = data.draw(st.permutations([*good, bad]))
        before = (self.alloc.available_size(), [self.alloc.is_allocated(s) for s in self.held])
        with pytest.raises(ValueError, match=f"slot {bad}:"):
            self.alloc.free(array("i", batch))
        after = (self.alloc.available_size(), [self.alloc.is_allocated(s) for s in self.held])
        assert after == before

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def double_free_in_one_call(self, data: st.DataObject) -> None:
        slot = data.draw(st.sampled_from(self.held))
        with pytest.raises(ValueError, match=f"slot {slot}: named twice"):
            self.alloc.free([slot, slot])

    @rule()
    def clear(self) -> None:
        self.alloc.clear()
        self.ref = RefAllocator(SIZE, self.page_size)
        self.held = []

    @invariant()
    def matches_the_reference(self) -> None:
        if not hasattr(self, "alloc"):
            return
        AllocatorMachine.ops += 1
        assert self.alloc.available_size() == len(self.ref.free_pages) * self.page_size
        assert self.alloc.available_size() + len(self.held) == self.alloc.size
        assert len(set(self.held)) == len(self.held)
        assert all(s >= self.page_size for s in self.held), "the padding page was handed out"
        assert all(self.alloc.is_allocated(s) for s in self.held)
        assert not self.alloc.is_allocated(0)


AllocatorMachine.TestCase.settings = settings(
    max_examples=250, stateful_step_count=60, deadline=None
)
TestAllocatorAgainstReference = AllocatorMachine.TestCase


def test_double_free_names_the_slot_and_frees_nothing() -> None:
    alloc = TokenToKVPoolAllocator(8)
    slots = alloc.alloc(3)
    assert slots == array("i", [1, 2, 3])
    alloc.free([1])
    with pytest.raises(ValueError, match="slot 1: not allocated"):
        alloc.free([2, 1])
    assert alloc.is_allocated(2)
    assert alloc.available_size() == 6


def test_shortfall_is_none_and_padding_is_never_handed_out() -> None:
    alloc = TokenToKVPoolAllocator(4)
    assert alloc.alloc(5) is None
    assert alloc.available_size() == 4
    assert alloc.alloc(4) == array("i", [1, 2, 3, 4])
    assert alloc.alloc(1) is None
    with pytest.raises(ValueError, match="slot 0: the reserved padding slot"):
        alloc.free([0])
