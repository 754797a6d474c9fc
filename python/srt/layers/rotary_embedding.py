"""Rotary position embeddings (the rotate-half layout of Llama and Qwen), with Llama 3 scaling.

Configs spell the parameters two ways: `rope_parameters` (transformers 5) or top-level
`rope_theta` with an optional `rope_scaling` dict (older saves and most hub configs). Both read
the same here. cos/sin are computed in float32 as transformers does, so logits match it.

A GGUF file carries Llama 3's scaling as llama.cpp writes it: a `rope_freqs` tensor of one
divisor per frequency, which `ModelConfig.load` puts on the config (`rope_freq_factors`) where
the config is read from the file's metadata (transformers does not map it).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from srt.kernels.cpu import cpu_kernels

SUPPORTED_ROPE_TYPES = ("default", "llama3")


def rope_parameters(config: Any) -> dict[str, Any]:
    """The rope settings of a Hugging Face config, whichever way it spells them."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    scaling = getattr(config, "rope_scaling", None)
    if scaling:
        params = {**scaling, **params}
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    factors = getattr(config, "rope_freq_factors", None)
    if factors is not None:
        params["freq_factors"] = factors
    return params


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    factor = params["factor"]
    low_freq_factor = params["low_freq_factor"]
    high_freq_factor = params["high_freq_factor"]
    old_context_len = params["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def base_frequencies(head_dim: int, params: dict[str, Any]) -> torch.Tensor:
    """The `head_dim / 2` rotation frequencies of `rope_theta`, before any scaling."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (float(params["rope_theta"]) ** exponents)


def inverse_frequencies(head_dim: int, params: dict[str, Any]) -> torch.Tensor:
    """The rotation frequency of each pair of a head's dimensions (`head_dim / 2`, float32):
    `rope_theta`'s, scaled as the rope type (or a GGUF file's `freq_factors`) says."""
    rope_type = params["rope_type"]
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope type {rope_type!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    inv_freq = base_frequencies(head_dim, params)
    if rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, params)
    factors = params.get("freq_factors")
    if factors is not None:
        divisors = torch.tensor(factors, dtype=torch.float32)
        if divisors.shape != inv_freq.shape or not bool((divisors > 0).all()):
            raise ValueError(
                f"rope frequency factors must be {inv_freq.numel()} positive numbers (one per "
                f"pair of a head's {head_dim} dimensions), got {divisors.numel()}"
            )
        inv_freq = inv_freq / divisors
    return inv_freq


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, params: dict[str, Any]) -> None:
        super().__init__()
        inv_freq = inverse_frequencies(head_dim, params)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        cos, sin = freqs.cos(), freqs.sin()
        # [cos | cos] and [-sin | sin]: the rotate-half products of `apply_rotary` in one pass.
        self.register_buffer("cos_cached", torch.cat((cos, cos), dim=-1), persistent=False)
        self.register_buffer("sin_cached", torch.cat((-sin, sin), dim=-1), persistent=False)
        self.cos_cached: torch.Tensor
        self.sin_cached: torch.Tensor

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin of each token's position, [tokens, 1, head_dim] in `dtype`: taken
        once per forward pass and handed to `apply_rotary` in every layer."""
        cos = self.cos_cached[positions].unsqueeze(1).to(dtype)
        sin = self.sin_cached[positions].unsqueeze(1).to(dtype)
        return cos, sin


def apply_rotary(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x: [tokens, heads, head_dim] rotated by `RotaryEmbedding.forward`'s (cos, sin).

    Equal, bit for bit, to transformers' `x * cos + rotate_half(x) * sin`: swapping the halves
    and negating sin's first half multiplies the same numbers as negating x's second half.
    Float32 and bf16 on the CPU run as one pass in srt's Rust kernel, with the same roundings
    (in bf16: each product, then the sum).
    """
    cos, sin = rope
    if cpu_kernels.runs_in_rust(x, cos, sin):
        return cpu_kernels.rotary(x, cos, sin)
    half = x.shape[-1] // 2
    swapped = x.unflatten(-1, (2, half)).flip(-2).flatten(-2)
    return x * cos + swapped * sin
