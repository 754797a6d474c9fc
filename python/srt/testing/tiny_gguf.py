"""A tiny fixture model written as llama.cpp writes a GGUF file: its tensor names, q/k row order
and metadata, in one of llama.cpp's K-quant mixes.

    python -m srt.testing.make_tiny_model --arch qwen3 --preset tiny-k --out /tmp/m --gguf Q4_K_M

A mix names the type of most matrices and of the ones llama.cpp gives more bits (some layers'
attn_v and ffn_down, and the output layer, always Q6_K: the embedding where it is tied, as a
model with tied embeddings has no output tensor in llama.cpp's files); norms and biases stay
float32, as does a mixture of experts' router (`ffn_gate_inp`), whose experts are stacked per
layer and projection (`ffn_gate_exps`, ...) and typed as other matrices. Rows that are not
whole super-blocks of 256 weights take the type llama.cpp falls back to (Q4_K's Q5_0, Q5_K's
Q5_1, Q6_K's Q8_0), so that any model, SmolLM2's 576 columns included, is written as
llama.cpp's `llama-quantize` types it. The metadata is what transformers reads a config from
(`ModelConfig.load` of a GGUF file with no prepared directory beside it), so a fixture shows
what srt makes of a file as llama.cpp writes it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file
from transformers import AutoConfig

from srt.models.llama import head_dim_of
from srt.testing import gguf_kquants

Q = GGMLQuantizationType
# mix -> (most matrices, attn_v and ffn_down of the layers given more bits), as llama.cpp's
# `llama-quantize` picks them (`_more_bits`); the output layer (the embedding where it is tied)
# is Q6_K. Q2_K's matrices are of a type srt dequantizes at load.
MIXES: dict[str, tuple[GGMLQuantizationType, GGMLQuantizationType, LlamaFileType]] = {
    "Q4_K_M": (Q.Q4_K, Q.Q6_K, LlamaFileType.MOSTLY_Q4_K_M),
    "Q5_K_M": (Q.Q5_K, Q.Q6_K, LlamaFileType.MOSTLY_Q5_K_M),
    "Q2_K": (Q.Q2_K, Q.Q4_K, LlamaFileType.MOSTLY_Q2_K),
}
_MORE_BITS = ("attn_v", "ffn_down")
# The type llama.cpp writes instead of a K-quant for rows that are not whole super-blocks of 256
# (SmolLM2's 576 columns): Q2_K's (IQ4_NL) has no encoder here.
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}
# llama.cpp writes Mistral as the Llama architecture.
_GGUF_ARCH = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
}
# Hugging Face name -> GGUF name, written out here rather than taken from srt's loader, so that
# a fixture checks the loader's names instead of repeating them.
_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
}
# A layer's experts of one projection, stacked into one 3-D tensor (expert, row, column).
_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+)\.weight")
_EXPERTS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}
# llama.cpp's `llama-quantize` keeps a mixture's router in float32, as norms and biases.
_ROUTER = "ffn_gate_inp"


def gguf_name(name: str) -> str:
    """The GGUF name of Hugging Face tensor `name` (of an expert's: its layer's stack)."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    if expert := _EXPERT.fullmatch(name):
        return f"blk.{expert[1]}.{_EXPERTS[expert[3]]}.weight"
    _, _, layer, rest = name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER[module]}.{kind}"


def _more_bits(layer: int, layers: int) -> bool:
    """Whether llama.cpp's K mixes give layer `layer` of `layers` more bits in attn_v and
    ffn_down: the first and last eighth, and every third between (all of a 2-layer model)."""
    eighth = layers // 8
    return layer < eighth or layer >= 7 * layers // 8 or (layer - eighth) % 3 == 2


def mix_type(
    mix: str, layers: int, tied: bool
) -> Callable[[str, tuple[int, ...]], GGMLQuantizationType]:
    """The type `mix` gives a GGUF tensor of a model of `layers` layers (its embedding `tied`
    to the output layer or not), by its name and shape."""
    body, more_bits, _ = MIXES[mix]

    def type_of(name: str, shape: tuple[int, ...]) -> GGMLQuantizationType:
        part = name.split(".")[-2]
        if len(shape) == 1 or part == _ROUTER:
            return Q.F32
        # llama.cpp's test is a substring: a mixture's ffn_down_exps is an ffn_down.
        more = part.removesuffix("_exps") in _MORE_BITS
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            kind = Q.Q6_K
        elif more and _more_bits(int(name.split(".")[1]), layers):
            kind = more_bits
        else:
            kind = body
        if shape[-1] % gguf_kquants.SUPER_BLOCK and kind in _FALLBACK:
            return _FALLBACK[kind]
        return kind

    return type_of


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's conversion of Llama q/k rows to its interleaved rotary layout."""
    rows = weight.shape[0]
    grouped = weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
    return np.ascontiguousarray(grouped.swapaxes(1, 2)).reshape(weight.shape)


def write_tiny_gguf(model_dir: Path, out: Path, mix: str = "Q4_K_M") -> dict[str, torch.Tensor]:
    """Writes the model at `model_dir` (a `make_tiny_model` directory) as GGUF file `out` in
    `mix`; returns what each tensor holds once dequantized, by Hugging Face name and in its row
    order (the values a loader must give the model)."""
    config = AutoConfig.from_pretrained(model_dir)
    arch = _GGUF_ARCH[config.model_type]
    if arch == "qwen3moe" and (config.mlp_only_layers or config.decoder_sparse_step != 1):
        raise ValueError(
            "llama.cpp's qwen3moe has no dense layers: write an all-sparse model "
            "(make_tiny_model's preset tiny-sparse)"
        )
    writer = GGUFWriter(out, arch)
    _write_metadata(writer, config, mix)
    tied = bool(config.tie_word_embeddings)
    type_of = mix_type(mix, config.num_hidden_layers, tied)
    if config.rope_parameters["rope_type"] == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_freqs(config))
    checkpoint = load_file(model_dir / "model.safetensors")
    expected: dict[str, torch.Tensor] = {}
    for target, names in _sources(checkpoint, tied).items():
        tensors = [checkpoint[name].float().numpy() for name in names]
        stacked = _EXPERT.fullmatch(names[0]) is not None
        values = np.stack(tensors) if stacked else tensors[0]
        kind = type_of(target, values.shape)
        if kind == Q.F32:
            stored, held = values, values
        else:
            encode = gguf_kquants.quantize if kind in gguf_kquants.K_QUANTS else quantize
            stored = encode(values, kind)
            held = dequantize(stored, kind)
        if arch == "llama" and target.endswith(("attn_q.weight", "attn_k.weight")):
            # Rows are whole blocks: permuting the blocks permutes the weights.
            heads = config.num_attention_heads if "attn_q" in target else config.num_key_value_heads
            stored = llama_cpp_permute(stored, heads)
        writer.add_tensor(target, stored, raw_dtype=None if kind == Q.F32 else kind)
        held = np.array(held, dtype=np.float32)
        for name, part in zip(names, held if stacked else [held], strict=True):
            expected[name] = torch.from_numpy(part)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def _sources(checkpoint: dict[str, torch.Tensor], tied: bool) -> dict[str, list[str]]:
    """GGUF name -> the Hugging Face tensors it holds: one, or a layer's experts of one
    projection in expert order (10 after 9), as llama.cpp stacks them. A tied output layer has
    none: the embedding stands for it."""
    names = sorted(
        sorted(checkpoint), key=lambda n: int(m[2]) if (m := _EXPERT.fullmatch(n)) else -1
    )
    sources: dict[str, list[str]] = {}
    for name in names:
        if not (name == "lm_head.weight" and tied):
            sources.setdefault(gguf_name(name), []).append(name)
    return sources


def llama3_rope_freqs(config: Any) -> np.ndarray:
    """Llama 3's rope scaling as llama.cpp's conversion writes it: a float32 tensor of one
    divisor per rotation frequency (1 for the fast ones, the scaling factor for the slow ones,
    and between them the inverse of the smoothed scale)."""
    params = config.rope_parameters
    head_dim = head_dim_of(config)
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    divisors = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * math.pi * params["rope_theta"] ** (i / head_dim)
        if wavelength < old_context / high:
            divisors.append(1.0)
        elif wavelength > old_context / low:
            divisors.append(factor)
        else:
            smooth = (old_context / wavelength - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


def _write_metadata(writer: GGUFWriter, config: Any, mix: str) -> None:
    """The model's shape as llama.cpp's conversion writes it (what transformers maps back;
    Llama 3's rope scaling, which has no metadata key, goes in the `rope_freqs` tensor)."""
    head_dim = head_dim_of(config)
    writer.add_name(f"tiny {config.model_type}")
    writer.add_file_type(MIXES[mix][2])
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    if config.model_type == "qwen3_moe":
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
