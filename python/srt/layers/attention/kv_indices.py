"""The CSR index arrays of a batch over the paged KV cache, shared by the attention backends.

A batch's sequences are laid end to end: sequence i owns entries `indptr[i] : indptr[i + 1]` of
a flat array. With page size 1 a page is one KV slot, so the page table of sequence i is its row
of `ReqToTokenPool`: `kv_indices[kv_indptr[i] + p] = req_to_token[req_pool_indices[i], p]` for
every position `p < seq_lens[i]`. The same `indptr_of` gives the query offsets of an extend
batch (its lengths are the new tokens per sequence).

Offsets are built on the host from the lengths the batch already carries as Python ints, so no
step waits on the device; the indices are gathered on `req_to_token`'s device without a sync.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def indptr_of(lengths: Sequence[int]) -> torch.Tensor:
    """[len(lengths) + 1] int32 on the CPU: 0, then the running sums of `lengths`."""
    if any(n < 0 for n in lengths):
        raise ValueError(f"lengths must not be negative, got {list(lengths)}")
    indptr = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    if lengths:
        torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0, out=indptr[1:])
    return indptr


def build_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens_cpu: Sequence[int],
    kv_indptr: torch.Tensor,
) -> torch.Tensor:
    """The [sum(seq_lens_cpu)] int32 KV slots of every sequence, concatenated in batch order, on
    `req_to_token`'s device. `kv_indptr` is `indptr_of(seq_lens_cpu)`; `req_pool_indices` holds
    each sequence's row on `req_to_token`'s device."""
    batch = len(seq_lens_cpu)
    if req_to_token.dim() != 2 or req_to_token.dtype != torch.int32:
        raise ValueError("req_to_token must be a 2-D int32 [rows, max_context_len]")
    if req_pool_indices.shape != (batch,):
        raise ValueError(
            f"req_pool_indices must hold one row per sequence ({batch}), got "
            f"{tuple(req_pool_indices.shape)}"
        )
    if kv_indptr.shape != (batch + 1,):
        raise ValueError(f"kv_indptr must have {batch + 1} entries, got {tuple(kv_indptr.shape)}")
    if batch and max(seq_lens_cpu) > req_to_token.shape[1]:
        raise ValueError(
            f"a sequence of {max(seq_lens_cpu)} tokens exceeds the {req_to_token.shape[1]} "
            "columns of req_to_token"
        )
    total = sum(seq_lens_cpu)
    if int(kv_indptr[-1]) != total:
        raise ValueError(f"kv_indptr ends at {int(kv_indptr[-1])}, not at sum(seq_lens) {total}")
    device = req_to_token.device
    lens = torch.tensor(seq_lens_cpu, dtype=torch.int64).to(device, non_blocking=True)
    starts = kv_indptr[:-1].to(device=device, dtype=torch.int64, non_blocking=True)
    rows = torch.repeat_interleave(req_pool_indices.to(torch.int64), lens, output_size=total)
    columns = torch.arange(total, device=device) - torch.repeat_interleave(
        starts, lens, output_size=total
    )
    return req_to_token[rows, columns]
