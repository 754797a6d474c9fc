"""Prompt logprobs (`logprob_start_len`) from the scheduler, against transformers' log-softmax
over the whole prompt, with a cached prefix and with chunked prefill."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from scheduler_helpers import (
    ScriptedRunner,
    generate,
    real_scheduler,
    request,
    run_to_completion,
    scheduler_over,
    shared_prefix_prompts,
)

from srt.managers.scheduler import Scheduler


@pytest.fixture(scope="module")
def tiny_llama(tiny_model_factory: Any) -> Path:
    path: Path = tiny_model_factory("llama")
    return path


def hf_prompt_logprobs(model: Path, prompt: list[int]) -> torch.Tensor:
    """[len(prompt), vocab] log-softmax of transformers' logits over the whole prompt."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    with torch.no_grad():
        logits = hf(torch.tensor([prompt])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def prompt_logprobs_of(scheduler: Scheduler, rid: str) -> tuple[list[Any], list[Any]]:
    outs = []
    while scheduler.has_work():
        out = scheduler.step()
        assert scheduler.check_invariants() == []
        if out is not None and rid in out.rids:
            outs.append(out)
    i = outs[0].rids.index(rid)
    assert all(not out.input_token_logprobs[out.rids.index(rid)] for out in outs[1:])
    return list(outs[0].input_token_logprobs[i]), list(outs[0].input_top_logprobs[i])


@pytest.mark.slow
@pytest.mark.parametrize("chunked_prefill_size", [-1, 7])
def test_prompt_logprobs_match_transformers_with_a_cached_prefix_and_chunks(
    tiny_llama: Path, chunked_prefill_size: int
) -> None:
    prompt = shared_prefix_prompts(1)[0]
    expected = hf_prompt_logprobs(tiny_llama, prompt)
    alone = real_scheduler(tiny_llama, disable_radix_cache=True)
    alone_output = generate(alone, [prompt])["r0"].output_ids
    scheduler = real_scheduler(tiny_llama, chunked_prefill_size=chunked_prefill_size)
    assert generate(scheduler, [prompt])["r0"].output_ids == alone_output  # now cached
    for start in (0, 5, len(prompt) - 1):
        rid = f"start{start}"
        scheduler.add_request(
            request(
                rid,
                prompt,
                max_new_tokens=1,
                return_logprob=True,
                top_logprobs_num=3,
                logprob_start_len=start,
            )
        )
        logprobs, tops = prompt_logprobs_of(scheduler, rid)
        positions = range(start, len(prompt))
        assert len(logprobs) == len(tops) == len(positions)
        for j, (logprob, top) in enumerate(zip(logprobs, tops, strict=True), start=start):
            if j == 0:
                assert (logprob, top) == (None, ())
                continue
            assert logprob == pytest.approx(expected[j - 1, prompt[j]].item(), abs=1e-4)
            values, ids = expected[j - 1].topk(3)
            assert [t for t, _ in top] == ids.tolist()
            assert [lp for _, lp in top] == pytest.approx(values.tolist(), abs=1e-4)
    again = generate(scheduler, [prompt], return_logprob=True, logprob_start_len=3)
    assert again["r0"].output_ids == alone_output
    assert again["r0"].cached_tokens == 2  # the cache may serve positions 0 and 1 only


def test_logprob_start_len_must_fall_inside_the_prompt() -> None:
    scheduler = scheduler_over(ScriptedRunner())
    scheduler.add_request(request("r", [5, 6], return_logprob=True, logprob_start_len=2))
    reason = run_to_completion(scheduler)["r"].reason
    assert reason.message == "logprob_start_len (2) must be below the prompt length (2 tokens)"
    assert reason.status_code == 400
