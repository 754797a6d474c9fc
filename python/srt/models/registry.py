"""Which of our model classes serves a Hugging Face `config.architectures` entry."""

from __future__ import annotations

from typing import Any

from torch import nn

from srt.models.llama import LlamaForCausalLM
from srt.models.qwen2 import Qwen2ForCausalLM
from srt.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}

# Configs read from GGUF metadata name a model type but no architecture.
_ARCHITECTURE_OF_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def model_class_for(config: Any) -> type[nn.Module]:
    """The class for a config; an unsupported architecture fails listing the supported ones."""
    architectures = getattr(config, "architectures", None) or []
    if not architectures and getattr(config, "model_type", None) in _ARCHITECTURE_OF_MODEL_TYPE:
        architectures = [_ARCHITECTURE_OF_MODEL_TYPE[config.model_type]]
    for arch in architectures:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
    raise ValueError(
        f"unsupported model architecture {', '.join(architectures) or '(none given)'}; "
        f"srt supports {', '.join(sorted(MODEL_REGISTRY))}"
    )
