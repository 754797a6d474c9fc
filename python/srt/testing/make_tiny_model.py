"""Write a tiny random-weight Hugging Face model directory, offline and deterministically.

    python -m srt.testing.make_tiny_model --arch qwen3 --out /tmp/m [--seed 0] \
        [--context-length 2048] [--preset tiny-k --gguf Q4_K_M]

The directory holds config.json, generation_config.json, model.safetensors, and a byte-level BPE
tokenizer (tokenizer.json, its config, a ChatML chat template) that transformers loads with
`HF_HUB_OFFLINE=1`. The same arguments on the same machine give the same bytes of weights.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

from srt.testing.tiny_gguf import MIXES, write_tiny_gguf
from srt.testing.tiny_tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, train_byte_level_bpe

# Shapes small enough to build and run in well under a second, with grouped-query attention
# (4 query heads share 2 KV heads) so that every model path sees it.
_TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    # Wider than transformers' default so that greedy decoding of random weights has clear
    # winners instead of near-ties that rounding could flip.
    "initializer_range": 0.1,
}

# Real shapes, written as configs without weights, for `--load-format dummy` benchmarks; and
# `tiny-hd64`, still tiny but with a head size that every CUDA attention kernel (flashinfer's
# included) ships, and 4 query heads per KV head as in Llama 3.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": _TINY,
    "tiny-hd64": {
        **_TINY,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
    },
    # Widths of whole K-quant super-blocks (256 weights), and the head size of every Qwen3
    # (128, which transformers assumes for a Qwen3 GGUF file, whose metadata it does not read it
    # from): for GGUF fixtures (`tiny_gguf.py`).
    "tiny-k": {
        **_TINY,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 128,
    },
    # The tiny mixture of experts with every layer sparse, as llama.cpp's qwen3moe files are (its
    # graph has no dense layer): for qwen3_moe GGUF fixtures (`tiny_gguf.py`).
    "tiny-sparse": {**_TINY, "mlp_only_layers": []},
    "llama3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-5,
        "initializer_range": 0.02,
        "vocab_size": 128256,
    },
}


_CONFIG_CLASSES: dict[str, type[PretrainedConfig]] = {
    "llama": LlamaConfig,
    "mistral": MistralConfig,
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
    "qwen3_moe": Qwen3MoeConfig,
}
ARCHS = tuple(_CONFIG_CLASSES)

# The tiny mixture of experts: 2 of 8 experts per token, their weights renormalized as
# Qwen3-30B-A3B's are; layer 1 keeps the dense MLP, so that a model mixes both. 64 rows per
# expert split into whole GGUF blocks (32 columns) over 2 tensor-parallel ranks.
_TINY_MOE = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [1],
}


def make_config(
    arch: str,
    vocab_size: int,
    context_length: int,
    special_ids: dict[str, int],
    preset: str = "tiny",
) -> PretrainedConfig:
    """The config of a model of one fixture architecture, tiny unless a preset says otherwise."""
    kwargs: dict[str, Any] = {
        "vocab_size": vocab_size,
        **PRESETS[preset],
        "max_position_embeddings": context_length,
        "bos_token_id": special_ids["bos"],
        "eos_token_id": special_ids["eos"],
        "pad_token_id": special_ids["pad"],
        "dtype": "float32",
        # Qwen ties the output projection to the embeddings; Llama and Mistral do not.
        "tie_word_embeddings": arch.startswith("qwen"),
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    }
    if arch == "llama":
        # Llama 3's rope scaling, so that the fixture exercises it.
        kwargs["rope_parameters"] = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": max(context_length // 8, 16),
        }
    if arch == "mistral":
        kwargs["sliding_window"] = None
    if arch == "qwen3_moe":
        kwargs = {**_TINY_MOE, **kwargs}  # a preset's settings of the mixture win
    return _CONFIG_CLASSES[arch](**kwargs)


def make_tiny_model(
    arch: str,
    out: Path,
    seed: int = 0,
    context_length: int = 2048,
    preset: str = "tiny",
    weights: bool = True,
) -> Path:
    """Writes the model directory `out` and returns it; without `weights`, only its config,
    generation config and tokenizer (a preset's vocabulary may then exceed the tokenizer's)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose from {', '.join(ARCHS)}")
    add_bos = arch in ("llama", "mistral")
    backend = train_byte_level_bpe(add_bos=add_bos)
    special_ids: dict[str, int] = {}
    for name, token in SPECIAL_TOKENS.items():
        token_id = backend.token_to_id(token)
        assert token_id is not None, f"{token} missing from the trained vocabulary"
        special_ids[name] = token_id
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=SPECIAL_TOKENS["bos"],
        eos_token=SPECIAL_TOKENS["eos"],
        pad_token=SPECIAL_TOKENS["pad"],
        unk_token=SPECIAL_TOKENS["unk"],
        additional_special_tokens=[SPECIAL_TOKENS["im_start"], SPECIAL_TOKENS["im_end"]],
        model_max_length=context_length,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    config = make_config(arch, backend.get_vocab_size(), context_length, special_ids, preset)
    generation_config = GenerationConfig(
        bos_token_id=special_ids["bos"],
        eos_token_id=[special_ids["eos"], special_ids["im_end"]],
        pad_token_id=special_ids["pad"],
    )
    out.mkdir(parents=True, exist_ok=True)
    if weights:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.generation_config = generation_config
        model.save_pretrained(out)
    else:
        config.architectures = [type(config).__name__.replace("Config", "ForCausalLM")]
        config.save_pretrained(out)
        generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m srt.testing.make_tiny_model", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--arch", required=True, choices=ARCHS)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--preset", choices=PRESETS, default="tiny")
    parser.add_argument(
        "--no-weights", action="store_true", help="config and tokenizer only (--load-format dummy)"
    )
    parser.add_argument(
        "--gguf",
        choices=MIXES,
        help="also write the model as OUT/tiny.MIX.gguf, as llama.cpp writes a file of that mix",
    )
    args = parser.parse_args(argv)
    if args.context_length < 16:
        parser.error("argument --context-length: must be >= 16")
    if args.gguf and args.no_weights:
        parser.error("argument --gguf: needs the weights")
    make_tiny_model(
        args.arch,
        args.out,
        seed=args.seed,
        context_length=args.context_length,
        preset=args.preset,
        weights=not args.no_weights,
    )
    print(args.out)
    if args.gguf:
        gguf = args.out / f"tiny.{args.gguf}.gguf"
        try:
            write_tiny_gguf(args.out, gguf, args.gguf)
        except ValueError as e:  # Q2_K of rows not whole super-blocks; a MoE's dense layers
            parser.error(f"argument --gguf: {e}")
        print(gguf)
    return 0


if __name__ == "__main__":
    sys.exit(main())
