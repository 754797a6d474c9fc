"""Prefix-sharing (cascade) decode attention equals plain attention over each whole sequence:
the planner finds the groups the radix cache creates, the kernel matches SDPA (GQA and not,
groups of different sizes, a request outside any group), and a model decoding with it gives the
logits and greedy tokens of the plain path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from runner_helpers import SlotBook, make_runner, take_rows

from srt.layers.attention.cascade import (
    build_cascade_metadata,
    cascade_decode,
    plan_shared_prefixes,
)
from srt.layers.attention.cpu_backend import CpuAttnBackend


def rows_with_prefixes(
    layout: list[tuple[int, int]], lens: list[int], generator: torch.Generator
) -> torch.Tensor:
    """Request rows of distinct random slots, except that the requests of each (first, shared)
    in `layout` copy the first `shared` slots of request `first`."""
    width = max(lens)
    slots = torch.randperm(len(lens) * width, generator=generator) + 1
    rows = slots.view(len(lens), width).to(torch.int32)
    for i, (first, shared) in enumerate(layout):
        rows[i, :shared] = rows[first, :shared]
    return rows


def test_plan_groups_by_shared_slots() -> None:
    generator = torch.Generator().manual_seed(0)
    # 0-2 share 40 slots; 3-4 share 30; 5 shares nothing; 6 shares only 2 slots with 0.
    layout = [(0, 0), (0, 40), (0, 40), (3, 0), (3, 30), (5, 0), (0, 2)]
    lens = [50, 45, 60, 31, 70, 20, 50]
    rows = rows_with_prefixes(layout, lens, generator)
    assert plan_shared_prefixes(rows, lens, min_saved=1) == [([0, 1, 2], 40), ([3, 4], 30)]
    # Request 3 is 31 tokens long: its last token is its own, so the prefix stops at 30.
    lens[3] = 30
    assert plan_shared_prefixes(rows, lens, min_saved=1) == [([0, 1, 2], 40), ([3, 4], 29)]
    # Groups that save too few tokens are not worth their kernels.
    assert plan_shared_prefixes(rows, lens, min_saved=60) == [([0, 1, 2], 40)]
    assert plan_shared_prefixes(rows[:1], lens[:1], min_saved=1) == []


def test_plan_prefers_the_split_that_saves_most() -> None:
    """All six share 8 slots; two triples share 50 each: two groups of 50 beat one of 8."""
    generator = torch.Generator().manual_seed(1)
    layout = [(0, 0), (0, 50), (0, 50), (0, 8), (3, 50), (3, 50)]
    lens = [60] * 6
    rows = rows_with_prefixes(layout, lens, generator)
    assert plan_shared_prefixes(rows, lens, min_saved=1) == [([0, 1, 2], 50), ([3, 4, 5], 50)]
    # Unless only the short shared prefix is long enough to count.
    rows[[1, 2, 4, 5], 9:] = rows_with_prefixes([(0, 0)] * 4, [60] * 4, generator)[:, 9:] + 1000
    assert plan_shared_prefixes(rows, lens, min_saved=1) == [([0, 1, 2, 3, 4, 5], 8)]


@pytest.mark.parametrize(("heads", "kv_heads"), [(6, 2), (4, 4)])
def test_cascade_matches_sdpa(heads: int, kv_heads: int) -> None:
    generator = torch.Generator().manual_seed(2)
    head_dim, num_slots = 16, 1200
    layout = [(0, 0), (0, 100), (0, 100), (0, 100), (4, 0), (4, 61), (6, 0)]
    lens = [120, 101, 150, 111, 90, 62, 75]
    rows = rows_with_prefixes(layout, lens, generator)
    k_buffer = torch.randn(num_slots, kv_heads, head_dim, generator=generator)
    v_buffer = torch.randn(num_slots, kv_heads, head_dim, generator=generator)
    q = torch.randn(len(lens), heads, head_dim, generator=generator)
    groups = plan_shared_prefixes(rows, lens, min_saved=1)
    assert groups == [([0, 1, 2, 3], 100), ([4, 5], 61)]
    metadata = build_cascade_metadata(rows, torch.tensor(lens), groups)
    ours = cascade_decode(q, k_buffer, v_buffer, metadata, scale=0.25)
    for i, n in enumerate(lens):
        slots = rows[i, :n].long()
        expected = F.scaled_dot_product_attention(
            q[i][:, None],
            k_buffer[slots].transpose(0, 1),
            v_buffer[slots].transpose(0, 1),
            scale=0.25,
            enable_gqa=True,
        )
        torch.testing.assert_close(ours[i], expected.flatten(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_model_decodes_the_same_with_and_without_cascade(
    arch: str, tiny_model_factory: Callable[[str], Path]
) -> None:
    """Five requests: three and two reuse a cached prompt's slots (as the radix cache hands
    them out), a sixth shares nothing; eight greedy decode steps on both paths."""
    runner = make_runner(tiny_model_factory(arch), max_total_tokens=512)
    assert isinstance(runner.attn_backend, CpuAttnBackend)
    # The cascade takes the place of gathering K/V; in place, every sequence reads its rows.
    runner.attn_backend.decode_in_place = False
    pool = runner.req_to_token_pool
    book = SlotBook(runner)
    rows = take_rows(runner, 6)
    generator = torch.Generator().manual_seed(3)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 200, (n,), generator=generator).tolist()

    runner.forward(runner.prepare_extend(rows[:1], [0], [ids(24)], book.take(24)))
    runner.forward(runner.prepare_extend(rows[3:4], [0], [ids(17)], book.take(17)))
    shares = [(rows[1], rows[0], 24), (rows[2], rows[0], 20), (rows[4], rows[3], 17)]
    for row, source, shared in shares:
        pool.write(row, 0, pool.req_to_token[source, :shared].clone())
    new = [ids(n) for n in (1, 3, 6, 1, 4, 9)]
    prefix_lens = [23, 24, 20, 16, 17, 0]
    logits = runner.forward(
        runner.prepare_extend(rows, prefix_lens, new, book.take(sum(map(len, new))))
    )
    seq_lens = [p + len(n) for p, n in zip(prefix_lens, new, strict=True)]
    for _ in range(8):
        next_ids = logits.argmax(-1).tolist()
        seq_lens = [n + 1 for n in seq_lens]
        batch = runner.prepare_decode(rows, seq_lens, next_ids, book.take(len(rows)))
        runner.attn_backend.cascade_min_saved = None
        plain = runner.forward(batch)
        assert runner.attn_backend._cascade is None
        runner.attn_backend.cascade_min_saved = 1
        logits = runner.forward(batch)
        assert runner.attn_backend._cascade is not None
        assert len(runner.attn_backend._cascade.prefixes) == 2
        torch.testing.assert_close(logits, plain, rtol=1e-5, atol=1e-5)
        assert logits.argmax(-1).tolist() == plain.argmax(-1).tolist()
