"""The KV memory of the model: which slots a sequence uses, and the K/V tensors of every slot.

`ReqToTokenPool` maps (request row, token position) to a KV slot. `KVPool` holds, per layer, K and
V tensors indexed by slot; slot 0 is padding and never holds a real token. Which slots and rows
are free is the scheduler's business (`allocator`, `req_rows`), not this module's: the model
runner owns these tensors and is their one writer.
"""

from __future__ import annotations

import contextlib
import math
import mmap

import torch

from srt.mem_cache.row_scatter import RowScatter, scatter_min_rows, scatter_takes


class ReqToTokenPool:
    """One row per running request (`size` rows, handed out by `req_rows.ReqRowAllocator`):
    position -> KV slot.

    One more row, `padding_row`, is never handed out and stays all zeros (every position maps to
    the padding slot 0): the rows that pad a decode batch up to a CUDA graph's size point at it.
    """

    def __init__(self, size: int, max_context_len: int, device: torch.device) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.padding_row = size
        self.req_to_token = torch.zeros(
            (size + 1, max_context_len), dtype=torch.int32, device=device
        )

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Records that positions start.. of `row` live in `slots`."""
        if not 0 <= row < self.size:
            raise ValueError(f"request row {row} is not one of the pool's {self.size} rows")
        self.req_to_token[row, start : start + slots.numel()] = slots.to(torch.int32)

    def write_tokens(self, rows: list[int], positions: list[int], slots: torch.Tensor) -> None:
        """Records that position `positions[i]` of row `rows[i]` lives in `slots[i]`, for every
        new token of a batch in one indexed write."""
        if not rows:
            return
        if not 0 <= min(rows) <= max(rows) < self.size:
            raise ValueError(f"request rows {sorted(set(rows))} are not all of the pool's rows")
        device = self.req_to_token.device
        index = (
            torch.tensor(rows, dtype=torch.int64, device=device),
            torch.tensor(positions, dtype=torch.int64, device=device),
        )
        self.req_to_token.index_put_(index, slots.to(device=device, dtype=torch.int32))


class KVPool:
    """Per-layer K and V tensors of shape [num_slots + 1, num_kv_heads, head_dim]."""

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_slots = num_slots
        shape = (num_slots + 1, num_kv_heads, head_dim)  # + the padding slot 0
        self.k_buffers = [_zeros(shape, dtype, device) for _ in range(num_layers)]
        self.v_buffers = [_zeros(shape, dtype, device) for _ in range(num_layers)]
        # The row scatter of each layer's K and V buffers, where it takes them.
        self._scatters: list[tuple[RowScatter, RowScatter]] | None = None
        if scatter_takes(self.k_buffers[0]):
            self._scatters = [
                (RowScatter(k), RowScatter(v))
                for k, v in zip(self.k_buffers, self.v_buffers, strict=True)
            ]

    def prefault(self, slots: int) -> None:
        """Writes the first `slots` slots of every buffer (and the padding slot), zeros over
        zeros, so that their pages are resident before any request stores into them. Call it
        before the pool's first use: it may write only slots that no request has held.

        Why: the allocator hands out the lowest free slots first, so these are the slots the
        first requests of a fresh server fill; on the CPU each first touch of the lazily mapped
        pages (`_zeros`) is a fault, which a virtual machine can make costly. Measured on a KVM
        guest (AMD EPYC, Zen 4): the first 16,384 slots of SmolLM2's pool (377 MB) took
        0.65 s to write here; 32 requests of 256 + 32 tokens on a fresh server, alternated six
        times, made 159-180 output tokens a second without them written (mean 168), 170-197
        with (mean 183)."""
        if self.k_buffers[0].device.type != "cpu":
            return  # `torch.zeros` wrote every page
        rows = min(slots, self.num_slots) + 1
        for buffer in self.k_buffers + self.v_buffers:
            buffer[:rows].zero_()

    @staticmethod
    def bytes_per_slot(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * itemsize

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Writes the K/V rows of new tokens ([tokens, kv_heads, head_dim]) into `slots` (int64).

        k and v are usually strided views into the fused qkv projection. On the CPU, float32
        and bf16 rows from `scatter_min_rows` on take srt's row scatter (`row_scatter.py`);
        everything else takes `index_copy_`, not an indexed assignment, whose CPU `index_put_`
        copies strided rows an order of magnitude slower.
        """
        k_buffer, v_buffer = self.k_buffers[layer_id], self.v_buffers[layer_id]
        if (
            self._scatters is not None
            and slots.is_cpu
            and slots.dtype == torch.int64
            and scatter_takes(k_buffer, k, v)
            and slots.numel() >= scatter_min_rows(k.dtype, k_buffer.shape[1:])
        ):
            k_scatter, v_scatter = self._scatters[layer_id]
            k_scatter(slots, k)
            v_scatter(slots, v)
            return
        k_buffer.index_copy_(0, slots, k)
        v_buffer.index_copy_(0, slots, v)

    def gather(self, layer_id: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V rows of `slots` (int64), each [len(slots), kv_heads, head_dim]."""
        keys = gather_rows(self.k_buffers[layer_id], slots)
        return keys, gather_rows(self.v_buffers[layer_id], slots)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`torch.zeros(shape, dtype=dtype, device=device)`; on the CPU, in anonymous pages that the
    kernel maps zeroed at their first touch rather than written now. Why: the CPU default KV
    cache (2 GiB) took a second of a 2-core start to write, and was all resident from then on,
    where a server touches only the slots its requests fill (and the first ones written at its
    start, `KVPool.prefault`). Private pages, not `mmap`'s default
    shared ones: a first touch of shared anonymous memory costs twice as much (storing the K/V
    of 2048 new tokens in 30 layers of SmolLM2's pool: 55 ms shared, 29 ms private, 6 ms once
    touched, Zen 4). Huge pages where the kernel has them: a first touch then maps and zeroes
    2 MiB at once, not 4 KiB (the same store: 29 -> 9-14 ms), and a server holds at most one
    partly used huge page per buffer more than it fills."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    count = math.prod(shape)
    size = count * torch.empty((), dtype=dtype).element_size()
    pages = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # A kernel built without transparent huge pages refuses the advice; 4 KiB pages serve.
    with contextlib.suppress(OSError):
        pages.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(pages, dtype=dtype, count=count).view(shape)


def gather_rows(buffer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """`buffer[slots]` for a [slots, kv_heads, head_dim] buffer, selected as rows of its 2-D view:
    on the CPU, `index_select` copies whole rows faster than 3-D slices (2.6x for a decode batch
    of 32 sequences of 44 SmolLM2 tokens)."""
    return buffer.flatten(1).index_select(0, slots).view(-1, *buffer.shape[1:])
