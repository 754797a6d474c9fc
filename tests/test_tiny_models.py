"""The fixture models load and generate through Hugging Face transformers, offline."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from srt.model_executor.gguf_tensors import read_tensors
from srt.testing.make_tiny_model import main, make_tiny_model
from srt.testing.tiny_gguf import write_tiny_gguf

EXPECTED_ARCHITECTURE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


def test_loads_and_generates(tiny_model: Path) -> None:
    config = AutoConfig.from_pretrained(tiny_model)
    assert config.architectures[0] in EXPECTED_ARCHITECTURE.values()
    assert config.num_key_value_heads < config.num_attention_heads  # grouped-query attention
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert len(tokenizer) == config.vocab_size
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    inputs = tokenizer(["The quick brown fox"], return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    new_ids = out[0, inputs["input_ids"].shape[1] :]
    assert new_ids.shape == (8,)
    # Random weights still give a proper distribution over the whole vocabulary.
    logits = model(**inputs).logits
    assert logits.shape[-1] == config.vocab_size
    assert torch.isfinite(logits).all()
    assert logits[0, -1].std() > 0.1


def test_chat_template_and_special_tokens(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    for token in ("<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1
    generation_config = json.loads((tiny_model / "generation_config.json").read_text())
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in generation_config["eos_token_id"]


@pytest.mark.parametrize(
    "text",
    [
        "plain ascii, with punctuation!",
        "emoji 👋🏽 and family 👨‍👩‍👧 and flags 🇫🇷",
        "中文和日本語のテキスト、한국어",
        "combining marks: e\u0301 a\u0308 n\u0303",
        "  leading spaces, tabs\tand\nnewlines  ",
    ],
)
def test_tokenizer_round_trips(tiny_model_factory: Callable[[str], Path], text: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_factory("qwen3"))
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    if any(ord(c) > 0x2000 for c in text):
        # Multi-byte characters split into several byte tokens, at least one of which alone is
        # not valid UTF-8: the case incremental detokenizers must hold back.
        assert any("\ufffd" in tokenizer.decode([i]) for i in ids)


def test_llama_adds_bos_and_qwen_does_not(tiny_model_factory: Callable[[str], Path]) -> None:
    llama = AutoTokenizer.from_pretrained(tiny_model_factory("llama"))
    qwen = AutoTokenizer.from_pretrained(tiny_model_factory("qwen2"))
    assert llama.encode("hello")[0] == llama.bos_token_id
    assert qwen.encode("hello")[0] != qwen.bos_token_id


def test_llama_fixture_uses_llama3_rope_scaling(tiny_model_factory: Callable[[str], Path]) -> None:
    config = json.loads((tiny_model_factory("llama") / "config.json").read_text())
    rope = config.get("rope_parameters") or config.get("rope_scaling")
    assert rope["rope_type"] == "llama3"


def test_deterministic(tmp_path: Path) -> None:
    a = make_tiny_model("mistral", tmp_path / "a", seed=3, context_length=128)
    b = make_tiny_model("mistral", tmp_path / "b", seed=3, context_length=128)
    c = make_tiny_model("mistral", tmp_path / "c", seed=4, context_length=128)
    weights_a = load_file(a / "model.safetensors")
    weights_b = load_file(b / "model.safetensors")
    weights_c = load_file(c / "model.safetensors")
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert not all(torch.equal(weights_a[k], weights_c[k]) for k in weights_a)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert json.loads((a / "config.json").read_text())["max_position_embeddings"] == 128


def test_command_line(tmp_path: Path) -> None:
    out = tmp_path / "m"
    result = subprocess.run(
        [sys.executable, "-m", "srt.testing.make_tiny_model", "--arch", "qwen3", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["max_position_embeddings"] == 2048
    bad = subprocess.run(
        [sys.executable, "-m", "srt.testing.make_tiny_model", "--arch", "gpt2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0
    assert "--arch" in bad.stderr


def test_the_command_line_writes_the_model_as_a_k_quant_gguf_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "k"
    argv = ["--arch", "qwen3", "--preset", "tiny-k", "--out", str(out), "--gguf", "Q4_K_M"]
    assert main(argv) == 0
    gguf = out / "tiny.Q4_K_M.gguf"
    assert capsys.readouterr().out.split() == [str(out), str(gguf)]
    types = {t.name: t.tensor_type.name for t in read_tensors(gguf)}
    assert types["blk.0.attn_v.weight"] == types["blk.1.attn_q.weight"] == "Q4_K"
    # The output layer, here the tied embedding, and the second layer's attn_v and ffn_down.
    assert types["token_embd.weight"] == types["blk.1.attn_v.weight"] == "Q6_K"
    assert types["blk.1.ffn_down.weight"] == "Q6_K"
    assert types["blk.0.attn_q_norm.weight"] == types["output_norm.weight"] == "F32"
    assert "output.weight" not in types  # Qwen3's tied embeddings, as llama.cpp writes them
    write_tiny_gguf(out, tmp_path / "again.gguf", "Q4_K_M")
    assert (tmp_path / "again.gguf").read_bytes() == gguf.read_bytes()
    # Rows of 64 weights: llama.cpp's fallbacks for Q4_K_M (Q5_0, and Q8_0 for Q6_K); Q2_K's
    # (IQ4_NL) has no encoder here.
    main(["--arch", "qwen3", "--out", str(tmp_path / "t"), "--gguf", "Q4_K_M"])
    narrow = {t.name: t.tensor_type.name for t in read_tensors(tmp_path / "t" / "tiny.Q4_K_M.gguf")}
    assert narrow["blk.0.attn_q.weight"] == "Q5_0"
    assert narrow["token_embd.weight"] == "Q8_0"
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["--arch", "qwen3", "--out", str(tmp_path / "t2"), "--gguf", "Q2_K"])
    assert "weights are not whole super-blocks of 256" in capsys.readouterr().err


def test_the_command_line_writes_a_mixture_of_experts_as_llama_cpp_writes_qwen3moe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each layer's experts stacked per projection and typed as other matrices (the second
    layer's ffn_down_exps given more bits, as its ffn_down would be), the router float32, no
    dense MLP; a model with dense layers, which llama.cpp's qwen3moe does not have, refused."""
    out = tmp_path / "moe"
    argv = ["--arch", "qwen3_moe", "--preset", "tiny-sparse", "--out", str(out), "--gguf", "Q4_K_M"]
    assert main(argv) == 0
    tensors = {t.name: t for t in read_tensors(out / "tiny.Q4_K_M.gguf")}
    # GGUF's order: columns (the hidden size), rows (the experts' width), experts.
    assert tensors["blk.0.ffn_up_exps.weight"].shape == (64, 64, 8)
    # Rows of 64 weights: Q4_K_M's fallbacks (Q5_0, and Q8_0 for Q6_K).
    assert tensors["blk.0.ffn_up_exps.weight"].tensor_type.name == "Q5_0"
    assert tensors["blk.0.ffn_down_exps.weight"].tensor_type.name == "Q5_0"
    assert tensors["blk.1.ffn_down_exps.weight"].tensor_type.name == "Q8_0"
    assert tensors["blk.1.ffn_gate_inp.weight"].tensor_type.name == "F32"
    assert tensors["blk.1.ffn_gate_inp.weight"].shape == (64, 8)
    assert not [name for name in tensors if name.endswith(("ffn_gate.weight", "ffn_up.weight"))]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["--arch", "qwen3_moe", "--out", str(tmp_path / "dense"), "--gguf", "Q4_K_M"])
    assert "llama.cpp's qwen3moe has no dense layers" in capsys.readouterr().err
