"""The tensor-parallel group of this process, as SGLang's `parallel_state` keeps it: one global
`TPGroup`, set once before the model is built (`init_tensor_parallel`), read by the layers as
they are constructed and run. Outside a tensor-parallel server it is the group of one rank,
whose collectives do nothing, so the layers run unchanged.

Two process groups over the same ranks: the device group (NCCL on CUDA, gloo on the CPU) carries
the layers' all-reduces and all-gathers; the CPU group (always gloo) carries the scheduler's
per-iteration broadcast of the messages rank 0 received and the sampled token ids, small byte
strings that need no device. Every rank issues the same collectives in the same order on each
group: that is what keeps them in step (docs/design.md §10).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    """This process's rank among `size` tensor-parallel ranks, and their process groups (None
    for a group of one)."""

    rank: int = 0
    size: int = 1
    device_group: Any = None
    cpu_group: Any = None

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sums `tensor` over the ranks, in place; returns it."""
        if self.size > 1:
            dist.all_reduce(tensor, group=self.device_group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `tensor` (one shape on all), concatenated along `dim` in rank order."""
        if self.size == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's `data` on every rank (the others pass None). Blocks until rank 0 sends."""
        if self.size == 1:
            assert data is not None, "a group of one is its own rank 0"
            return data
        if self.is_first and data is None:
            raise ValueError("rank 0 broadcasts bytes, not None")
        length = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
        dist.broadcast(length, src=0, group=self.cpu_group)
        if not length.item():
            return b""
        if data is not None:
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            payload = torch.empty(int(length.item()), dtype=torch.uint8)
        dist.broadcast(payload, src=0, group=self.cpu_group)
        return data if data is not None else payload.numpy().tobytes()

    def broadcast_ints(self, values: list[int]) -> list[int]:
        """Rank 0's `values` on every rank (each rank passes a list of the same length)."""
        if self.size == 1 or not values:
            return values
        tensor = torch.tensor(values, dtype=torch.int64)
        dist.broadcast(tensor, src=0, group=self.cpu_group)
        return [int(v) for v in tensor.tolist()]


# How long a collective may wait for the other ranks. Ranks other than 0 wait in the broadcast
# of rank 0's messages for as long as the server is idle, so this bounds no real wait; a rank
# that dies closes its connections, which fails its peers' collectives at once.
COLLECTIVE_TIMEOUT_S = 7 * 24 * 3600.0

_TP = TPGroup()


def get_tp_group() -> TPGroup:
    """This process's tensor-parallel group (one rank unless `init_tensor_parallel` ran)."""
    return _TP


def set_tp_group(group: TPGroup) -> None:
    """Makes `group` this process's tensor-parallel group (tests build models under one)."""
    global _TP
    _TP = group


def init_tensor_parallel(
    rank: int, size: int, init_addr: str, device_type: str, local_rank: int = 0
) -> TPGroup:
    """Joins the `size` ranks meeting at `init_addr` (`host:port`, rank 0's TCP store, or any
    `torch.distributed` init URL such as `file:///path`) as rank `rank`, and makes their group
    this process's. NCCL carries the layers' collectives on CUDA
    (this rank on GPU `local_rank` of its machine), gloo on the CPU; the CPU group is gloo on
    both."""
    if not 0 <= rank < size:
        raise ValueError(f"tensor-parallel rank {rank} is not in [0, {size})")
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    init_url = init_addr if "://" in init_addr else f"tcp://{init_addr}"
    dist.init_process_group(
        backend, init_method=init_url, rank=rank, world_size=size, timeout=timeout
    )
    cpu_group = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    group = TPGroup(rank, size, dist.group.WORLD, cpu_group or dist.group.WORLD)
    set_tp_group(group)
    return group


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads each rank holds: a share of them, or one (replicated) when there are fewer KV
    heads than ranks. ValueError when neither count divides the other."""
    if num_kv_heads >= tp_size:
        if num_kv_heads % tp_size:
            raise ValueError(f"{num_kv_heads} KV heads do not split over {tp_size} ranks")
        return num_kv_heads // tp_size
    if tp_size % num_kv_heads:
        raise ValueError(f"{tp_size} ranks cannot share {num_kv_heads} KV heads evenly")
    return 1
