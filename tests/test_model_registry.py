"""`srt.models.registry`: a model file registers the architectures and GGUF model types its
classes serve, and the registry serves them without a table of its own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch import nn

from srt.models.llama import LlamaForCausalLM
from srt.models.qwen2 import Qwen2ForCausalLM
from srt.models.qwen3 import Qwen3ForCausalLM
from srt.models.registry import model_class_for, register_model, supported_architectures


def config(**fields: object) -> SimpleNamespace:
    return SimpleNamespace(**{"architectures": None, "model_type": None, **fields})


def test_the_registry_serves_what_each_model_file_registers() -> None:
    assert model_class_for(config(architectures=["Qwen3ForCausalLM"])) is Qwen3ForCausalLM
    assert model_class_for(config(architectures=["MistralForCausalLM"])) is LlamaForCausalLM
    # A config read from GGUF metadata names a model type and no architecture.
    assert model_class_for(config(model_type="qwen2")) is Qwen2ForCausalLM
    assert model_class_for(config(model_type="mistral")) is LlamaForCausalLM
    assert {"LlamaForCausalLM", "Qwen2ForCausalLM"} <= set(supported_architectures())


def test_a_name_claimed_twice_is_refused_and_nothing_registered() -> None:
    new = type("New", (nn.Module,), {})
    with pytest.raises(ValueError, match="Qwen3ForCausalLM is served by Qwen3ForCausalLM"):
        register_model("NewForCausalLM", "Qwen3ForCausalLM")(new)
    with pytest.raises(ValueError, match="unsupported model architecture NewForCausalLM"):
        model_class_for(config(architectures=["NewForCausalLM"]))
    with pytest.raises(ValueError, match="llama is served by LlamaForCausalLM"):
        register_model("NewForCausalLM", model_types=("llama",))(new)
    assert "NewForCausalLM" not in supported_architectures()
