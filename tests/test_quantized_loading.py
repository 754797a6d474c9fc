"""Quantized weights on tiny random models: GGUF blocks installed in place of linear and embedding
weights (fused shards stacked, or held in parts where their formats differ; dequantized where one
is float), and `--quantization int8` against the float model."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from runner_helpers import assert_logits_close, make_runner, runner_extend_and_decode_logits
from transformers import AutoConfig

from srt.kernels.cpu.quant_kernels import BLOCK_BYTES, QuantizedWeight
from srt.kernels.cpu.quant_parts import QuantizedParts
from srt.layers.linear import Linear
from srt.layers.quantization import CheckpointTensor, Int8Weight, weight_bytes
from srt.model_executor.model_config import resolve_quantization
from srt.model_executor.model_runner import ModelRunner
from srt.model_executor.weight_loader import iterate_weights
from srt.models.llama import LlamaForCausalLM
from srt.server_args import ServerArgs
from srt.server_args_check import ServerArgsError
from srt.testing import gguf_kquants
from srt.testing.gguf_kquants import K_QUANTS

# int8 weights err by up to half a step (absmax / 254 of their row), and the kernel rounds its
# activations and output to bfloat16 (8 significant bits). Measured on the four tiny fixture
# models: logits within 2.5% of their largest magnitude (2.2% with float activations, so the
# weights' rounding is most of it); a wrong layout or scale would be off by the whole logit.
INT8_LOGITS_RTOL = 0.05


def blocks_of(weight: torch.Tensor, fmt: str) -> QuantizedWeight:
    """`weight` quantized by the gguf package (llama.cpp's reference quantizers), or for a
    K-quant, which the package does not quantize, by `srt.testing.gguf_kquants`."""
    kind = GGMLQuantizationType[fmt.upper()]
    values = weight.numpy().astype(np.float32)
    data = gguf_kquants.quantize(values, kind) if kind in K_QUANTS else quantize(values, kind)
    return QuantizedWeight(torch.from_numpy(np.ascontiguousarray(data)), fmt, weight.shape[1])


def checkpoint(
    path: Path, formats: Callable[[str], str | None]
) -> list[tuple[str, CheckpointTensor]]:
    """The tensors of a tiny safetensors model, each weight named by `formats` as blocks."""
    runner = make_runner(path, load_format="dummy")
    config = runner.model_config
    tensors: list[tuple[str, CheckpointTensor]] = []
    for name, tensor in iterate_weights(config.model_path, None, config.hf_config):
        assert isinstance(tensor, torch.Tensor)
        fmt = formats(name)
        tensors.append((name, blocks_of(tensor, fmt) if fmt else tensor))
    return tensors


def dequantized(tensors: list[tuple[str, CheckpointTensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in tensors:
        yield name, tensor if isinstance(tensor, torch.Tensor) else tensor.dequantize()


def loaded(
    path: Path, tensors: Iterator[tuple[str, CheckpointTensor]] | list[tuple[str, CheckpointTensor]]
) -> ModelRunner:
    runner = make_runner(path, load_format="dummy", max_total_tokens=256)
    runner.model.load_weights(iter(tensors))  # type: ignore[operator]
    return runner


def llama_of(runner: ModelRunner) -> LlamaForCausalLM:
    """The runner's model, typed (every fixture architecture is a LlamaForCausalLM)."""
    assert isinstance(runner.model, LlamaForCausalLM)
    return runner.model


def linear_at(runner: ModelRunner, name: str) -> Linear:
    module = runner.model.get_submodule(name)
    assert isinstance(module, Linear)
    return module


def every_matrix(fmt: str) -> Callable[[str], str | None]:
    return lambda name: fmt if name.endswith("proj.weight") or "embed_tokens" in name else None


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1"])
def test_blocks_replace_linear_and_tied_embedding_weights(
    tiny_model_factory: Callable[[str], Path], fmt: str
) -> None:
    path = tiny_model_factory("qwen2")  # tied embeddings, q/k/v biases
    tensors = checkpoint(path, every_matrix(fmt))
    runner = loaded(path, tensors)
    model = llama_of(runner)
    embedding = model.model.embed_tokens
    assert isinstance(embedding.quant, QuantizedWeight)
    assert model.lm_head.quant is embedding.quant
    names = {name for name, _ in model.named_parameters()}
    assert not any(n.endswith(("proj.weight", "embed_tokens.weight")) for n in names)
    assert "model.layers.0.self_attn.qkv_proj.bias" in names
    qkv = linear_at(runner, "model.layers.0.self_attn.qkv_proj").quant
    assert isinstance(qkv, QuantizedWeight)
    assert qkv.fmt == fmt
    by_name = dict(tensors)
    shards = [by_name[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]
    blocks = [s.blocks for s in shards if isinstance(s, QuantizedWeight) and s.blocks is not None]
    assert len(blocks) == 3
    assert qkv.blocks is not None
    assert torch.equal(qkv.blocks, torch.cat(blocks))

    reference = loaded(path, dequantized(tensors))
    # The float kernel sums as F.linear does; the integer kernel (where the CPU has one) first
    # splits the activations into two int8 parts (about 15 bits): both within 1e-3.
    assert_logits_close(
        runner_extend_and_decode_logits(runner), runner_extend_and_decode_logits(reference)
    )
    assert weight_bytes(model) < weight_bytes(reference.model) / 3


def test_shards_in_different_formats_are_held_in_parts(
    tiny_model_factory: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    path = tiny_model_factory("qwen2")  # q/k/v biases
    formats = {"q_proj": "q8_0", "k_proj": "q8_0", "v_proj": "q4_0", "gate_proj": "q4_1"}

    def fmt_of(name: str) -> str | None:
        return formats.get(name.split(".")[-2], "q4_0") if name.endswith("proj.weight") else None

    tensors = checkpoint(path, fmt_of)
    with caplog.at_level(logging.INFO, logger="srt.models.loading"):
        runner = loaded(path, tensors)
    assert not caplog.records
    for layer in range(runner.model_config.num_layers):
        prefix = f"model.layers.{layer}"
        qkv = linear_at(runner, f"{prefix}.self_attn.qkv_proj").quant
        gate_up = linear_at(runner, f"{prefix}.mlp.gate_up_proj").quant
        assert isinstance(qkv, QuantizedParts)
        assert isinstance(gate_up, QuantizedParts)
        assert (qkv.formats, gate_up.formats) == (("q8_0", "q4_0"), ("q4_1", "q4_0"))
        for parts in (qkv, gate_up):  # blocks (or tiles), not float32
            assert parts.nbytes < parts.out_features * parts.in_features * 4 / 3
    reference = loaded(path, dequantized(tensors))
    assert_logits_close(
        runner_extend_and_decode_logits(runner), runner_extend_and_decode_logits(reference)
    )


def test_a_fused_weight_with_a_float_shard_is_dequantized_with_a_log_line(
    tiny_model_factory: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    path = tiny_model_factory("llama")
    formats = {"q_proj": "q8_0", "k_proj": "q4_0", "gate_proj": "q4_1", "up_proj": "q4_1"}

    def fmt_of(name: str) -> str | None:
        part = name.split(".")[-2]
        return formats.get(part) if name.startswith("model.layers.0.") else None

    tensors = checkpoint(path, fmt_of)
    with caplog.at_level(logging.INFO, logger="srt.models.loading"):
        runner = loaded(path, tensors)
    qkv = linear_at(runner, "model.layers.0.self_attn.qkv_proj")
    assert qkv.quant is None
    assert isinstance(linear_at(runner, "model.layers.0.mlp.gate_up_proj").quant, QuantizedWeight)
    by_name = dict(dequantized(tensors))
    expected = torch.cat([by_name[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    torch.testing.assert_close(qkv.weight, expected, atol=0, rtol=0)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "model.layers.0.self_attn.qkv_proj.weight: a shard is float, the others in q4_0 and "
        "q8_0: dequantized to torch.float32"
    ]


def test_blocks_of_the_wrong_shape_are_refused(tiny_model_factory: Callable[[str], Path]) -> None:
    path = tiny_model_factory("llama")
    tensors = checkpoint(path, every_matrix("q8_0"))
    name = "model.layers.1.self_attn.o_proj.weight"
    wrong = [(n, blocks_of(torch.randn(32, 64), "q8_0") if n == name else t) for n, t in tensors]
    with pytest.raises(ValueError, match=r"o_proj.weight: a quantized \[32, 64\] weight"):
        loaded(path, wrong)


def test_int8_weight_is_its_dequantized_weight_to_bfloat16_rounding() -> None:
    generator = torch.Generator().manual_seed(0)
    for out_features, in_features in [(1, 1), (7, 33), (96, 64), (257, 130)]:
        weight = torch.randn(out_features, in_features, generator=generator)
        weight[0] = 0  # an all-zero row
        int8 = Int8Weight.quantize(weight)
        deq = int8.dequantize()
        step = int8.scales.float()[:, None]
        assert bool(((deq - weight).abs() <= step / 2 + 1e-6 * weight.abs()).all())
        bias = torch.randn(out_features, generator=generator)
        for rows in (1, 5, 40):
            x = torch.randn(rows, in_features, generator=generator)
            # The kernel's inputs are x in bfloat16 and these weights; its output is bfloat16.
            reference = torch.nn.functional.linear(x.bfloat16().float(), deq, bias)
            ours = int8.linear(x, bias)
            assert ours.dtype == torch.float32
            assert ours.shape == reference.shape
            scale = float(reference.abs().max()) + 1e-6
            torch.testing.assert_close(ours, reference, atol=2**-7 * scale, rtol=0)
            ours_bf16 = int8.linear(x.bfloat16(), bias.bfloat16())
            assert ours_bf16.dtype == torch.bfloat16
            torch.testing.assert_close(ours_bf16.float(), reference, atol=2**-6 * scale, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_int8_model_matches_the_float_model(
    tiny_model_factory: Callable[[str], Path], arch: str
) -> None:
    path = tiny_model_factory(arch)
    runner = make_runner(path, quantization="int8", max_total_tokens=256)
    float_runner = make_runner(path, max_total_tokens=256)
    tied = runner.model_config.hf_config.tie_word_embeddings
    for name, module in runner.model.named_modules():
        if isinstance(module, Linear):
            # A tied lm_head stays float: the embedding's lookups read the same table.
            keeps_float = tied and name == "lm_head"
            assert isinstance(module.quant, Int8Weight) != keeps_float, name
    assert runner.weight_bytes < float_runner.weight_bytes
    for ours, theirs in zip(
        runner_extend_and_decode_logits(runner),
        runner_extend_and_decode_logits(float_runner),
        strict=True,
    ):
        scale = float(theirs.abs().max())
        torch.testing.assert_close(ours, theirs, atol=INT8_LOGITS_RTOL * scale, rtol=0)


def test_quantization_flag_is_checked() -> None:
    with pytest.raises(ServerArgsError, match="--quantization: gguf needs a GGUF file"):
        ServerArgs(model_path="/models/llama", quantization="gguf")
    with pytest.raises(ServerArgsError, match="invalid choice 'int4'"):
        ServerArgs(quantization="int4")
    assert ServerArgs(model_path="/m/x.gguf", quantization="gguf").quantization == "gguf"


def test_quantization_resolves_per_checkpoint_and_device(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_quantization("auto", "m.gguf", cpu) == "gguf"
    assert resolve_quantization("auto", None, cpu) == "none"
    assert resolve_quantization("int8", None, cpu) == "int8"
    assert resolve_quantization("int8", "m.gguf", cpu) == "int8"  # dequantized, then int8
    with pytest.raises(ValueError, match="gguf needs a GGUF file"):
        resolve_quantization("gguf", None, cpu)
    # Quantized formats run on the CPU only: on CUDA the weights load dequantized, said once.
    with caplog.at_level(logging.INFO, logger="srt.model_executor.model_config"):
        assert resolve_quantization("auto", "m.gguf", cuda) == "none"
        assert resolve_quantization("int8", None, cuda) == "none"
        assert resolve_quantization("none", "m.gguf", cuda) == "none"
    assert [r.getMessage() for r in caplog.records] == [
        f"--quantization {name} runs on the CPU only: on cuda the weights are dequantized to "
        "the model's dtype as they load"
        for name in ("gguf", "int8")
    ]


# The tiny llama's tensors under GGUF's names, and the type each is written in.
GGUF_NAMES = {
    "model.embed_tokens.weight": ("token_embd.weight", "q4_0"),
    "lm_head.weight": ("output.weight", "q8_0"),
    "model.norm.weight": ("output_norm.weight", None),
}
GGUF_LAYER_PARTS = {
    "input_layernorm": ("attn_norm", None),
    "post_attention_layernorm": ("ffn_norm", None),
    "self_attn.q_proj": ("attn_q", "q4_1"),
    "self_attn.k_proj": ("attn_k", "q8_0"),
    "self_attn.v_proj": ("attn_v", "q8_0"),
    "self_attn.o_proj": ("attn_output", "q4_0"),
    "mlp.gate_proj": ("ffn_gate", "q8_0"),
    "mlp.up_proj": ("ffn_up", "q8_0"),
    "mlp.down_proj": ("ffn_down", "f16"),
}


def gguf_name(name: str) -> tuple[str, str | None]:
    if name in GGUF_NAMES:
        return GGUF_NAMES[name]
    _, _, layer, rest = name.split(".", 3)
    part, fmt = GGUF_LAYER_PARTS[rest.removesuffix(".weight")]
    return f"blk.{layer}.{part}.weight", fmt


def llama_cpp_permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's conversion of q/k rows to its interleaved rotary layout."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def write_gguf(
    path: Path, out: Path, name_of: Callable[[str], tuple[str, str | None]] = gguf_name
) -> dict[str, torch.Tensor]:
    """Writes the tiny llama model at `path` as GGUF file `out`, each tensor under the name and in
    the type (None: float32) that `name_of` gives, q/k rows permuted as llama.cpp's conversion
    does; returns what each tensor holds once read back, by Hugging Face name."""
    hf_config = AutoConfig.from_pretrained(path)
    writer = GGUFWriter(out, "llama")
    expected: dict[str, torch.Tensor] = {}
    for name, tensor in iterate_weights(str(path), None, hf_config):
        assert isinstance(tensor, torch.Tensor)
        target, fmt = name_of(name)
        stored = tensor
        if name.endswith("q_proj.weight"):
            stored = llama_cpp_permute(tensor, hf_config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            stored = llama_cpp_permute(tensor, hf_config.num_key_value_heads)
        values = stored.numpy()
        if fmt is None:
            writer.add_tensor(target, values)
            expected[name] = tensor
        elif fmt == "f16":
            writer.add_tensor(target, values.astype(np.float16))
            expected[name] = tensor.half().float()
        else:
            kind = GGMLQuantizationType[fmt.upper()]
            writer.add_tensor(target, quantize(values, kind), raw_dtype=kind)
            expected[name] = blocks_of(tensor, fmt).dequantize()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def test_a_gguf_file_keeps_its_blocks_unpermuted_and_dequantizes_other_types(
    tiny_model_factory: Callable[[str], Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tiny_model_factory("llama")
    hf_config = AutoConfig.from_pretrained(path)
    expected = write_gguf(path, tmp_path / "tiny.gguf")

    with caplog.at_level(logging.INFO, logger="srt.model_executor.weight_loader"):
        loaded = dict(iterate_weights(str(tmp_path), "tiny.gguf", hf_config, "gguf"))
    assert loaded.keys() == expected.keys()
    for name, tensor in loaded.items():
        fmt = gguf_name(name)[1]
        if fmt in BLOCK_BYTES:
            assert isinstance(tensor, QuantizedWeight), name
            assert tensor.fmt == fmt
            tensor = tensor.dequantize()
        assert isinstance(tensor, torch.Tensor), name
        torch.testing.assert_close(tensor, expected[name], atol=0, rtol=0, msg=name)
    assert [r.getMessage() for r in caplog.records] == [
        "tiny.gguf: tensors of types srt does not multiply in blocks are dequantized: 2 F16"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="srt.model_executor.weight_loader"):
        dense = dict(iterate_weights(str(tmp_path), "tiny.gguf", hf_config, "none"))
    assert all(isinstance(t, torch.Tensor) for t in dense.values())
    assert not caplog.records
