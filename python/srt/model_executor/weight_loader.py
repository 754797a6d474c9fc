"""Checkpoint tensors as (Hugging Face name, tensor) pairs: safetensors shards or a GGUF file.

GGUF tensors are dequantized with the `gguf` package and renamed to Hugging Face's names; for the
Llama architecture, llama.cpp's conversion permuted the rows of the q/k projections (to its
interleaved rotary layout), which is undone here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def iterate_weights(
    model_path: str, gguf_file: str | None, hf_config: Any
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a local checkpoint, or of a hub id (downloaded when the user has network)."""
    directory = Path(model_path)
    if not directory.is_dir():
        from huggingface_hub import snapshot_download

        patterns = [gguf_file] if gguf_file else ["*.safetensors", "*.json"]
        directory = Path(snapshot_download(model_path, allow_patterns=patterns))
    if gguf_file is not None:
        yield from _gguf_weights(directory / gguf_file, hf_config)
        return
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {directory}")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, f.get_tensor(name)


def _gguf_weights(path: Path, hf_config: Any) -> Iterator[tuple[str, torch.Tensor]]:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    permute_qk = hf_config.model_type == "llama"
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        values = dequantize(tensor.data, tensor.tensor_type)
        shape = tuple(reversed(tensor.shape.tolist()))
        # A copy: the reader's arrays map the file read-only.
        weight = torch.from_numpy(np.array(values.reshape(shape), dtype=np.float32))
        if permute_qk and name.endswith("self_attn.q_proj.weight"):
            weight = _unpermute(weight, hf_config.num_attention_heads)
        elif permute_qk and name.endswith("self_attn.k_proj.weight"):
            weight = _unpermute(weight, hf_config.num_key_value_heads)
        yield name, weight


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GGUF_GLOBAL_NAMES:
        return _GGUF_GLOBAL_NAMES[gguf_name]
    match = _GGUF_LAYER.fullmatch(gguf_name)
    if match is None or match.group(2) not in _GGUF_LAYER_NAMES:
        raise ValueError(f"GGUF tensor {gguf_name} is not one srt knows how to load")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_GGUF_LAYER_NAMES[part]}.{kind}"


def _unpermute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undoes llama.cpp's per-head interleaving of the rotary halves of q/k projection rows."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )
