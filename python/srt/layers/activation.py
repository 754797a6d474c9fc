"""Gated activations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from srt import _rust
from srt.layers.layernorm import runs_in_rust


class SiluAndMul(nn.Module):
    """silu(gate) * up, for the fused [gate | up] projection output; float32 on the CPU in one
    pass (`srt._rust.silu_and_mul`)."""

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        dim = gate_up.shape[-1] // 2
        if runs_in_rust(gate_up):
            gate_up = gate_up.contiguous()
            out = gate_up.new_empty((*gate_up.shape[:-1], dim))
            _rust.silu_and_mul(gate_up.numpy(), dim, out.numpy())
            return out
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
