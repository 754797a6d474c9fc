"""Gated activations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from srt.kernels.cpu import cpu_kernels


class SiluAndMul(nn.Module):
    """silu(gate) * up, for the fused [gate | up] projection output; float32 and bf16 on the CPU
    in one pass (`cpu_kernels.silu_and_mul`, silu rounded to bf16 before the product, as here)."""

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        if cpu_kernels.runs_in_rust(gate_up):
            return cpu_kernels.silu_and_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
