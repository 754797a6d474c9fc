"""What srt needs to know about a model, read from its Hugging Face config (or GGUF metadata)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType
from transformers import AutoConfig, GenerationConfig

from srt.layers.rotary_embedding import base_frequencies, inverse_frequencies, rope_parameters
from srt.model_executor.gguf_tensors import ROPE_FREQS, read_metadata, read_tensors
from srt.model_executor.resolve import default_dtype
from srt.model_info import beside_hf_files
from srt.models.llama import head_dim_of
from srt.server_args import check_local_model_path
from srt.server_args_check import split_gguf_path

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The torch dtype of a `--dtype` name (`auto`: `resolve.default_dtype`)."""
    return DTYPES[default_dtype(device) if name == "auto" else name]


def resolve_quantization(name: str, gguf_file: str | None, device: torch.device) -> str:
    """The weight format of `--quantization name` (auto: gguf for a GGUF file, else none).
    Quantized formats run on the CPU only: on another device they resolve to none (the weights
    are dequantized to the model's dtype as they load), with a log line saying so."""
    if name == "auto":
        name = "gguf" if gguf_file is not None else "none"
    if name == "gguf" and gguf_file is None:
        raise ValueError("--quantization gguf needs a GGUF file as --model-path")
    if name != "none" and device.type != "cpu":
        logger.info(
            "--quantization %s runs on the CPU only: on %s the weights are dequantized to the "
            "model's dtype as they load",
            name,
            device.type,
        )
        return "none"
    return name


@dataclass(frozen=True)
class GGUFConfigKeys:
    """What transformers' GGUF config mapping leaves out of an architecture that srt serves, as
    llama.cpp computes it: config attributes read from metadata keys (named after the
    architecture's prefix), each of which a file must hold, and those llama.cpp's graph of the
    architecture fixes."""

    keys: dict[str, str]  # metadata key -> config attribute
    fixed: dict[str, Any]  # config attribute -> value


# By GGUF architecture (`general.architecture`).
GGUF_CONFIG_KEYS = {
    # transformers does not map the experts' width. It maps the expert counts, but defaults
    # them (to 128 and 8) for a file that lacks them: all three are required here. llama.cpp
    # would guess a missing width as feed_forward_length / expert_used_count; every file its
    # conversion writes holds the key, and srt refuses a file without it rather than guess.
    # llama.cpp's graph always renormalizes the chosen experts' weights (as Qwen3-30B-A3B's
    # config says), where Qwen3MoeConfig's default does not: set here, whether or not the
    # transformers release sets it for a GGUF file (recent ones do).
    "qwen3moe": GGUFConfigKeys(
        keys={
            "expert_count": "num_experts",
            "expert_used_count": "num_experts_per_tok",
            "expert_feed_forward_length": "moe_intermediate_size",
        },
        fixed={"norm_topk_prob": True},
    ),
}


@dataclass(frozen=True)
class ModelConfig:
    model_path: str  # a directory, hub id, or the directory of `gguf_file`
    gguf_file: str | None
    hf_config: Any
    dtype: torch.dtype
    quantization: str  # resolved: none, gguf or int8
    context_length: int
    eos_token_ids: frozenset[int]

    @classmethod
    def load(
        cls,
        model_path: str,
        dtype: str,
        device: torch.device,
        context_length: int | None = None,
        trust_remote_code: bool = False,
        quantization: str = "auto",
    ) -> ModelConfig:
        check_local_model_path(model_path)
        path, gguf_file = split_gguf_path(model_path)
        # The config of a GGUF file that sits in the Hugging Face directory srt prepared from it
        # is read from that directory's files (the same values, read faster).
        config_file = None if beside_hf_files(model_path) else gguf_file
        hf_config = AutoConfig.from_pretrained(
            path, gguf_file=config_file, trust_remote_code=trust_remote_code
        )
        if gguf_file is not None and (Path(path) / gguf_file).is_file():
            if config_file is not None:
                _take_gguf_metadata(hf_config, Path(path) / gguf_file)
            _take_rope_freqs(hf_config, Path(path) / gguf_file, config_file is not None)
        model_max = _max_context(hf_config)
        if context_length is not None and context_length > model_max:
            raise ValueError(
                f"--context-length {context_length} exceeds the model's {model_max} positions"
            )
        return cls(
            model_path=path,
            gguf_file=gguf_file,
            hf_config=hf_config,
            dtype=resolve_dtype(dtype, device),
            quantization=resolve_quantization(quantization, gguf_file, device),
            context_length=context_length or model_max,
            eos_token_ids=_eos_token_ids(path, config_file, hf_config),
        )

    @property
    def num_layers(self) -> int:
        return int(self.hf_config.num_hidden_layers)

    @property
    def num_kv_heads(self) -> int:
        config = self.hf_config
        return int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)

    @property
    def head_dim(self) -> int:
        return int(head_dim_of(self.hf_config))

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config.vocab_size)


def _take_gguf_metadata(hf_config: Any, gguf: Path) -> None:
    """Puts on a config read from GGUF file `gguf`'s metadata what transformers' mapping leaves
    out of its architecture (`GGUF_CONFIG_KEYS`); ValueError naming the file and a key that it
    lacks or that is not a count."""
    wanted = {f"{arch}.{key}" for arch, entry in GGUF_CONFIG_KEYS.items() for key in entry.keys}
    metadata = read_metadata(gguf, {"general.architecture", *wanted})
    arch = metadata.get("general.architecture")
    entry = GGUF_CONFIG_KEYS.get(arch) if isinstance(arch, str) else None
    if entry is None:
        return
    for key, attribute in entry.keys.items():
        if f"{arch}.{key}" not in metadata:
            raise ValueError(
                f"{gguf.name} lacks metadata key {arch}.{key} (the model's {attribute}), "
                f"which srt needs to serve a {arch} file"
            )
        value = metadata[f"{arch}.{key}"]
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{gguf.name}: metadata key {arch}.{key} is {value!r}, not a count")
        setattr(hf_config, attribute, value)
    for attribute, fixed in entry.fixed.items():
        setattr(hf_config, attribute, fixed)


def _take_rope_freqs(hf_config: Any, gguf: Path, from_metadata: bool) -> None:
    """Llama 3's rope scaling as GGUF file `gguf` carries it (`ROPE_FREQS`), if it does: put on
    a config read from the file's metadata (which lacks it), or checked against one read from
    the Hugging Face files beside it, which state it as their rope scaling (ValueError where
    the two differ)."""
    found = [tensor for tensor in read_tensors(gguf) if tensor.name == ROPE_FREQS]
    if not found:
        return
    if found[0].tensor_type != GGMLQuantizationType.F32:
        raise ValueError(f"{gguf.name}: {ROPE_FREQS} is {found[0].tensor_type.name}, not F32")
    factors = np.array(found[0].data, dtype=np.float32).reshape(-1)
    if from_metadata:
        hf_config.rope_freq_factors = factors.tolist()
        return
    params = rope_parameters(hf_config)
    head_dim = head_dim_of(hf_config)
    stated = base_frequencies(head_dim, params) / inverse_frequencies(head_dim, params)
    if stated.shape != factors.shape or not np.allclose(stated.numpy(), factors, rtol=1e-5):
        raise ValueError(
            f"{gguf.name}: its {ROPE_FREQS} (Llama 3's rope scaling, as llama.cpp writes it) "
            f"is not the rope scaling of the config beside it ({params['rope_type']})"
        )


def _max_context(hf_config: Any) -> int:
    limit = int(hf_config.max_position_embeddings)
    # Mistral-style sliding-window attention is not implemented: serve only lengths where full
    # attention is the same thing.
    window = getattr(hf_config, "sliding_window", None)
    if window and getattr(hf_config, "use_sliding_window", True):
        limit = min(limit, int(window))
    return limit


def _eos_token_ids(path: str, gguf_file: str | None, hf_config: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (hf_config, _generation_config(path, gguf_file)):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return frozenset(ids)


def _generation_config(path: str, gguf_file: str | None) -> GenerationConfig | None:
    try:
        return GenerationConfig.from_pretrained(path, gguf_file=gguf_file)
    except OSError:
        return None
