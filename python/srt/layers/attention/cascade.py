"""Prefix-sharing ("cascade") decode attention for the cpu backend.

Requests whose `ReqToTokenPool` rows start with the same KV slots share those tokens' K/V: the
radix cache hands one cached prefix's slots to every request that matched it. A decode batch is
split once per forward pass into groups that share a prefix (`plan_shared_prefixes`); each layer
then attends every group's prefix once, as one matrix product of all the group's query rows
against the prefix K/V gathered once, attends every request's own suffix (the tokens after its
group's prefix, or all of its tokens outside any group) in one padded batch, and merges the two
partial softmaxes by their running maxima and sums. The result equals attention over the whole
sequence up to float rounding.

What must stay true: a group's prefix ends at least one token before each member's length (the
token just written is always in the suffix), so every suffix has a real token and its maximum is
finite; a request belongs to at most one group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from srt.mem_cache.memory_pool import gather_rows

# A group pays for its extra kernels once it saves gathering and attending this many tokens per
# layer: (members - 1) * prefix length.
MIN_SAVED_TOKENS = 64


@dataclass(eq=False)
class SharedPrefix:
    members: torch.Tensor  # [n] int64, batch indices of the requests that share it
    slots: torch.Tensor  # [prefix_len] int64, the shared KV slots


@dataclass(eq=False)
class CascadeMetadata:
    prefixes: list[SharedPrefix]
    suffix_slots: torch.Tensor  # [batch * max_suffix] int64, each request's slots after its prefix
    suffix_mask: torch.Tensor  # [batch, 1, 1, max_suffix] additive, -inf past a suffix's end


def plan_shared_prefixes(
    rows: torch.Tensor, seq_lens: list[int], min_saved: int = MIN_SAVED_TOKENS
) -> list[tuple[list[int], int]]:
    """(members, prefix length) per group of rows of `rows` ([batch, >= max(seq_lens)] slots, on
    the CPU) that start with the same slots, chosen to maximize the tokens saved, each saving at
    least `min_saved`. A prefix stops one token short of its shortest member."""
    _, groups = _plan(rows, seq_lens, list(range(len(seq_lens))), 0, min_saved)
    return groups


def _plan(
    rows: torch.Tensor, seq_lens: list[int], members: list[int], start: int, min_saved: int
) -> tuple[int, list[tuple[list[int], int]]]:
    """The best (saved tokens, groups) for `members`, which share their first `start` slots."""
    limit = min(seq_lens[i] for i in members) - 1
    if len(members) < 2 or limit <= start:
        return 0, []
    index = torch.tensor(members)
    block = rows[index, start:limit]
    differs = (block != block[:1]).any(0)
    depth = int(differs.int().argmax()) + start if bool(differs.any()) else limit
    saved = (len(members) - 1) * depth
    best = (saved, [(members, depth)]) if depth > 0 and saved >= min_saved else (0, [])
    if depth == limit:
        return best
    parts: dict[int, list[int]] = {}
    for i, slot in zip(members, rows[index, depth].tolist(), strict=True):
        parts.setdefault(slot, []).append(i)
    split_saved, split_groups = 0, []
    for part in parts.values():
        part_saved, part_groups = _plan(rows, seq_lens, part, depth, min_saved)
        split_saved += part_saved
        split_groups += part_groups
    return (split_saved, split_groups) if split_saved > best[0] else best


def build_cascade_metadata(
    rows: torch.Tensor, seq_lens: torch.Tensor, groups: list[tuple[list[int], int]]
) -> CascadeMetadata:
    """The slots and mask of a cascade decode batch. rows: [batch, >= max len] slots of each
    request, seq_lens: [batch], on the batch's device."""
    device = rows.device
    prefix_lens = torch.zeros_like(seq_lens)
    prefixes = []
    for members, length in groups:
        index = torch.tensor(members, dtype=torch.int64, device=device)
        prefix_lens[index] = length
        prefixes.append(SharedPrefix(index, rows[members[0], :length].long()))
    suffix_lens = seq_lens - prefix_lens
    max_suffix = int(suffix_lens.max())
    offsets = torch.arange(max_suffix, device=device)
    valid = offsets[None, :] < suffix_lens[:, None]
    columns = torch.where(valid, prefix_lens[:, None] + offsets[None, :], 0)
    slots = rows.gather(1, columns).flatten().long()
    mask = torch.zeros(valid.shape, dtype=torch.float32, device=device)
    mask.masked_fill_(~valid, float("-inf"))
    return CascadeMetadata(prefixes, slots, mask[:, None, None, :])


def _partial_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unnormalized softmax(q k^T) v over the last two dims, with its row maxima and sums
    (float32): q [..., rows, d], k/v [..., len, d]."""
    scores = torch.matmul(q, k.transpose(-1, -2)).float().mul_(scale)
    if mask is not None:
        scores += mask
    maxima = scores.amax(-1, keepdim=True)
    weights = scores.sub_(maxima).exp_()
    sums = weights.sum(-1, keepdim=True)
    out = torch.matmul(weights.to(v.dtype), v).float()
    return out, maxima, sums


def cascade_decode(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    metadata: CascadeMetadata,
    scale: float,
) -> torch.Tensor:
    """q: [batch, heads, head_dim]; k/v_buffer: [slots, kv_heads, head_dim]. Returns
    [batch, heads * head_dim]."""
    batch, heads, head_dim = q.shape
    kv_heads = k_buffer.shape[1]
    group = heads // kv_heads
    # Query head h reads KV head h // group: [batch, kv_heads, group, head_dim].
    queries = q.reshape(batch, kv_heads, group, head_dim)
    shape = (batch, -1, kv_heads, head_dim)
    keys = gather_rows(k_buffer, metadata.suffix_slots).view(shape).transpose(1, 2)
    values = gather_rows(v_buffer, metadata.suffix_slots).view(shape).transpose(1, 2)
    out, maxima, sums = _partial_attention(queries, keys, values, metadata.suffix_mask, scale)
    for prefix in metadata.prefixes:
        n = prefix.members.numel()
        # All members' query rows of a KV head against the prefix: [kv_heads, n * group, d].
        rows = queries[prefix.members].transpose(0, 1).reshape(kv_heads, n * group, head_dim)
        prefix_k = gather_rows(k_buffer, prefix.slots).transpose(0, 1)
        prefix_v = gather_rows(v_buffer, prefix.slots).transpose(0, 1)
        partial = _partial_attention(rows, prefix_k, prefix_v, None, scale)
        # Back to [n, kv_heads, group, ...], the members' order in `out`.
        p_out, p_max, p_sum = (t.view(kv_heads, n, group, -1).transpose(0, 1) for t in partial)
        s_out, s_max, s_sum = out[prefix.members], maxima[prefix.members], sums[prefix.members]
        merged_max = torch.maximum(s_max, p_max)
        s_scale, p_scale = (s_max - merged_max).exp_(), (p_max - merged_max).exp_()
        out[prefix.members] = s_out * s_scale + p_out * p_scale
        sums[prefix.members] = s_sum * s_scale + p_sum * p_scale
    return out.div_(sums).to(q.dtype).reshape(batch, heads * head_dim)
