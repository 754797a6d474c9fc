"""Every attention backend gives the model the same logits as the cpu backend (the reference),
through extend with a reused cached prefix and decode (Triton runs in its interpreter on CPU;
flashinfer runs only on CUDA); and the registry picks and refuses backends as documented."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from runner_helpers import extend_and_decode_logits, make_runner

from srt.layers.attention.cpu_backend import CpuAttnBackend
from srt.layers.attention.registry import (
    ATTENTION_BACKENDS,
    create_attention_backend,
    default_backend,
    resolve_attention_backend,
)
from srt.server_args import ATTENTION_BACKEND_ALIASES
from srt.server_args import ATTENTION_BACKENDS as CLI_BACKENDS
from srt.testing.make_tiny_model import make_tiny_model

CPU = torch.device("cpu")
CUDA = torch.device("cuda")
HAS_FLASHINFER = importlib.util.find_spec("flashinfer") is not None


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_triton_matches_cpu(arch: str, tiny_model_factory: Callable[[str], Path]) -> None:
    path = tiny_model_factory(arch)
    reference = extend_and_decode_logits(path, attention_backend="cpu")
    for ours, expected in zip(
        extend_and_decode_logits(path, attention_backend="triton"), reference, strict=True
    ):
        torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_FLASHINFER, reason="needs flashinfer (pip install 'srt[cuda]')")
@pytest.mark.parametrize("disable_cuda_graph", [True, False])
def test_flashinfer_matches_cpu(
    disable_cuda_graph: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """In float16, on a model whose head size flashinfer ships kernels for; decode runs eagerly
    and through CUDA graphs. The tolerance is a few times the float16-vs-float32 gap of these
    logits (about 0.014 on values up to 6)."""
    path = make_tiny_model("llama", tmp_path_factory.mktemp("hd64"), preset="tiny-hd64")
    settings = {"dtype": "float16", "device": "cuda", "disable_cuda_graph": disable_cuda_graph}
    reference = extend_and_decode_logits(path, attention_backend="cpu", **settings)
    ours = extend_and_decode_logits(path, attention_backend="flashinfer", **settings)
    for got, expected in zip(ours, reference, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-2, atol=3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_FLASHINFER, reason="needs flashinfer (pip install 'srt[cuda]')")
def test_flashinfer_refuses_float32(tiny_model_factory: Callable[[str], Path]) -> None:
    with pytest.raises(ValueError, match=r"float16 or bfloat16, not torch\.float32"):
        make_runner(tiny_model_factory("llama"), device="cuda", attention_backend="flashinfer")


def test_registry_and_cli_agree() -> None:
    assert set(ATTENTION_BACKENDS) == set(CLI_BACKENDS)
    assert set(ATTENTION_BACKEND_ALIASES.values()) <= set(ATTENTION_BACKENDS)


def test_sglangs_torch_native_is_the_cpu_backend(tiny_model_factory: Callable[[str], Path]) -> None:
    assert resolve_attention_backend("torch_native", CPU) == "cpu"
    runner = make_runner(tiny_model_factory("llama"), attention_backend="torch_native")
    assert isinstance(runner.attn_backend, CpuAttnBackend)


def test_defaults() -> None:
    assert default_backend(CPU) == "cpu"
    assert resolve_attention_backend(None, CPU) == "cpu"
    assert default_backend(CUDA) == ("flashinfer" if HAS_FLASHINFER else "triton")
    assert resolve_attention_backend(None, CUDA) == default_backend(CUDA)


def test_unset_backend_on_cpu_is_cpu(tiny_model_factory: Callable[[str], Path]) -> None:
    runner = make_runner(tiny_model_factory("llama"), attention_backend=None)
    assert isinstance(runner.attn_backend, CpuAttnBackend)


def test_unknown_backend_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="'paged' is not available; choose from cpu, triton"):
        resolve_attention_backend("paged", CPU)


def test_flashinfer_is_refused_on_cpu(tiny_model_factory: Callable[[str], Path]) -> None:
    with pytest.raises(ValueError, match="needs a CUDA device, but the model runs on cpu") as e:
        make_runner(tiny_model_factory("llama"), attention_backend="flashinfer")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        create_attention_backend("flashinfer", torch.nn.Module(), torch.float16, CPU)


@pytest.mark.skipif(HAS_FLASHINFER, reason="flashinfer is installed here")
def test_flashinfer_is_refused_without_its_package() -> None:
    """Checked without touching the device, so it runs on machines without CUDA too."""
    with pytest.raises(ValueError, match=r"flashinfer package.*pip install 'srt\[cuda\]'") as e:
        resolve_attention_backend("flashinfer", CUDA)
    assert "\n" not in str(e.value)
