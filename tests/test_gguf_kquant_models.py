"""GGUF files as llama.cpp writes them, in its K-quant mixes, of each architecture srt serves:
the config read from the file's metadata, every tensor placed with no per-tensor case in model
code, the types srt multiplies in blocks kept as the file holds them (served in
test_gguf_kquant_serving.py), the others dequantized at load, said once; files srt cannot serve
refused before anything loads, naming why."""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from runner_helpers import make_runner
from transformers import AutoConfig

from srt.kernels.cpu.quant_kernels import QuantizedWeight
from srt.model_executor.weight_loader import iterate_weights
from srt.model_info import _DONE_MARKER
from srt.testing.gguf_kquants import quantize
from srt.testing.tiny_gguf import write_tiny_gguf

Q = GGMLQuantizationType
LOADER = "srt.model_executor.weight_loader"


def gguf_alone(
    model: Path, directory: Path, mix: str, beside: bool = False
) -> tuple[Path, dict[str, torch.Tensor]]:
    """`model` written as `directory`/tiny.`mix`.gguf, and what its tensors hold: with nothing
    beside it (its config comes from its metadata, as for a file downloaded alone), or `beside`
    the Hugging Face files of `model` in a directory marked as prepared (read from those)."""
    if beside:
        shutil.copytree(model, directory, ignore=shutil.ignore_patterns("*.safetensors"))
        (directory / _DONE_MARKER).write_text("the tiny model, written by a test\n")
    else:
        directory.mkdir()
    gguf = directory / f"tiny.{mix}.gguf"
    return gguf, write_tiny_gguf(model, gguf, mix)


def dequantized_log(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.name == LOADER]


@pytest.mark.parametrize(
    ("mix", "held", "types"),
    [
        # Of the two layers, llama.cpp gives the second's attn_v and ffn_down more bits.
        ("Q4_K_M", {"q4_k": 13, "q6_k": 3}, None),
        ("Q5_K_M", {"q5_k": 13, "q6_k": 3}, None),
        # Q2_K's matrices dequantized; its attn_v and ffn_down (Q4_K) and output (Q6_K) not
        ("Q2_K", {"q4_k": 2, "q6_k": 1}, "13 Q2_K"),
    ],
)
def test_each_k_quant_mix_keeps_the_types_srt_multiplies_in_blocks(
    tiny_k_model: Callable[[str], Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    mix: str,
    held: dict[str, int],
    types: str | None,
) -> None:
    model = tiny_k_model("mistral")  # untied: an output layer
    gguf, expected = gguf_alone(model, tmp_path / "gguf", mix)
    hf_config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with caplog.at_level(logging.INFO, logger=LOADER):
        loaded = dict(iterate_weights(str(gguf.parent), gguf.name, hf_config, "gguf"))
    assert loaded.keys() == expected.keys()
    formats: Counter[str] = Counter()
    for name, tensor in loaded.items():
        if isinstance(tensor, QuantizedWeight):
            formats[tensor.fmt] += 1
            tensor = tensor.dequantize()
        torch.testing.assert_close(tensor, expected[name], atol=0, rtol=0, msg=name)
    assert formats == held
    said = f"{gguf.name}: tensors of types srt does not multiply in blocks are dequantized: {types}"
    assert dequantized_log(caplog.records) == ([said] if types else [])


def write_with_types(out: Path, types: dict[str, GGMLQuantizationType]) -> None:
    """A qwen3 GGUF file of a float embedding, then `types`' tensors (zeros, 256 by 256)."""
    writer = GGUFWriter(out, "qwen3")
    writer.add_tensor("token_embd.weight", np.zeros((16, 256), np.float32))
    for name, kind in types.items():
        if kind == Q.Q8_K:  # quantized by no encoder: zero blocks of its size
            writer.add_tensor(name, np.zeros((256, 292), np.uint8), raw_dtype=kind)
        else:
            blocks = quantize(np.zeros((256, 256), np.float32), kind)
            writer.add_tensor(name, blocks, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def set_type_id(path: Path, tensor: str, type_id: int) -> None:
    """Rewrites the type of 2-D `tensor` in the header of GGUF file `path` (after its name: the
    dimension count, two dimensions, then the type)."""
    data = bytearray(path.read_bytes())
    at = data.index(tensor.encode()) + len(tensor) + 4 + 2 * 8
    data[at : at + 4] = type_id.to_bytes(4, "little")
    path.write_bytes(bytes(data))


def test_a_file_of_types_srt_cannot_serve_is_refused_before_anything_loads(
    tiny_k_model: Callable[[str], Path], tmp_path: Path
) -> None:
    hf_config = AutoConfig.from_pretrained(tiny_k_model("qwen3"))
    gguf = tmp_path / "tiny.gguf"
    write_with_types(
        gguf,
        {
            "blk.0.attn_q.weight": Q.Q4_K,
            "blk.0.attn_k.weight": Q.Q8_K,
            "blk.1.attn_k.weight": Q.Q8_K,
            "blk.0.attn_v.weight": Q.Q6_K,
        },
    )
    weights = iterate_weights(str(tmp_path), gguf.name, hf_config, "gguf")
    with pytest.raises(ValueError, match="cannot serve") as refused:
        next(weights)
    assert str(refused.value) == (
        "tiny.gguf holds tensor types srt cannot serve (the gguf package cannot dequantize "
        "them): Q8_K (blk.0.attn_k.weight, blk.1.attn_k.weight)"
    )

    # A type id newer than the gguf package: its blocks' size unknown, the file unreadable.
    set_type_id(gguf, "blk.0.attn_v.weight", 250)
    weights = iterate_weights(str(tmp_path), gguf.name, hf_config, "gguf")
    with pytest.raises(ValueError, match="unknown") as refused:
        next(weights)
    assert str(refused.value) == (
        "tensor types unknown to the gguf package, which srt cannot serve: "
        "type 250 (blk.0.attn_v.weight)"
    )


def test_a_tensor_no_layer_names_is_refused_before_anything_loads(
    tiny_k_model: Callable[[str], Path], tmp_path: Path
) -> None:
    hf_config = AutoConfig.from_pretrained(tiny_k_model("qwen3"))
    write_with_types(
        tmp_path / "tiny.gguf", {"blk.0.attn_q.weight": Q.Q4_K, "blk.0.attn_sinks.weight": Q.Q4_K}
    )
    weights = iterate_weights(str(tmp_path), "tiny.gguf", hf_config, "gguf")
    with pytest.raises(ValueError, match=r"blk\.0\.attn_sinks\.weight is not one srt knows"):
        next(weights)


def test_a_gguf_architecture_srt_does_not_serve_is_refused_by_name(tmp_path: Path) -> None:
    # phi3: one transformers reads a config of, srt has no model for.
    writer = GGUFWriter(tmp_path / "phi.gguf", "phi3")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(64)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(16)
    writer.add_tensor("token_embd.weight", np.zeros((16, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="unsupported GGUF architecture phi3; srt serves GGUF "):
        make_runner(tmp_path / "phi.gguf")


def test_rope_freqs_that_differ_from_the_config_beside_are_refused(
    tiny_k_model: Callable[[str], Path], tmp_path: Path
) -> None:
    """A Llama 3 file (its rope scaling in `rope_freqs`) beside a config of plain rope."""
    gguf, _ = gguf_alone(tiny_k_model("llama"), tmp_path / "gguf", "Q4_K_M", beside=True)
    config = json.loads((gguf.parent / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    (gguf.parent / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"rope_freqs\.weight .* is not the rope scaling of"):
        make_runner(gguf)
