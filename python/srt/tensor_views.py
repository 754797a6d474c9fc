"""Tensors as the numpy views `srt._rust` reads and writes: their memory shared, never copied.

numpy has no bf16, so bf16 crosses as the int16 of its bits; the Rust side knows which it
takes from the entry point called.
"""

from __future__ import annotations

from typing import Any

import torch


def numpy_view(t: torch.Tensor) -> Any:
    """The numpy view a kernel reads: float32 as is, bf16 as the int16 of its bits."""
    return t.numpy() if t.dtype == torch.float32 else t.view(torch.int16).numpy()


def strided_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x (`[tokens, ...]`, at least one token) as a flat span from its first token's row to the
    end of its last, and the stride of those rows: a view when each token's elements are
    contiguous (the q, k or v columns of the fused qkv projection's output), else a copy's."""
    rows = x.reshape(x.shape[0], -1)
    stride, step = rows.stride()
    width = rows.shape[1]
    if step != 1 or stride < width:
        rows = rows.contiguous()
        stride = width
    return rows.as_strided(((rows.shape[0] - 1) * stride + width,), (1,)), stride
