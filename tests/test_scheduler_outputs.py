"""The scheduler's outputs on a real model (continuous batching, cache reuse, retraction,
chunking, stop strings): each request's output over the real `ModelRunner` on a tiny model must
equal that request run alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from scheduler_helpers import (
    generate,
    real_scheduler,
    shared_prefix_prompts,
)

from srt.constrained.xgrammar_backend import GrammarBackend
from srt.io_struct import FinishReason
from srt.model_executor.sampling_info import RequestSampling
from srt.model_executor.worker_batch import (
    RequestSamplingSpec,
)

# ---- outputs on a real model ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llama(tiny_model_factory: Any) -> Path:
    path: Path = tiny_model_factory("llama")
    return path


@pytest.fixture(scope="module")
def alone_outputs(tiny_llama: Path) -> list[list[int]]:
    scheduler = real_scheduler(tiny_llama, disable_radix_cache=True)
    return [generate(scheduler, [prompt])["r0"].output_ids for prompt in shared_prefix_prompts(16)]


@pytest.mark.slow
def test_concurrent_requests_match_each_alone_and_reuse_the_cache(
    tiny_llama: Path, alone_outputs: list[list[int]]
) -> None:
    scheduler = real_scheduler(tiny_llama, max_prefill_tokens=64)
    finished = generate(scheduler, shared_prefix_prompts(16))
    assert [finished[f"r{i}"].output_ids for i in range(16)] == alone_outputs
    assert sum(f.cached_tokens for f in finished.values()) > 0
    again = generate(scheduler, shared_prefix_prompts(16)[:4])
    assert all(f.cached_tokens > 0 for f in again.values())


@pytest.mark.slow
def test_small_kv_pool_forces_retraction_and_chunks_keep_outputs(
    tiny_llama: Path, alone_outputs: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[RequestSamplingSpec] = []
    build = RequestSampling.of

    def counted(spec: RequestSamplingSpec, grammars: GrammarBackend | None) -> RequestSampling:
        built.append(spec)
        return build(spec, grammars)

    monkeypatch.setattr(RequestSampling, "of", staticmethod(counted))
    scheduler = real_scheduler(tiny_llama, max_total_tokens=160, chunked_prefill_size=16)
    finished = generate(scheduler, shared_prefix_prompts(16))
    assert scheduler.num_retracted > 0
    assert [finished[f"r{i}"].output_ids for i in range(16)] == alone_outputs
    # Each request's sampling state is built once, at its first admission: not per step, not
    # again when a retracted request is admitted again (run_to_completion saw it dropped).
    assert len(built) == 16


@pytest.mark.slow
def test_stop_strings_end_generation(tiny_llama: Path, alone_outputs: list[list[int]]) -> None:
    from srt.managers.incremental_detokenizer import IncrementalDetokenizer

    prompt = shared_prefix_prompts(1)[0]
    detok = IncrementalDetokenizer(tiny_llama)
    detok.add_request("x")
    text = "".join(detok.step("x", [token]) for token in alone_outputs[0])
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    scheduler = real_scheduler(tiny_llama)
    finished = generate(scheduler, [prompt], stop=(stop,))["r0"]
    offset = text.index(stop)
    assert finished.reason == FinishReason("stop", matched_str=stop, matched_offset=offset)
    assert len(finished.output_ids) < len(alone_outputs[0])
    assert finished.output_ids == alone_outputs[0][: len(finished.output_ids)]
    # The token that completes the stop string is also the last allowed one: the stop wins.
    last = generate(scheduler, [prompt], stop=(stop,), max_new_tokens=len(finished.output_ids))
    assert last["r0"].reason == finished.reason
