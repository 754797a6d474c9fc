"""Tensor-parallel linear layers (Megatron's split, as SGLang's `linear.py` has it): each rank
holds a shard of the weight, cut from the checkpoint's tensor as it loads (`shard`), so no rank
keeps another's.

- `ColumnParallelLinear`: output rows split; each part of a fused weight (q, k, v; gate, up) is
  split on its own, so a rank's output is its heads' q, k and v (or its share of gate and up),
  and the activation after it stays sharded. KV heads fewer than the ranks are replicated: rank
  r holds KV head r // (ranks / KV heads).
- `RowParallelLinear`: input columns split (the sharded activation's), partial products summed
  over the ranks (all-reduce). A bias is added once: rank 0 holds it, the others zeros.
- `ParallelLMHead`: vocabulary rows split in equal shares (the last padded with zero rows),
  logits all-gathered and the padding cut, so every rank samples from the same full row.

With one rank every shard is the whole tensor and no collective runs: the layers are `Linear`.
GGUF blocks shard too: rows freely, columns at multiples of 32 (a block), or loading says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from srt.distributed import get_tp_group, kv_heads_per_rank
from srt.kernels.cpu.quant_kernels import QuantizedWeight
from srt.layers.lazy_tensor import LazyTensor
from srt.layers.linear import Linear
from srt.layers.quantization import CheckpointTensor

# What a rank's weight loading cuts: a tensor or blocks, or a safetensors tensor not read yet.
Loadable = CheckpointTensor | LazyTensor


@dataclass(frozen=True)
class Part:
    """One part of a column-parallel weight: its rows in the checkpoint, and which this rank
    keeps (`start`, `rows`)."""

    total: int
    start: int
    rows: int


def split_part(total: int) -> Part:
    """An even split of `total` rows over the ranks (ValueError if it is not even)."""
    tp = get_tp_group()
    if total % tp.size:
        raise ValueError(f"{total} rows do not split evenly over {tp.size} ranks")
    rows = total // tp.size
    return Part(total, tp.rank * rows, rows)


def heads_part(num_heads: int, head_dim: int) -> Part:
    """This rank's heads of `num_heads` (KV heads replicated when fewer than the ranks)."""
    tp = get_tp_group()
    local = kv_heads_per_rank(num_heads, tp.size)
    first = tp.rank * local if num_heads >= tp.size else tp.rank // (tp.size // num_heads)
    return Part(num_heads * head_dim, first * head_dim, local * head_dim)


def take_rows(tensor: Loadable, start: int, rows: int, padded: int = 0) -> CheckpointTensor:
    """Rows `start:start+rows` of `tensor` (copied out of it, so that it can be freed; only
    they are read from the file of a `LazyTensor`), then zero rows up to `padded` in all."""
    pad = max(padded - rows, 0)
    if isinstance(tensor, QuantizedWeight):
        parts = [tensor.select_rows(start, start + rows)]
        if pad:
            parts.append(QuantizedWeight.zeros(pad, tensor.fmt, tensor.in_features))
        return QuantizedWeight.cat(parts)
    shard = tensor.narrow(0, start, rows)
    if pad:
        return torch.cat([shard, shard.new_zeros(pad, *shard.shape[1:])])
    return shard if isinstance(tensor, LazyTensor) else shard.clone()


class ColumnParallelLinear(Linear):
    """Output rows split over the ranks, part by part (`parts`: the checkpoint's shards of a
    fused weight, in order, or one part)."""

    def __init__(self, in_features: int, parts: list[Part], bias: bool = True) -> None:
        super().__init__(in_features, sum(p.rows for p in parts), bias=bias)
        self.parts = parts

    @property
    def local_sizes(self) -> list[int]:
        """Rows this rank holds of each part."""
        return [p.rows for p in self.parts]

    def shard(self, tensor: Loadable, part: int | None) -> Loadable:
        """This rank's rows of checkpoint tensor `tensor` (part `part` of the weight or bias)."""
        p = self.parts[part or 0]
        if tensor.shape[0] != p.total:
            return tensor  # a wrong shape: the copy names the tensor and both shapes
        return take_rows(tensor, p.start, p.rows)


class RowParallelLinear(Linear):
    """Input columns split over the ranks; the output is all-reduced, unless `reduce_results`
    is False: then the caller sums the partial products (a mixture of experts sums its
    experts' outputs first and all-reduces once)."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, reduce_results: bool = True
    ) -> None:
        super().__init__(split_part(in_features).rows, out_features, bias=bias)
        self.tp = get_tp_group()
        self.total_in = in_features
        self.reduce_results = reduce_results

    def shard(self, tensor: Loadable, part: int | None) -> Loadable:
        """This rank's columns of the weight; the bias on rank 0, zeros elsewhere."""
        if self.tp.size == 1 or tensor.shape[-1] != self.total_in:
            return tensor
        start = self.tp.rank * self.in_features
        if isinstance(tensor, QuantizedWeight):
            return tensor.select_columns(start, start + self.in_features)
        if tensor.dim() == 1:  # the bias: summed once
            bias = tensor.load() if isinstance(tensor, LazyTensor) else tensor
            return bias if self.tp.is_first else torch.zeros_like(bias)
        if isinstance(tensor, LazyTensor):
            return tensor.narrow(1, start, self.in_features)
        return tensor.narrow(1, start, self.in_features).clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return self.tp.all_reduce(out) if self.reduce_results else out


class ParallelLMHead(Linear):
    """The vocabulary's rows in equal shares (`vocab_shard`); logits all-gathered."""

    def __init__(self, hidden_size: int, vocab_size: int) -> None:
        start, end, per_rank = vocab_shard(vocab_size)
        super().__init__(hidden_size, per_rank, bias=False)
        self.tp = get_tp_group()
        self.vocab_size, self.vocab_start, self.vocab_end = vocab_size, start, end

    def shard(self, tensor: Loadable, part: int | None) -> Loadable:
        return shard_vocab(tensor, self.vocab_size, self.vocab_start, self.vocab_end)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        if self.tp.size == 1:
            return logits
        return self.tp.all_gather(logits, dim=-1)[..., : self.vocab_size]


def vocab_shard(vocab_size: int) -> tuple[int, int, int]:
    """This rank's vocabulary rows [start, end), and the rows each rank holds (end - start
    plus zero padding on the last rank)."""
    tp = get_tp_group()
    per_rank = -(-vocab_size // tp.size)
    start = min(tp.rank * per_rank, vocab_size)
    return start, min(start + per_rank, vocab_size), per_rank


def shard_vocab(tensor: Loadable, vocab_size: int, start: int, end: int) -> Loadable:
    """Rows start:end of a [vocab, hidden] table, padded with zero rows to an equal share."""
    if get_tp_group().size == 1 or tensor.shape[0] != vocab_size:
        return tensor
    return take_rows(tensor, start, end - start, padded=-(-vocab_size // get_tp_group().size))
