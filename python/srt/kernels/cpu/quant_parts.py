"""A weight of parts along its output rows, each in its own GGUF block format
(`QuantizedParts`): a fused projection whose checkpoint shards differ in format, as llama.cpp's
mixes write them (Q4_K_M: q and k in Q4_K, v in Q6_K; gate and up of one type, down of another).

Why: stacking rows of blocks (`QuantizedWeight.cat`) needs one format; dequantizing such a
weight instead would hold it in float, 4 to 8 times its blocks. Each part is a
`QuantizedWeight`, packed and planned on its own (a part's plan is its shape's, as for an
unfused weight), and the product writes each part's columns of one output. Parts next to each
other in one format are stacked into one (fewer calls).
"""

from __future__ import annotations

import torch

from srt.kernels.cpu.quant_kernels import QuantizedWeight


class QuantizedParts:
    """A [out_features, in_features] weight whose rows are `parts`' rows in order (at least two
    parts, of one in_features; neighbours of one format are stacked into one)."""

    def __init__(self, parts: list[QuantizedWeight]) -> None:
        if not parts:
            raise ValueError("a weight of parts needs at least one part")
        in_features = parts[0].in_features
        if any(p.in_features != in_features for p in parts):
            raise ValueError(
                f"parts of one weight take one in_features, got {[p.in_features for p in parts]}"
            )
        runs: list[list[QuantizedWeight]] = []
        for part in parts:
            if runs and runs[-1][0].fmt == part.fmt:
                runs[-1].append(part)
            else:
                runs.append([part])
        if len(runs) < 2:
            raise ValueError(f"parts all in {parts[0].fmt} make one weight: QuantizedWeight.cat")
        self.parts = tuple(run[0] if len(run) == 1 else QuantizedWeight.cat(run) for run in runs)
        self.in_features = in_features
        self.out_features = sum(p.out_features for p in self.parts)
        # Each part's first output row, and the end.
        self._bounds = [0]
        for part in self.parts:
            self._bounds.append(self._bounds[-1] + part.out_features)

    @property
    def shape(self) -> tuple[int, int]:
        """[out_features, in_features], as a float weight's."""
        return (self.out_features, self.in_features)

    @property
    def formats(self) -> tuple[str, ...]:
        """Each part's format, in order."""
        return tuple(p.fmt for p in self.parts)

    @property
    def nbytes(self) -> int:
        """Bytes of the parts' blocks or tiles (what a product reads)."""
        return sum(p.nbytes for p in self.parts)

    def __repr__(self) -> str:
        parts = ", ".join(f"{p.fmt} [{p.out_features}]" for p in self.parts)
        return f"QuantizedParts({parts}; {self.in_features} in)"

    def pack(self) -> bool:
        """Packs every part (`QuantizedWeight.pack`); whether they are packed."""
        return all([p.pack() for p in self.parts])

    def plan(self, dtype: torch.dtype = torch.float32, int8_offered: bool = False) -> None:
        """Plans every part's products (`QuantizedWeight.plan`)."""
        for part in self.parts:
            part.plan(dtype, int8_offered)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`x · Wᵀ + bias` for x [..., in_features], in x's dtype: each part's product (by its
        own plan) in its columns of the output."""
        if bias is not None and bias.shape != (self.out_features,):
            raise ValueError(f"expected a bias of {self.out_features}, got {tuple(bias.shape)}")
        bounds = self._bounds
        outputs = [
            part.linear(x, None if bias is None else bias[bounds[i] : bounds[i + 1]])
            for i, part in enumerate(self.parts)
        ]
        return torch.cat(outputs, dim=-1)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight as a dense [out_features, in_features] tensor of `dtype`."""
        return torch.cat([p.dequantize(dtype) for p in self.parts])
