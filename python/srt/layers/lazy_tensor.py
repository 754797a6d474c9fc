"""A checkpoint tensor not read yet (`LazyTensor`): what a tensor-parallel rank's weight loading
gets from a safetensors file, so that it reads only its own shard's bytes (`narrow`) rather than
every rank reading every tensor whole (`layers/parallel_linear.py` cuts; `models/llama.py`
reads whatever is left whole)."""

from __future__ import annotations

from typing import Any

import torch


class LazyTensor:
    """A tensor of a safetensors file opened with `framework="pt"` (its `get_slice` handle):
    its shape now, its values when asked, all of them or a range along one dimension."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self.shape = tuple(int(n) for n in handle.get_shape())

    def dim(self) -> int:
        return len(self.shape)

    def load(self) -> torch.Tensor:
        """All of it."""
        return self.narrow(0, 0, self.shape[0]) if self.shape else self._handle[...]

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        """Elements start..start+length along `dim` (all along the others), read from the file."""
        if not 0 <= dim < self.dim() or not 0 <= start <= start + length <= self.shape[dim]:
            raise ValueError(
                f"cannot narrow a {list(self.shape)} tensor to {start}+{length} "
                f"along dimension {dim}"
            )
        index = [slice(None)] * self.dim()
        index[dim] = slice(start, start + length)
        tensor: torch.Tensor = self._handle[tuple(index)]
        return tensor
