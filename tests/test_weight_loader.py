"""Weights from a GGUF file equal the same weights prepared by transformers; errors are clear."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from runner_helpers import make_runner

from srt.model_executor.model_config import ModelConfig
from srt.model_executor.weight_loader import iterate_weights
from srt.testing.make_tiny_model import make_tiny_model
from srt.testing.smollm2 import smollm2_gguf


def copy_model_dir(source: Path, target: Path, skip_suffix: str = "") -> Path:
    """A copy of a model directory, leaving out files that end in `skip_suffix` (if given)."""
    target.mkdir()
    for file in source.iterdir():
        if not (skip_suffix and file.name.endswith(skip_suffix)):
            shutil.copyfile(file, target / file.name)
    return target


@pytest.mark.slow
def test_gguf_weights_equal_the_prepared_directory(smollm2: Path) -> None:
    gguf = smollm2_gguf()
    assert gguf is not None
    config = ModelConfig.load(str(gguf), "float32", torch.device("cpu"))
    from_gguf = dict(iterate_weights(config.model_path, config.gguf_file, config.hf_config))
    from_dir = dict(iterate_weights(str(smollm2), None, config.hf_config))
    assert from_gguf.keys() == from_dir.keys()
    for name, tensor in from_dir.items():
        assert isinstance(tensor, torch.Tensor)
        assert torch.equal(from_gguf[name], tensor), name  # type: ignore[arg-type]


@pytest.mark.slow
def test_runner_serves_the_gguf_file(smollm2: Path) -> None:
    gguf = smollm2_gguf()
    runner = make_runner(str(gguf), max_total_tokens=256)
    assert runner.model_config.gguf_file == gguf.name  # type: ignore[union-attr]
    assert runner.model_config.context_length == 8192
    assert 2 in runner.model_config.eos_token_ids


def test_unsupported_architecture_lists_the_supported(
    tiny_model_factory: Callable[[str], Path], tmp_path: Path
) -> None:
    target = copy_model_dir(tiny_model_factory("qwen2"), tmp_path / "model")
    config = (target / "config.json").read_text().replace("Qwen2ForCausalLM", "GPT2LMHeadModel")
    (target / "config.json").write_text(config)
    with pytest.raises(ValueError, match=r"LlamaForCausalLM.*Qwen3ForCausalLM"):
        make_runner(target)


def test_context_length_beyond_the_model_is_refused(
    tiny_model_factory: Callable[[str], Path],
) -> None:
    with pytest.raises(ValueError, match="--context-length 4096 exceeds"):
        make_runner(tiny_model_factory("llama"), context_length=4096)


def test_dummy_load_format_reads_no_checkpoint(
    tiny_model_factory: Callable[[str], Path], tmp_path: Path
) -> None:
    source = tiny_model_factory("qwen3")
    config_only = copy_model_dir(source, tmp_path / "config-only", skip_suffix=".safetensors")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        make_runner(config_only)
    dummy = make_runner(config_only, load_format="dummy")
    loaded = make_runner(source)
    dummy_weight = dict(dummy.model.named_parameters())["model.embed_tokens.weight"]
    loaded_weight = dict(loaded.model.named_parameters())["model.embed_tokens.weight"]
    assert dummy_weight.shape == loaded_weight.shape
    assert torch.isfinite(dummy_weight).all()
    assert not torch.equal(dummy_weight, loaded_weight)


def test_llama3_8b_preset_writes_a_config_without_weights(tmp_path: Path) -> None:
    out = make_tiny_model("llama", tmp_path / "l8", preset="llama3-8b", weights=False)
    assert not list(out.glob("*.safetensors"))
    config = ModelConfig.load(str(out), "bfloat16", torch.device("cpu"))
    assert (config.num_layers, config.num_kv_heads, config.head_dim) == (32, 8, 128)
    assert config.vocab_size == 128256
    assert config.hf_config.architectures == ["LlamaForCausalLM"]
