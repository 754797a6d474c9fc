"""Checkpoint tensors as (Hugging Face name, tensor) pairs: safetensors shards or a GGUF file.

GGUF tensors are renamed to Hugging Face's names (a layer's as its model class declares them,
`gguf_layer_names`; a name with `{expert}` is a 3-D tensor of a mixture's experts, cut into one
tensor per expert) and dequantized with the `gguf` package, except, with `--quantization gguf`,
the matrices of the types srt multiplies in their blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the
K-quants Q4_K, Q5_K, Q6_K: `quant_kernels.FORMATS`), which come as `QuantizedWeight`s holding
the file's bytes. So a file of mixed types (llama.cpp's Q4_K_M: Q4_K, Q5_0 and Q6_K matrices,
float32 norms) loads with no per-tensor case in model code; the other types (Q2_K, Q3_K,
F16, ...) are dequantized, said once in the log. A file holding a type the `gguf` package
cannot dequantize either, or a tensor no model layer names, is refused before any tensor is
loaded, naming them.
For the Llama architecture (Mistral's files included: llama.cpp writes Mistral as Llama),
llama.cpp's conversion permuted the rows of the q/k projections (to its interleaved rotary
layout), which is undone here; each row of blocks is one row of weights, so the same permutation
of rows undoes it on blocks too.
"""

from __future__ import annotations

import functools
import logging
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from safetensors import safe_open

from srt.kernels.cpu.quant_kernels import FORMATS, QuantizedWeight
from srt.layers.lazy_tensor import LazyTensor
from srt.layers.quantization import CheckpointTensor
from srt.models.registry import model_class_for

if TYPE_CHECKING:
    from srt.model_executor.gguf_tensors import GGUFTensor

logger = logging.getLogger(__name__)

_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def iterate_weights(
    model_path: str, gguf_file: str | None, hf_config: Any, quantization: str = "none"
) -> Iterator[tuple[str, CheckpointTensor]]:
    """Every tensor of a local checkpoint, or of a hub id (downloaded when the user has network).
    With `quantization` "gguf", a GGUF file's matrices of the types srt multiplies in blocks
    (`quant_kernels.FORMATS`) stay `QuantizedWeight`s."""
    directory = Path(model_path)
    if not directory.is_dir():
        from huggingface_hub import snapshot_download

        patterns = [gguf_file] if gguf_file else ["*.safetensors", "*.json"]
        directory = Path(snapshot_download(model_path, allow_patterns=patterns))
    if gguf_file is not None:
        yield from _gguf_weights(directory / gguf_file, hf_config, quantization == "gguf")
        return
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {directory}")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, f.get_tensor(name)


def iterate_weight_slices(
    model_path: str, gguf_file: str | None, hf_config: Any, quantization: str = "none"
) -> Iterator[tuple[str, CheckpointTensor | LazyTensor]]:
    """`iterate_weights`, but a local safetensors checkpoint's tensors come unread
    (`LazyTensor`), so that a tensor-parallel rank reads only its shard of each."""
    directory = Path(model_path)
    files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    if gguf_file is not None or not files:
        yield from iterate_weights(model_path, gguf_file, hf_config, quantization)
        return
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, LazyTensor(f.get_slice(name))


def _gguf_weights(
    path: Path, hf_config: Any, keep_blocks: bool
) -> Iterator[tuple[str, CheckpointTensor]]:
    from srt.model_executor.gguf_tensors import ROPE_FREQS, read_tensors

    # transformers reads a llama.cpp Mistral file as Llama, or as Mistral where it is named so.
    permute_qk = hf_config.model_type in ("llama", "mistral")
    layer_names = getattr(model_class_for(hf_config), "gguf_layer_names", {})
    # Llama 3's rope scaling is the config's (`ModelConfig.load` reads it), not a weight.
    tensors = [tensor for tensor in read_tensors(path) if tensor.name != ROPE_FREQS]
    names = [_hf_name(tensor.name, layer_names) for tensor in tensors]
    _refuse_unservable(path, tensors)
    dequantized: Counter[str] = Counter()
    for tensor, name in zip(tensors, names, strict=True):
        kind = tensor.tensor_type.name
        shape = tuple(reversed(tensor.shape))
        stacked = "{expert}" in name
        blocks = keep_blocks and kind.lower() in FORMATS and len(shape) == 2 + stacked
        if not blocks and kind != "F32":
            dequantized[kind] += 1
        if not stacked:
            weight = _gguf_tensor(tensor, tensor.data, shape, blocks, name, permute_qk, hf_config)
            yield name, weight
            continue
        # Every expert's weight stacked: [experts, rows, columns], one tensor per expert.
        if len(shape) != 3:
            raise ValueError(f"GGUF tensor {tensor.name} of shape {shape} is not one per expert")
        for expert in range(shape[0]):
            expert_name = name.format(expert=expert)
            data = tensor.data[expert]
            yield expert_name, _gguf_tensor(tensor, data, shape[1:], blocks, expert_name)
    if keep_blocks and dequantized:
        logger.info(
            "%s: tensors of types srt does not multiply in blocks are dequantized: %s",
            path.name,
            ", ".join(f"{n} {kind}" for kind, n in sorted(dequantized.items())),
        )


def _refuse_unservable(path: Path, tensors: list[GGUFTensor]) -> None:
    """ValueError naming the types of `tensors` that srt can serve neither in blocks nor
    dequantized (the `gguf` package cannot decode them), and tensors of each."""
    from srt.model_executor.gguf_tensors import listed

    unservable: dict[str, list[str]] = {}
    for tensor in tensors:
        if not _dequantizable(tensor.tensor_type):
            unservable.setdefault(tensor.tensor_type.name, []).append(tensor.name)
    if unservable:
        raise ValueError(
            f"{path.name} holds tensor types srt cannot serve (the gguf package cannot "
            "dequantize them): "
            + "; ".join(f"{kind} ({listed(names)})" for kind, names in unservable.items())
        )


@functools.cache
def _dequantizable(kind: GGMLQuantizationType) -> bool:
    """Whether the `gguf` package dequantizes tensors of type `kind` (tried on one zero block:
    it says so only by raising NotImplementedError)."""
    from gguf.quants import dequantize

    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[kind][1]), np.uint8), kind)
    except NotImplementedError:
        return False
    return True


def _gguf_tensor(
    tensor: GGUFTensor,
    data: np.ndarray,
    shape: tuple[int, ...],
    blocks: bool,
    name: str,
    permute_qk: bool = False,
    hf_config: Any = None,
) -> CheckpointTensor:
    """`data` (of GGUF tensor `tensor`, Hugging Face name `name`, `shape` in PyTorch's order):
    the file's blocks of a matrix where `blocks`, else float32 values."""
    from gguf.quants import dequantize

    if blocks:
        # [rows, bytes per row] as the file holds them; a copy, since the reader's arrays map
        # the file read-only.
        held = torch.from_numpy(np.array(data, dtype=np.uint8))
        return QuantizedWeight(
            _permuted(held, name, permute_qk, hf_config), tensor.tensor_type.name.lower(), shape[1]
        )
    values = dequantize(data, tensor.tensor_type)
    weight = torch.from_numpy(np.array(values.reshape(shape), dtype=np.float32))
    return _permuted(weight, name, permute_qk, hf_config)


def _permuted(weight: torch.Tensor, name: str, permute_qk: bool, hf_config: Any) -> torch.Tensor:
    """`weight` (float rows or rows of blocks) with llama.cpp's q/k row order undone."""
    if permute_qk and name.endswith("self_attn.q_proj.weight"):
        return _unpermute(weight, hf_config.num_attention_heads)
    if permute_qk and name.endswith("self_attn.k_proj.weight"):
        return _unpermute(weight, hf_config.num_key_value_heads)
    return weight


def _hf_name(gguf_name: str, layer_names: Mapping[str, str]) -> str:
    """The Hugging Face name of GGUF tensor `gguf_name`, a layer's as `layer_names` map them."""
    if gguf_name in _GGUF_GLOBAL_NAMES:
        return _GGUF_GLOBAL_NAMES[gguf_name]
    match = _GGUF_LAYER.fullmatch(gguf_name)
    if match is None or match.group(2) not in layer_names:
        raise ValueError(f"GGUF tensor {gguf_name} is not one srt knows how to load")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{layer_names[part]}.{kind}"


def _unpermute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undoes llama.cpp's per-head interleaving of the rotary halves of q/k projection rows.
    (In numpy: PyTorch's strided copy of these rows took 4 ms a weight on a busy 2-core
    machine, its OpenMP threads waiting on each other; numpy's takes tens of microseconds.)"""
    rows = weight.shape[0]
    heads = weight.numpy().reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
    return torch.from_numpy(np.ascontiguousarray(heads.swapaxes(1, 2)).reshape(weight.shape))
