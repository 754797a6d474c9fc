"""The models' linear layers: `F.linear`, except float32 on an x86-64 CPU with AVX2 and FMA,
where the product runs in srt's own kernel (`cpu_kernels.PackedLinear`, rust/kernels/src/gemm.rs)
over a copy of the weight packed for it once after loading (`prepare_for_device`), and except a
layer whose weight is quantized (`set_quantized`, see quantization.py), which multiplies by it.

Why: on the CPU the projections and the lm_head are most of a decode step, and the BLAS that
PyTorch ships (MKL, and oneDNN's inner product on pre-packed weights) reaches a third to a half
of the cores' float32 multiply-add throughput at decode-sized batches, less on AMD cores. The
kernel runs the same float32 arithmetic, shares PyTorch's OpenMP threads, and serves every row
count with one code path, so a row's result is the same bits alone, in any batch, and through
prefill or decode.

Bf16 weights take `F.linear` on every device: on the CPU that is oneDNN's bf16 product, which
uses the CPU's native bf16 instructions (AVX-512 BF16, AMX) where it has them and reads half the
bytes of a float32 weight; `--dtype auto` picks bf16 only on such CPUs (`resolve.py`), and srt's
kernel is float32 only.

What must stay true: the packed copy is made from the weight as it is when `prepare_for_device`
runs; a weight or bias changed in place afterwards (a reload) is noticed through its version
counter and packed again before its next use. The packed path is for inference: an input that
requires grad takes `F.linear`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from srt.kernels.cpu import cpu_kernels, quant_kernels
from srt.kernels.cpu.quant_kernels import QuantizedWeight
from srt.kernels.cpu.quant_parts import QuantizedParts

if TYPE_CHECKING:
    from srt.layers.quantization import QuantWeight


# Whether layers made now skip the random initialization of their weights (`uninitialized`).
_skip_init: contextvars.ContextVar[bool] = contextvars.ContextVar("skip_init", default=False)


@contextlib.contextmanager
def uninitialized() -> Iterator[None]:
    """Inside, `Linear` and `VocabEmbedding` layers are made with their weights as allocated,
    not randomly initialized: for a model whose every parameter a checkpoint fills next
    (`load_weights` checks that it does), the initialization is wasted (1.3 s of a 2-core
    start for SmolLM2)."""
    token = _skip_init.set(True)
    try:
        yield
    finally:
        _skip_init.reset(token)


def initializing() -> bool:
    """Whether layers made here initialize their weights (outside `uninitialized`)."""
    return not _skip_init.get()


class Linear(nn.Linear):
    """`nn.Linear`, with the weight packed for srt's CPU kernel where that applies, or held
    quantized (`quant`; then the float `weight` parameter is gone)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.quant: QuantWeight | None = None
        self._packed: cpu_kernels.PackedLinear | None = None
        # What the packed copy was made from: the weight's and bias's data_ptr and version.
        self._packed_from: tuple[int, ...] = ()

    @property
    def packed(self) -> bool:
        return self._packed is not None

    def reset_parameters(self) -> None:
        if initializing():
            super().reset_parameters()

    def set_quantized(self, quant: QuantWeight) -> None:
        """Holds the weight as `quant` from now on and drops the float parameter (its memory is
        freed unless another module shares it)."""
        if (quant.out_features, quant.in_features) != (self.out_features, self.in_features):
            raise ValueError(
                f"a quantized [{quant.out_features}, {quant.in_features}] weight cannot serve a "
                f"[{self.out_features}, {self.in_features}] linear layer"
            )
        self.quant = quant
        self.register_parameter("weight", None)
        self._packed = None

    def prepare_for_device(self) -> None:
        """Packs the weight when it is float32 on a CPU the kernel runs on, or quantized blocks
        on a CPU with the integer kernel (`QuantizedWeight.pack`, `QuantizedParts.pack`);
        elsewhere (CUDA, half precision, other CPUs) the layer keeps running `F.linear`. Call
        once the weights are loaded."""
        if self.quant is not None:
            if isinstance(self.quant, QuantizedWeight | QuantizedParts):
                self.quant.pack()
            self._packed = None
            return
        weight = self.weight
        if (
            weight.device.type != "cpu"
            or weight.dtype != torch.float32
            or not cpu_kernels.linear_supported()
        ):
            self._packed = None
            return
        self._packed = cpu_kernels.PackedLinear(weight, self.bias)
        self._packed_from = self._fingerprint()

    def _fingerprint(self) -> tuple[int, ...]:
        bias = () if self.bias is None else (self.bias.data_ptr(), self.bias._version)
        return (self.weight.data_ptr(), self.weight._version, *bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant is not None:
            return self.quant.linear(x, self.bias)
        if self._packed is not None and self._packed_from != self._fingerprint():
            self.prepare_for_device()
        if self._packed is None or not cpu_kernels.runs_in_rust(x, dtypes=(torch.float32,)):
            return F.linear(x, self.weight, self.bias)
        return self._packed(x)


def prepare_for_device(model: nn.Module) -> None:
    """Prepares every `Linear` of `model` for the device its weights are on."""
    for module in model.modules():
        if isinstance(module, Linear):
            module.prepare_for_device()


def plan_products(model: nn.Module, dtype: torch.dtype, int8_offered: bool) -> Counter[str]:
    """Plans the products of every `Linear` of `model` held in GGUF blocks (of a weight of
    parts, each part's), as their first products in `dtype` (with int8 activations offered or
    not) would (`QuantizedWeight.plan`): at start-up rather than in the first request, which
    its log line can then time. Returns how many distinct plans were read from the plan cache
    ("read") and measured ("measured")."""
    before = quant_kernels.plan_sources.copy()
    for module in model.modules():
        quant = module.quant if isinstance(module, Linear) else None
        if isinstance(quant, QuantizedWeight | QuantizedParts):
            quant.plan(dtype, int8_offered)
    return quant_kernels.plan_sources - before
