"""Qwen3-MoE, the sparse mixture of experts (models/qwen3_moe.py): the registry serves what its
file registers; a GGUF file's stacked experts load as each expert's blocks; a GGUF file alone,
as llama.cpp writes it, is served with the config llama.cpp computes from its metadata, or
refused naming a key it lacks; the engine's greedy ids are transformers'. Its logits against
transformers' are test_model_runner's (on every fixture architecture), TP=2 against TP=1
test_tensor_parallel's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from runner_helpers import (
    TinyModelFactory,
    assert_logits_close,
    make_runner,
    runner_extend_and_decode_logits,
)
from test_gguf_kquant_models import gguf_alone
from test_quantized_loading import blocks_of
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from srt.entrypoints.engine import Engine
from srt.kernels.cpu import cpu_kernels
from srt.kernels.cpu.quant_kernels import QuantizedWeight
from srt.layers.linear import Linear
from srt.layers.moe import SparseMoeBlock
from srt.model_executor.model_config import GGUF_CONFIG_KEYS, ModelConfig
from srt.model_executor.weight_loader import iterate_weights
from srt.models.qwen3_moe import GGUF_LAYER_NAMES, Qwen3MoeForCausalLM, is_sparse
from srt.models.registry import model_class_for

# Each expert projection's GGUF type; every other matrix q8_0, norms and the router float32.
EXPERT_FORMATS = {"gate_proj": "q4_0", "up_proj": "q4_0", "down_proj": "q8_0"}


def write_moe_gguf(path: Path, out: Path) -> dict[str, torch.Tensor]:
    """The tiny Qwen3-MoE model at `path` as GGUF file `out`, each layer's experts stacked into
    one 3-D tensor per projection as llama.cpp writes them; returns each checkpoint tensor's
    values once read back, by Hugging Face name."""
    gguf_part = {hf: gguf for gguf, hf in GGUF_LAYER_NAMES.items()}
    hf_config = AutoConfig.from_pretrained(path)
    writer = GGUFWriter(out, "qwen3moe")
    expected: dict[str, torch.Tensor] = {}
    # GGUF name -> (type, each expert's tensor in order)
    stacks: dict[str, tuple[str, list[torch.Tensor]]] = {}
    for name, tensor in iterate_weights(str(path), None, hf_config):
        assert isinstance(tensor, torch.Tensor)
        if name == "model.embed_tokens.weight":
            target, fmt = "token_embd.weight", "q8_0"
        elif name == "model.norm.weight":
            target, fmt = "output_norm.weight", None
        else:
            _, _, layer, rest = name.split(".", 3)
            part = rest.removesuffix(".weight")
            if ".experts." in part:
                _, expert, projection = part.rsplit(".", 2)
                fmt = EXPERT_FORMATS[projection]
                stack = gguf_part[f"mlp.experts.{{expert}}.{projection}"]
                experts = stacks.setdefault(f"blk.{layer}.{stack}.weight", (fmt, []))[1]
                assert len(experts) == int(expert), "experts come in order"
                experts.append(tensor)
                expected[name] = blocks_of(tensor, fmt).dequantize()
                continue
            target = f"blk.{layer}.{gguf_part[part]}.weight"
            fmt = None if tensor.dim() == 1 or part == "mlp.gate" else "q8_0"
        if fmt is None:
            writer.add_tensor(target, tensor.numpy())
            expected[name] = tensor
        else:
            kind = GGMLQuantizationType[fmt.upper()]
            writer.add_tensor(target, quantize(tensor.numpy(), kind), raw_dtype=kind)
            expected[name] = blocks_of(tensor, fmt).dequantize()
    for target, (fmt, experts) in stacks.items():
        kind = GGMLQuantizationType[fmt.upper()]
        writer.add_tensor(target, quantize(torch.stack(experts).numpy(), kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def test_the_registry_serves_its_architecture_and_gguf_model_type() -> None:
    assert model_class_for(AutoConfig.for_model("qwen3_moe")) is Qwen3MoeForCausalLM  # GGUF's
    config = AutoConfig.for_model("qwen3_moe", architectures=["Qwen3MoeForCausalLM"])
    assert model_class_for(config) is Qwen3MoeForCausalLM


def test_the_cpu_router_picks_the_experts_pytorch_does() -> None:
    """`cpu_kernels.moe_route` (the Rust router the mixture and the fused decode step share)
    against softmax and top-k in PyTorch; a bf16 input routes as its float32 values."""
    generator = torch.Generator().manual_seed(0)
    x, router = torch.randn(6, 64, generator=generator), torch.randn(8, 64, generator=generator)
    probs = torch.softmax(x @ router.T, dim=-1)
    top, top_ids = torch.topk(probs, 2)
    ids, weights = cpu_kernels.moe_route(x, router, 2, renormalize=False)
    assert torch.equal(ids, top_ids)
    torch.testing.assert_close(weights, top, atol=1e-6, rtol=0)
    ids, weights = cpu_kernels.moe_route(x, router, 2, renormalize=True)
    assert torch.equal(ids, top_ids)
    torch.testing.assert_close(weights, top / top.sum(-1, keepdim=True), atol=1e-6, rtol=0)
    half = x.bfloat16()
    for got, want in zip(
        cpu_kernels.moe_route(half, router, 3, True),
        cpu_kernels.moe_route(half.float(), router, 3, True),
        strict=True,
    ):
        assert torch.equal(got, want)


def test_a_gguf_file_s_stacked_experts_load_as_each_expert_s_blocks(
    tiny_model_factory: Callable[[str], Path], tmp_path: Path
) -> None:
    path = tiny_model_factory("qwen3_moe")
    hf_config = AutoConfig.from_pretrained(path)
    expected = write_moe_gguf(path, tmp_path / "moe.gguf")
    blocks = dict(iterate_weights(str(tmp_path), "moe.gguf", hf_config, "gguf"))
    assert blocks.keys() == expected.keys()
    assert "model.layers.0.mlp.experts.7.down_proj.weight" in blocks
    for name, tensor in blocks.items():
        if ".experts." in name:
            assert isinstance(tensor, QuantizedWeight), name
            assert tensor.fmt == EXPERT_FORMATS[name.split(".")[-2]]
        if isinstance(tensor, QuantizedWeight):
            tensor = tensor.dequantize()
        torch.testing.assert_close(tensor, expected[name], atol=0, rtol=0, msg=name)

    def runner_of(quantization: str) -> list[torch.Tensor]:
        runner = make_runner(path, load_format="dummy", max_total_tokens=256)
        weights = iterate_weights(str(tmp_path), "moe.gguf", hf_config, quantization)
        runner.model.load_weights(weights)  # type: ignore[operator]
        mixture = runner.model.get_submodule("model.layers.0.mlp")
        assert isinstance(mixture, SparseMoeBlock)
        down = mixture.experts[7].get_submodule("down_proj")
        assert isinstance(down, Linear)
        assert isinstance(down.quant, QuantizedWeight) == (quantization == "gguf")
        return runner_extend_and_decode_logits(runner)

    # The blocks against the same values dequantized: the kernels' rounding of activations.
    assert_logits_close(runner_of("gguf"), runner_of("none"))


def test_a_gguf_file_alone_is_served_with_the_config_llama_cpp_computes(
    tiny_model_factory: TinyModelFactory, tmp_path: Path
) -> None:
    """A qwen3moe file as llama.cpp writes it, nothing beside it: its config, read from its
    metadata, has the experts' width (which transformers does not map) and the renormalization
    of the chosen experts' weights that llama.cpp's graph always does (Qwen3MoeConfig's default
    does not), so that its logits (weights dequantized as they load) are those of the Hugging
    Face directory it was written from, loaded with the same values."""
    model = tiny_model_factory("qwen3_moe", "tiny-sparse")
    gguf, expected = gguf_alone(model, tmp_path / "gguf", "Q4_K_M")
    config = ModelConfig.load(str(gguf), "float32", torch.device("cpu")).hf_config
    written = AutoConfig.from_pretrained(model)
    for name in ("moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob"):
        assert getattr(config, name) == getattr(written, name), name
    assert all(is_sparse(config, layer) for layer in range(config.num_hidden_layers))

    served = make_runner(gguf, quantization="none", max_total_tokens=256)
    reference = make_runner(model, load_format="dummy", max_total_tokens=256)
    reference.model.load_weights(iter(expected.items()))  # type: ignore[operator]
    served_logits = runner_extend_and_decode_logits(served)
    reference_logits = runner_extend_and_decode_logits(reference)
    for ours, theirs in zip(served_logits, reference_logits, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("key", list(GGUF_CONFIG_KEYS["qwen3moe"].keys))
def test_a_gguf_file_alone_without_a_key_srt_needs_is_refused_naming_it(
    tiny_model_factory: TinyModelFactory, tmp_path: Path, key: str
) -> None:
    """transformers reads a config from a file without the key all the same (its default, or
    nothing, in its place): srt refuses the file instead of serving experts of the wrong
    shape or number."""
    gguf, _ = gguf_alone(
        tiny_model_factory("qwen3_moe", "tiny-sparse"), tmp_path / "gguf", "Q4_K_M"
    )
    name = f"qwen3moe.{key}".encode()
    data = gguf.read_bytes()
    assert data.count(name) == 1
    # Renamed in place, its length kept (the file stays whole), to a key no reader knows.
    gguf.write_bytes(data.replace(name, name.upper()))
    with pytest.raises(ValueError, match="lacks metadata key") as refused:
        ModelConfig.load(str(gguf), "float32", torch.device("cpu"))
    attribute = GGUF_CONFIG_KEYS["qwen3moe"].keys[key]
    assert str(refused.value) == (
        f"tiny.Q4_K_M.gguf lacks metadata key qwen3moe.{key} (the model's {attribute}), which "
        "srt needs to serve a qwen3moe file"
    )


@pytest.mark.slow
def test_the_engine_generates_transformers_greedy_ids(
    tiny_model_factory: Callable[[str], Path],
) -> None:
    path = tiny_model_factory("qwen3_moe")
    tokenizer = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    prompts = ["The quick brown fox jumps over the lazy dog", "def main():\n    return 0"]
    params = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    with Engine(model_path=str(path), context_length=512, dtype="float32") as engine:
        results = engine.generate(prompts, params)
    assert isinstance(results, list)
    for prompt, result in zip(prompts, results, strict=True):
        ids = tokenizer(prompt)["input_ids"]
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=12,
                min_new_tokens=12,
                do_sample=False,
            )
        assert result["output_ids"] == out[0, len(ids) :].tolist()
