"""How checkpoint tensors go into a model's parameters: float tensors are copied in (into their
rows of a fused parameter, for a shard); GGUF blocks of a linear or embedding weight are kept as
blocks and take the parameter's place (`QuantizedShards`).

A fused weight (`qkv_proj`, `gate_up_proj`) is the checkpoint's shards stacked along the output
rows. Rows of blocks are rows of weights, so stacking the shards' block rows
(`QuantizedWeight.cat`) gives the fused weight's blocks where every shard is in one format;
shards in different formats (llama.cpp's Q4_K_M: q and k in Q4_K, v in Q6_K) stay blocks, one
part per format (`QuantizedParts`). A fused weight with a float shard (a type the loader
dequantized, or float in the file) is dequantized into its float parameter instead, with a log
line naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from srt.kernels.cpu.quant_kernels import QuantizedWeight
from srt.kernels.cpu.quant_parts import QuantizedParts
from srt.layers.linear import Linear
from srt.layers.vocab_embedding import VocabEmbedding

logger = logging.getLogger(__name__)


def copy_checked(param: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    if param.shape != tensor.shape:
        raise ValueError(
            f"{name}: checkpoint shape {tuple(tensor.shape)}, model {tuple(param.shape)}"
        )
    param.copy_(tensor)


def copy_shard(
    param: torch.Tensor, tensor: torch.Tensor, shard: int, sizes: list[int], name: str
) -> None:
    start = sum(sizes[:shard])
    copy_checked(param.narrow(0, start, sizes[shard]), tensor, name)


class QuantizedShards:
    """The GGUF blocks of one model's linear and embedding weights, gathered while a checkpoint
    loads and installed (`install`) once every tensor has come."""

    def __init__(self, model: nn.Module, shard_sizes: Callable[[str], list[int]]) -> None:
        self.model = model
        self.shard_sizes = shard_sizes  # rows of each shard of a fused parameter
        # parameter name -> shard index (0 for an unfused weight) -> (blocks, checkpoint name)
        self.parts: dict[str, dict[int, tuple[QuantizedWeight, str]]] = {}
        self.fused: set[str] = set()

    def _module_of(self, target: str) -> nn.Module:
        return self.model.get_submodule(target.rpartition(".")[0])

    def can_hold(self, target: str) -> bool:
        """Whether parameter `target` may be replaced by blocks: the weight of a `Linear` or a
        `VocabEmbedding` on the CPU (the kernels' device)."""
        if not target.endswith(".weight"):
            return False
        module = self._module_of(target)
        if not isinstance(module, Linear | VocabEmbedding):
            return False
        return module.weight is not None and module.weight.device.type == "cpu"

    def add(self, target: str, shard: int | None, blocks: QuantizedWeight, name: str) -> None:
        """Holds `blocks`, checkpoint tensor `name`: parameter `target`, or its shard `shard`."""
        self.parts.setdefault(target, {})[shard or 0] = (blocks, name)
        if shard is not None:
            self.fused.add(target)

    def install(self, params: dict[str, nn.Parameter]) -> None:
        """Puts every gathered weight in place of its parameter (a fused one with a float shard
        is dequantized into it)."""
        for target, parts in self.parts.items():
            if target not in self.fused:
                self._set(target, parts[0][0])
                continue
            sizes = self.shard_sizes(target)
            formats = sorted({blocks.fmt for blocks, _ in parts.values()})
            if len(parts) == len(sizes):
                ordered = [parts[i] for i in range(len(sizes))]
                for (blocks, name), rows in zip(ordered, sizes, strict=True):
                    if blocks.out_features != rows:
                        raise ValueError(
                            f"{name}: checkpoint has {blocks.out_features} rows, model {rows}"
                        )
                shards = [blocks for blocks, _ in ordered]
                held = QuantizedWeight.cat(shards) if len(formats) == 1 else QuantizedParts(shards)
                self._set(target, held)
                continue
            param = params[target]
            logger.info(
                "%s: a shard is float, the others in %s: dequantized to %s",
                target,
                " and ".join(formats),
                param.dtype,
            )
            with torch.no_grad():
                for shard, (blocks, name) in parts.items():
                    copy_shard(param, blocks.dequantize(param.dtype), shard, sizes, name)

    def _set(self, target: str, blocks: QuantizedWeight | QuantizedParts) -> None:
        module = self._module_of(target)
        assert isinstance(module, Linear | VocabEmbedding), "checked by can_hold"
        try:
            if isinstance(module, Linear):
                module.set_quantized(blocks)
            else:
                assert isinstance(blocks, QuantizedWeight), "an embedding is never fused"
                module.set_quantized(blocks)
        except ValueError as e:
            raise ValueError(f"{target}: {e}") from None
