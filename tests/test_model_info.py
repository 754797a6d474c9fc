"""The torch-free readers of a model (`srt.model_info`, `hf_tokenizer.Tokenizer`,
`srt.chat_template`) against transformers, which the scheduler process and earlier srt used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from srt.chat_template import ChatTemplate, ChatTemplateError
from srt.managers.hf_tokenizer import Tokenizer
from srt.model_executor.model_config import ModelConfig
from srt.model_info import ModelInfo

TEXTS = ["hello", " two  spaces", "émoji 😀 and 中文", "<s>hi</s>", "<|im_start|>user\nx", ""]
CHATS = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "again"},
    ],
]


def test_model_facts_match_the_model_config(tiny_model: Path) -> None:
    ours = ModelInfo.read(str(tiny_model), context_length=100)
    theirs = ModelConfig.load(str(tiny_model), "auto", torch.device("cpu"), context_length=100)
    assert (ours.context_length, ours.vocab_size) == (100, theirs.vocab_size)
    assert ours.eos_token_ids == theirs.eos_token_ids
    default = ModelInfo.read(str(tiny_model))
    assert (
        default.context_length
        == ModelConfig.load(str(tiny_model), "auto", torch.device("cpu")).context_length
    )
    with pytest.raises(ValueError, match="exceeds the model's"):
        ModelInfo.read(str(tiny_model), context_length=default.context_length + 1)


def test_a_sliding_window_bounds_the_context(tmp_path: Path) -> None:
    config = {"max_position_embeddings": 4096, "sliding_window": 1024, "vocab_size": 8}
    (tmp_path / "config.json").write_text(json.dumps({**config, "eos_token_id": [1, 2]}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 3}))
    info = ModelInfo.read(str(tmp_path))
    assert (info.context_length, info.eos_token_ids) == (1024, frozenset({1, 2, 3}))


def test_the_tokenizer_encodes_decodes_and_renders_chats_as_transformers(tiny_model: Path) -> None:
    ours = Tokenizer(tiny_model)
    hf = AutoTokenizer.from_pretrained(tiny_model)
    for special in (True, False):
        assert (
            ours.encode_batch(TEXTS, special) == hf(TEXTS, add_special_tokens=special)["input_ids"]
        )
    ids = list(range(len(hf)))
    for skip in (True, False):
        assert ours.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip)
    assert len(ours) == len(hf)
    for chat in CHATS:
        for prompt in (True, False):
            expected = hf.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=False)
            assert ours.apply_chat_template(chat, prompt) == expected


def test_a_template_can_refuse_and_cannot_escape_its_sandbox() -> None:
    refusing = ChatTemplate("{{ raise_exception('no system role') }}", {})
    with pytest.raises(ChatTemplateError, match="no system role"):
        refusing.render([{"role": "system", "content": "x"}])
    escaping = ChatTemplate("{{ messages.__class__.__mro__ }}", {})
    with pytest.raises(ChatTemplateError):
        escaping.render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}", {})


def test_template_variables_as_transformers_passes_them() -> None:
    source = (
        "{{ bos_token }}{% for m in messages %}{% generation %}{{ m['content'] | tojson }}"
        "{% endgeneration %}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    )
    template = ChatTemplate(source, {"bos_token": "<s>"})
    assert template.render([{"role": "user", "content": "<é>"}]) == '<s>"<é>">'
    assert template.render([{"role": "user", "content": "a"}], add_generation_prompt=False) == (
        '<s>"a"'
    )
