"""Our models against Hugging Face transformers on the same weights (CPU, fp32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from runner_helpers import SlotBook, greedy_generate, make_runner, take_rows
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "The quick brown fox jumps over the lazy dog",
    "def main():\n    return 0",
    "Hi",
]


def max_relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max() / reference.abs().max())


def hf_last_logits(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float()


def test_logits_match_transformers(tiny_model: Path) -> None:
    """Prefill of several prompts, a prompt that reuses another's cached prefix, then decode
    steps through the paged KV cache: every logit row matches transformers' full forward."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    runner = make_runner(tiny_model)
    book = SlotBook(runner)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    rows = take_rows(runner, len(prompts) + 1)

    # 1. Prefill all prompts in one extend batch.
    batch = runner.prepare_extend(
        rows[:3], [0, 0, 0], prompts, book.take(sum(len(p) for p in prompts))
    )
    logits = runner.forward(batch)
    for i, ids in enumerate(prompts):
        assert max_relative_error(logits[i], hf_last_logits(hf, ids)) < 1e-4

    # 2. A new sequence sharing prompt 0's first tokens reuses their KV slots, not recomputing.
    shared = len(prompts[0]) - 3
    extended = prompts[0][:shared] + tokenizer.encode(" cat sat", add_special_tokens=False)
    cached_slots = runner.req_to_token_pool.req_to_token[rows[0], :shared].clone()
    runner.req_to_token_pool.write(rows[3], 0, cached_slots)
    batch = runner.prepare_extend(
        [rows[3]], [shared], [extended[shared:]], book.take(len(extended) - shared)
    )
    assert batch.input_ids.numel() == len(extended) - shared
    logits = runner.forward(batch)
    assert max_relative_error(logits[0], hf_last_logits(hf, extended)) < 1e-4

    # 3. Decode steps for all four sequences together.
    sequences = [*prompts, extended]
    for _ in range(4):
        next_ids = [int(hf_last_logits(hf, seq).argmax()) for seq in sequences]
        sequences = [[*seq, t] for seq, t in zip(sequences, next_ids, strict=True)]
        batch = runner.prepare_decode(
            rows, [len(s) for s in sequences], next_ids, book.take(len(rows))
        )
        logits = runner.forward(batch)
        for i, seq in enumerate(sequences):
            assert max_relative_error(logits[i], hf_last_logits(hf, seq)) < 1e-4


def hf_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return [int(t) for t in out[0, len(ids) :]]


def test_greedy_generation_matches_transformers(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    runner = make_runner(tiny_model)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    eos = set(runner.model_config.eos_token_ids)
    ours = greedy_generate(runner, prompts, 32, banned=eos)
    for ids, generated in zip(prompts, ours, strict=True):
        assert generated == hf_greedy(hf, ids, 32)


def test_batch_invariance(tiny_model_factory: object) -> None:
    path = tiny_model_factory("qwen3")  # type: ignore[operator]
    tokenizer = AutoTokenizer.from_pretrained(path)
    runner = make_runner(path)
    texts = [("word " * (3 * i + 1)) + str(i) for i in range(8)]
    prompts = [tokenizer.encode(t) for t in texts]
    together = greedy_generate(runner, prompts, 12, banned=set())
    for i, ids in enumerate(prompts):
        assert greedy_generate(runner, [ids], 12, banned=set())[0] == together[i]


@pytest.mark.slow
def test_smollm2_greedy_matches_transformers(smollm2: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    hf = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    runner = make_runner(smollm2)
    questions = ["What is the capital of France?", "Write a haiku about rust.", "2 + 2 ="]
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for q in questions
    ]
    eos = set(runner.model_config.eos_token_ids)
    ours = greedy_generate(runner, prompts, 32, banned=eos)
    for ids, generated in zip(prompts, ours, strict=True):
        assert generated == hf_greedy(hf, ids, 32)
