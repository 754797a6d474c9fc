"""The whole forward pass in bf16 on the CPU (srt's bf16 kernels, oneDNN's bf16 products)
against float32, and SmolLM2's greedy output in bf16 against transformers' in bf16.

Tolerances: bf16 keeps 8 significant bits, and a tiny model's logits pass through a few layers
of bf16 activations, so the bf16 logits stay within 5% of the largest float32 logit and pick the
same top token wherever float32's top two logits are further apart than that. Greedy agreement
over 32 tokens is the issue's bar: at least 90% of the prompts identical (two greedy runs in
bf16 part ways after a near tie, and stay apart). It is not met yet (the xfail says by how much
and why); strict, so that meeting it fails the test until the mark goes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from runner_helpers import extend_and_decode_logits, greedy_generate, make_runner
from transformers import AutoModelForCausalLM, AutoTokenizer

RELATIVE_TOLERANCE = 0.05

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about rust.",
    "2 + 2 =",
    "Name three primary colors.",
    "How do I reverse a list in Python?",
    "What is photosynthesis?",
    "Translate 'good morning' into Spanish.",
    "Give me a tip for sleeping better.",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water in Celsius?",
    "Explain what a CPU cache is in one sentence.",
    "List the days of the week.",
]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_the_bf16_forward_stays_near_float32(arch: str, tiny_model_factory: Any) -> None:
    """Prefill, a cached prefix and decode steps, in bf16 and in float32, on the CPU."""
    path: Path = tiny_model_factory(arch)
    wide = extend_and_decode_logits(path, device="cpu", dtype="float32")
    narrow = extend_and_decode_logits(path, device="cpu", dtype="bfloat16")
    for step, (low, high) in enumerate(zip(narrow, wide, strict=True)):
        error = float((low.float() - high).abs().max() / high.abs().max())
        assert error <= RELATIVE_TOLERANCE, f"step {step}: {error:.4f}"
        top2 = high.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * RELATIVE_TOLERANCE * high.abs().max()
        assert torch.equal(low.argmax(-1)[clear], high.argmax(-1)[clear]), f"step {step}"


def hf_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
        )
    generated: list[int] = out[0, len(ids) :].tolist()
    return generated


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="6 of 12 prompts identical over 32 tokens (7 of 12 with PyTorch's bf16 norms): "
    "RMSNorm's float32 sum of squares, summed in another order than PyTorch's vectorized "
    "reduction, rounds a few bf16 values (27 of 1.3M in one prefill) the other way, which moves "
    "every logit by up to 0.44 and flips near-tied greedy choices",
)
def test_smollm2_greedy_in_bf16_agrees_with_transformers_in_bf16(smollm2: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    hf = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.bfloat16).eval()
    runner = make_runner(smollm2, dtype="bfloat16")
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for q in QUESTIONS
    ]
    eos = set(runner.model_config.eos_token_ids)
    ours = greedy_generate(runner, prompts, 32, banned=eos)
    theirs = [hf_greedy(hf, ids, 32) for ids in prompts]
    same = [a == b for a, b in zip(ours, theirs, strict=True)]
    # The agreement, reported (`pytest -s` shows it): prompts identical, and for the others
    # the first token where the two runs part.
    parted = [
        next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
        for a, b in zip(ours, theirs, strict=True)
        if a != b
    ]
    print(f"bf16 greedy, 32 tokens: {sum(same)}/{len(same)} prompts identical; parted at {parted}")
    assert sum(same) >= 0.9 * len(same), (sum(same), parted)
