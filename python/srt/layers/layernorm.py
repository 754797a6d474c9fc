"""RMSNorm, computed in float32 as Hugging Face's Llama and Qwen do.

Float32 and bf16 on the CPU run as one pass per row in srt's Rust kernel (`cpu_kernels.rms_norm`),
the residual add of a decoder layer's pre-norm included, with bf16 rounded where the operators
below round it; elsewhere, PyTorch's operators.
"""

from __future__ import annotations

import torch
from torch import nn

from srt.kernels.cpu import cpu_kernels


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu_kernels.runs_in_rust(x, self.weight):
            return cpu_kernels.rms_norm(x, None, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def forward_with_residual(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Adds `x` to the residual stream, then normalizes: returns (normalized, new residual).
        The residual is updated in place (the returned one is the same tensor)."""
        if cpu_kernels.runs_in_rust(x, residual, self.weight) and residual.is_contiguous():
            return cpu_kernels.rms_norm(x, residual, self.weight, self.eps), residual
        residual.add_(x)
        return self.forward(residual), residual
