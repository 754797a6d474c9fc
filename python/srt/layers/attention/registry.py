"""Attention backends by their `--attention-backend` name."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from srt.layers.attention.base import AttentionBackend


def _torch_native() -> AttentionBackend:
    from srt.layers.attention.torch_native import TorchNativeAttnBackend

    return TorchNativeAttnBackend()


def _triton() -> AttentionBackend:
    from srt.layers.attention.triton_backend import TritonAttnBackend

    return TritonAttnBackend()


ATTENTION_BACKENDS: dict[str, Callable[[], AttentionBackend]] = {
    "torch_native": _torch_native,
    "triton": _triton,
}


def default_backend(device: torch.device) -> str:
    """flashinfer on CUDA when installed, else triton on CUDA; torch_native on CPU."""
    if device.type != "cuda":
        return "torch_native"
    if importlib.util.find_spec("flashinfer") is not None and "flashinfer" in ATTENTION_BACKENDS:
        return "flashinfer"
    return "triton" if "triton" in ATTENTION_BACKENDS else "torch_native"


def create_attention_backend(name: str | None, device: torch.device) -> AttentionBackend:
    name = name or default_backend(device)
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"attention backend {name!r} is not available; choose from "
            f"{', '.join(ATTENTION_BACKENDS)}"
        )
    return ATTENTION_BACKENDS[name]()
