"""Attention backends by their `--attention-backend` name, with what each needs to run.

`ATTENTION_BACKENDS` is the one list of backends: `server_args.ATTENTION_BACKENDS` (the CLI
choices, with the aliases of `server_args.ATTENTION_BACKEND_ALIASES`, spelled out there so that
the CLI needs no torch) is held equal to its keys by a test.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from srt.layers.attention.base import AttentionBackend
from srt.server_args import ATTENTION_BACKEND_ALIASES

# A backend is built from the model it serves (some plan around its attention shapes), the
# dtype of its activations and KV cache, and the device.
BackendFactory = Callable[[nn.Module, torch.dtype, torch.device], AttentionBackend]


def _cpu(model: nn.Module, dtype: torch.dtype, device: torch.device) -> AttentionBackend:
    from srt.layers.attention.cpu_backend import CpuAttnBackend

    return CpuAttnBackend()


def _triton(model: nn.Module, dtype: torch.dtype, device: torch.device) -> AttentionBackend:
    from srt.layers.attention.triton_backend import TritonAttnBackend

    return TritonAttnBackend()


def _flashinfer(model: nn.Module, dtype: torch.dtype, device: torch.device) -> AttentionBackend:
    from srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    return FlashInferAttnBackend(model, dtype, device)


@dataclass(frozen=True)
class BackendEntry:
    create: BackendFactory
    needs_cuda: bool = False
    package: str | None = None  # a module that must be importable, installed as `install` says
    install: str = ""


ATTENTION_BACKENDS: dict[str, BackendEntry] = {
    "cpu": BackendEntry(_cpu),
    "triton": BackendEntry(_triton),
    "flashinfer": BackendEntry(
        _flashinfer,
        needs_cuda=True,
        package="flashinfer",
        install="pip install 'srt[cuda]' (the flashinfer-python package)",
    ),
}


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def default_backend(device: torch.device) -> str:
    """flashinfer on CUDA when installed, else triton on CUDA; cpu on CPU."""
    if device.type != "cuda":
        return "cpu"
    return "flashinfer" if _installed("flashinfer") else "triton"


def resolve_attention_backend(name: str | None, device: torch.device) -> str:
    """The backend that `--attention-backend name` (None: unset) runs on `device`. Raises a
    one-line ValueError when it cannot run there, before anything is loaded. An alias
    (`torch_native`) resolves to the backend it names."""
    name = name or default_backend(device)
    name = ATTENTION_BACKEND_ALIASES.get(name, name)
    entry = ATTENTION_BACKENDS.get(name)
    if entry is None:
        raise ValueError(
            f"attention backend {name!r} is not available; choose from "
            f"{', '.join(ATTENTION_BACKENDS)}"
        )
    if entry.needs_cuda and device.type != "cuda":
        raise ValueError(
            f"--attention-backend {name} needs a CUDA device, but the model runs on {device.type}"
        )
    if entry.package is not None and not _installed(entry.package):
        raise ValueError(
            f"--attention-backend {name} needs the {entry.package} package, which is not "
            f"installed: {entry.install}"
        )
    return name


def create_attention_backend(
    name: str, model: nn.Module, dtype: torch.dtype, device: torch.device
) -> AttentionBackend:
    """Backend `name`, as `model_executor.resolve` resolved it, built for `model` (refused, as
    `resolve_attention_backend` refuses it, if it cannot run on `device`)."""
    return ATTENTION_BACKENDS[resolve_attention_backend(name, device)].create(model, dtype, device)
