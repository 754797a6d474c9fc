"""The models' linear layers: `F.linear`, except float32 on the CPU, where the weights are laid
out for the CPU once after loading (`prepare_for_device`).

Why: on the CPU, `F.linear` goes to MKL's sgemm, which reaches only a third to a half of the
machine's float32 throughput at decode-sized batches (a few to a few hundred rows), worst on the
wide lm_head. oneDNN's inner product on a copy of the weight reordered into its blocked layout
ahead of time runs the same float32 arithmetic (no reduced precision) up to twice as fast there,
and its result for a row does not depend on the other rows of the batch.

A single row (batch-1 decode) is a matrix-vector product bound by memory, where MKL's path over
the plain weight beats oneDNN's; it keeps that path. Its speed depends on the plain weight's
layout: with fewer inputs than outputs (the lm_head, q/k/v, gate/up), MKL streams a weight stored
input-major (column-major [out, in], i.e. the transpose stored contiguously) up to twice as fast
as one stored row-major, so such weights are re-laid out that way; values and shape stay the same.

What must stay true: the packed copy is made from the weight as it is when `prepare_for_device`
runs; a weight changed in place afterwards (a reload) is noticed through its version counter and
packed again before its next use.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Inputs with fewer rows run `F.linear` on the plain weight (see the module docstring).
PACKED_MIN_ROWS = 2


def onednn_linear_available() -> bool:
    """Whether this torch build has the oneDNN inner product on packed weights."""
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    )


class Linear(nn.Linear):
    """`nn.Linear` over inputs of shape [rows, in_features], with an optional packed weight."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self._packed: torch.Tensor | None = None
        self._packed_from: tuple[int, int] = (0, -1)  # (data_ptr, version) of the packed weight

    @property
    def packed(self) -> bool:
        return self._packed is not None

    def prepare_for_device(self) -> None:
        """Packs the weight for oneDNN when it is float32 on the CPU; elsewhere (CUDA, half
        precision) the layer keeps running `F.linear`. Call once the weights are loaded."""
        weight = self.weight
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            self._packed = None
            return
        if not onednn_linear_available():
            return
        with torch.no_grad():
            if self.out_features >= self.in_features and weight.stride(0) != 1:
                weight.data = weight.data.t().contiguous().t()  # column-major, see the docstring
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        self._packed_from = (weight.data_ptr(), weight._version)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None and self._packed_from != (
            self.weight.data_ptr(),
            self.weight._version,
        ):
            self.prepare_for_device()
        if self._packed is None or x.dim() != 2 or x.shape[0] < PACKED_MIN_ROWS:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), self._packed, self.bias, "none", [], ""
        )


def prepare_for_device(model: nn.Module) -> None:
    """Prepares every `Linear` of `model` for the device its weights are on."""
    for module in model.modules():
        if isinstance(module, Linear):
            module.prepare_for_device()
