"""Weights kept quantized in memory (`--quantization`), and what a layer multiplies them with.

Two formats:
- `gguf`: a GGUF file's Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 tensors as the file holds them, in
  blocks of 32 weights, and its K-quants (Q4_K, Q5_K, Q6_K) in super-blocks of 256
  (`quant_kernels.QuantizedWeight`, multiplied by srt's Rust kernels, which read the blocks or
  tiles repacked from them; a fused weight whose shards differ in format is one part per
  format, `quant_parts.QuantizedParts`); on CPUs with the integer kernel, products of 16 rows
  or more (prefill passes, and decode steps of 16 sequences or more) of blocks of 32 may round
  their activations to one int8 per value per block, as llama.cpp does, where their measured
  plan takes that kernel (`quant_kernels`'s `int8_activations`), unless
  `--disable-int8-activations`;
- `int8`: weight-only, a float linear weight quantized at load, per output channel and symmetric
  (`Int8Weight`): each row is its int8 values times one float scale, absmax / 127. Its product
  is PyTorch's CPU weight-only kernel, `aten._weight_int8pack_mm`, always with bfloat16
  activations: a float32 model's activations are rounded to bfloat16 for it and its output
  widened back. Why: in torch 2.15 the kernel is vectorized for bfloat16 only; with float32
  activations it runs a scalar loop, 10x (one row) to 40x (16 rows) slower than float32
  `F.linear` on the same shape, while in bfloat16 it is as fast as float32 `F.linear` on a
  cached weight and reads a quarter of its bytes. The rounding costs less than the int8 weights
  do (a random weight of SmolLM2's MLP shape, 1536x576, 128 rows: the int8 weights alone err by
  0.46% of the largest output, with the rounding 0.84%, against float32). fbgemm's dynamic int8
  linear (`quantized.linear_dynamic`) was faster still, but it quantizes the activations per
  tensor too (1.3% on the same product) and rests on PyTorch's deprecated quantized-tensor API.
  The kernel's bfloat16 path reads rows in steps of 16 values and returned garbage or crashed on
  other lengths, so `Int8Weight` pads shorter rows with zero weights, and the activations with
  zeros to match.

Both run on the CPU; on CUDA, `model_config.resolve_quantization` turns them off (the weights are
dequantized to the model's dtype as they load).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from srt.kernels.cpu.quant_kernels import QuantizedWeight
from srt.layers.linear import Linear

INT8_MAX = 127
# `_weight_int8pack_mm`'s bfloat16 path reads each row in steps of 16 (see the module doc).
_KERNEL_K_STEP = 16


class QuantWeight(Protocol):
    """What a layer needs of a quantized `[out_features, in_features]` weight."""

    out_features: int
    in_features: int

    @property
    def nbytes(self) -> int:
        """Bytes the weight holds (and a product reads)."""
        ...

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`x · Wᵀ + bias` for x of shape [..., in_features], in x's dtype."""
        ...

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight as a float `[out_features, in_features]` tensor."""
        ...


CheckpointTensor = torch.Tensor | QuantizedWeight
"""A tensor as the weight loader yields it: float, or GGUF blocks kept as they are."""


class Int8Weight:
    """A weight as int8 rows `[out, in]` and one bfloat16 scale per row (output channel): the
    scales the kernel reads (see the module doc), so `dequantize` is exactly what it multiplies."""

    def __init__(self, values: torch.Tensor, scales: torch.Tensor) -> None:
        if values.dtype != torch.int8 or values.dim() != 2:
            raise ValueError(f"int8 values must be a 2-D int8 tensor, got {values.dtype}")
        if scales.shape != (values.shape[0],):
            raise ValueError(f"{values.shape[0]} rows need as many scales, got {scales.shape}")
        self.out_features, self.in_features = values.shape
        self._pad = -self.in_features % _KERNEL_K_STEP
        self.values = F.pad(values, (0, self._pad)).contiguous()  # zero weights never count
        self.scales = scales.to(torch.bfloat16)

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Int8Weight:
        """Symmetric per-row quantization: scale = absmax / 127 (rounded to bfloat16), values =
        round(w / scale), clamped to [-127, 127] (the rounded scale may be a hair small)."""
        w = weight.detach().to(torch.float32)
        absmax = w.abs().amax(dim=1)
        # An all-zero row keeps scale 1 (its values are 0 either way) rather than dividing by 0.
        scales = torch.where(absmax > 0, absmax / INT8_MAX, torch.ones_like(absmax))
        scales = scales.to(torch.bfloat16)
        values = torch.round(w / scales.float()[:, None]).clamp_(-INT8_MAX, INT8_MAX)
        return cls(values.to(torch.int8), scales)

    @property
    def nbytes(self) -> int:
        return self.values.numel() + self.scales.numel() * self.scales.element_size()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        values = self.values[:, : self.in_features].to(torch.float32)
        return (values * self.scales.float()[:, None]).to(dtype)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        rows = F.pad(rows, (0, self._pad)).contiguous() if self._pad else rows.contiguous()
        out = torch.ops.aten._weight_int8pack_mm(rows, self.values, self.scales).to(x.dtype)
        if bias is not None:
            out += bias
        return out.view(*x.shape[:-1], self.out_features)


def quantize_int8(model: nn.Module) -> int:
    """Replaces the weight of every float `Linear` of `model` with an `Int8Weight`, except a
    weight shared with an embedding (a tied lm_head), which the lookups need in float; returns
    how many were quantized."""
    embedded = {
        id(m.weight)
        for m in model.modules()
        if isinstance(m, nn.Embedding) and m.weight is not None
    }
    count = 0
    for module in model.modules():
        if (
            isinstance(module, Linear)
            and module.quant is None
            and id(module.weight) not in embedded
        ):
            module.set_quantized(Int8Weight.quantize(module.weight))
            count += 1
    return count


def weight_bytes(model: nn.Module) -> int:
    """Bytes of `model`'s weights as they sit in memory (`weight_forms`'s sum)."""
    return sum(weight_forms(model).values())


def weight_forms(model: nn.Module) -> dict[str, int]:
    """Bytes of `model`'s weights as they sit in memory, by the form they are held in: a float
    dtype (`bfloat16`), a GGUF format in its blocks or the integer kernel's tiles (`q5_0
    tiles`), `int8`; a shared weight (tied embeddings) counted once."""
    forms: dict[str, int] = {}

    def add(form: str, nbytes: int) -> None:
        forms[form] = forms.get(form, 0) + nbytes

    for p in model.parameters():  # deduplicated
        add(str(p.dtype).removeprefix("torch."), p.numel() * p.element_size())
    seen: set[int] = set()
    for module in model.modules():
        quant = getattr(module, "quant", None)
        if quant is None or id(quant) in seen:
            continue
        seen.add(id(quant))
        for part in getattr(quant, "parts", (quant,)):
            if isinstance(part, QuantizedWeight):
                add(f"{part.fmt} {'tiles' if part.packed else 'blocks'}", part.nbytes)
            else:
                add("int8", part.nbytes)
    return forms
