"""The offline Engine end to end: real scheduler and detokenizer processes on a tiny model.

Generated ids are compared with transformers' greedy `generate` on the same weights.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

import srt
from srt.entrypoints.engine import Engine
from srt.io_struct import FlushCacheOut, GetLoadOut, HealthCheckOut
from srt.managers.incremental_detokenizer import IncrementalDetokenizer
from srt.managers.tokenizer_manager import EngineDeadError
from srt.server_args import ServerArgs


@functools.cache
def _reference_model(path: str) -> Any:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


@torch.inference_mode()
def reference_ids(model_dir: str, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The ids a greedy request with EOS ignored generates: transformers' `generate`."""
    out = _reference_model(model_dir).generate(
        torch.tensor([prompt_ids]),
        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
    )
    ids: list[int] = out[0, len(prompt_ids) :].tolist()
    return ids


# ------------------------------------------------------------------------------------------------

N = 12
GREEDY = {"max_new_tokens": N, "temperature": 0.0, "ignore_eos": True}
PROMPTS = [
    "def parse_args(argv): return the namespace of every option given on the command line",
    "class Fraction: numerator and denominator, always reduced to lowest terms by gcd",
    "import textwrap; textwrap.fill(text, width=70) wraps each paragraph of the input",
]


@pytest.fixture(scope="module")
def model_dir(tiny_model_factory: Callable[[str], Path]) -> Path:
    return tiny_model_factory("llama")  # adds a BOS token: special tokens are skipped in text


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[Engine]:
    # Float32: the outputs are compared with transformers' float32 greedy ids.
    with Engine(model_path=str(model_dir), context_length=512, dtype="float32") as engine:
        yield engine
        load = engine.get_load()
        assert (load.invariant_violations, load.num_used_tokens) == (0, 0)


def expected(hf: PreTrainedTokenizerBase, prompt: str, n: int = N) -> tuple[list[int], str]:
    ids = reference_ids(hf.name_or_path, hf(prompt)["input_ids"], n)
    text = hf.decode(ids, skip_special_tokens=True)
    assert isinstance(text, str)
    return ids, text


def one(result: object) -> dict[str, Any]:
    assert isinstance(result, dict), result
    return result


def many(result: object) -> list[dict[str, Any]]:
    assert isinstance(result, list), result
    return result


def rings_of(pid: int) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"srt-{pid}-"))


def wait_gone(pids: list[int], timeout: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if psutil.pid_exists(p) and _running(p)]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    return left


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ---- results -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_generate_returns_sglangs_shape(engine: Engine, hf: PreTrainedTokenizerBase) -> None:
    prompt = PROMPTS[0]
    ids, text = expected(hf, prompt)
    out = one(engine.generate(prompt, GREEDY))
    assert set(out) == {"text", "output_ids", "meta_info"}
    assert out["text"] == text
    assert out["output_ids"] == ids
    meta = out["meta_info"]
    assert set(meta) == {
        "id",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "finish_reason",
        "e2e_latency",
    }
    assert meta["prompt_tokens"] == len(hf(prompt)["input_ids"])
    assert meta["completion_tokens"] == N
    assert meta["finish_reason"] == {"type": "length", "length": N}
    assert meta["e2e_latency"] > 0
    assert isinstance(meta["id"], str)


@pytest.mark.slow
def test_prompt_logprobs_come_in_meta_info(engine: Engine, hf: PreTrainedTokenizerBase) -> None:
    ids = hf(PROMPTS[1])["input_ids"]
    with torch.inference_mode():
        logits = _reference_model(hf.name_or_path)(torch.tensor([ids])).logits[0]
    reference = torch.log_softmax(logits.float(), dim=-1)
    wanted = [reference[j - 1, ids[j]].item() for j in range(1, len(ids))]
    out = one(
        engine.generate(
            input_ids=ids,
            sampling_params=GREEDY,
            return_logprob=True,
            top_logprobs_num=2,
            logprob_start_len=0,
        )
    )
    assert out["output_ids"] == expected(hf, PROMPTS[1])[0]
    tokens = out["meta_info"]["input_token_logprobs"]
    assert tokens[0] == (None, ids[0], None)
    assert [token for _, token, _ in tokens] == ids
    assert [logprob for logprob, _, _ in tokens[1:]] == pytest.approx(wanted, abs=1e-4)
    tops = out["meta_info"]["input_top_logprobs"]
    assert len(tops) == len(ids)
    assert tops[0] is None
    assert [token for _, token, _ in tops[-1]] == reference[-2].topk(2).indices.tolist()

    start = len(ids) - 2  # a stream has them once, in its first chunk
    chunks = list(
        engine.generate(
            input_ids=ids,
            sampling_params=GREEDY,
            return_logprob=True,
            logprob_start_len=start,
            stream=True,
        )
    )
    first = chunks[0]["meta_info"]
    assert "input_top_logprobs" not in first
    assert [token for _, token, _ in first["input_token_logprobs"]] == ids[start:]
    assert [lp for lp, _, _ in first["input_token_logprobs"]] == pytest.approx(
        wanted[start - 1 :], abs=1e-4
    )
    assert all(chunk["meta_info"]["input_token_logprobs"] == [] for chunk in chunks[1:])
    assert [t for chunk in chunks for t in chunk["output_ids"]] == out["output_ids"]


@pytest.mark.slow
def test_input_ids_give_the_same_result_as_their_text(
    engine: Engine, hf: PreTrainedTokenizerBase
) -> None:
    ids = hf(PROMPTS[1])["input_ids"]
    by_text = one(engine.generate(PROMPTS[1], GREEDY))
    by_ids = one(engine.generate(input_ids=ids, sampling_params=GREEDY))
    assert by_ids["output_ids"] == by_text["output_ids"]
    assert by_ids["text"] == by_text["text"]


@pytest.mark.slow
def test_a_batch_with_n_samples_comes_back_prompt_by_prompt(
    engine: Engine, hf: PreTrainedTokenizerBase
) -> None:
    params = {**GREEDY, "n": 2}
    out = many(engine.generate(PROMPTS[:2], params, rid=["first", "second"]))
    assert [r["meta_info"]["id"] for r in out] == ["first-0", "first-1", "second-0", "second-1"]
    for result, prompt in zip(out, [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[1]], strict=True):
        assert result["text"] == expected(hf, prompt)[1]
    samples = many(engine.generate(PROMPTS[2], params))
    assert len(samples) == 2
    assert [s["text"] for s in samples] == [expected(hf, PROMPTS[2])[1]] * 2
    per_prompt = many(engine.generate(PROMPTS, [GREEDY, {**GREEDY, "max_new_tokens": 3}, GREEDY]))
    assert [len(r["output_ids"]) for r in per_prompt] == [N, 3, N]


@pytest.mark.slow
def test_streamed_chunks_add_up_to_the_whole_result(
    engine: Engine, hf: PreTrainedTokenizerBase
) -> None:
    whole = one(engine.generate(PROMPTS[0], GREEDY))
    chunks = list(engine.generate(PROMPTS[0], GREEDY, stream=True))
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert [t for c in chunks for t in c["output_ids"]] == whole["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])

    async def stream_async() -> list[dict[str, Any]]:
        stream = await engine.async_generate(PROMPTS[0], GREEDY, stream=True)
        assert not isinstance(stream, dict | list)
        return [c async for c in stream]

    async_chunks = asyncio.run(stream_async())
    assert "".join(c["text"] for c in async_chunks) == whole["text"]


@pytest.mark.slow
def test_a_streamed_batch_tags_chunks_with_their_index(
    engine: Engine, hf: PreTrainedTokenizerBase
) -> None:
    texts: dict[int, str] = {}
    for chunk in engine.generate(PROMPTS, GREEDY, stream=True):
        texts[chunk["index"]] = texts.get(chunk["index"], "") + chunk["text"]
    assert texts == {i: expected(hf, p)[1] for i, p in enumerate(PROMPTS)}


@pytest.mark.slow
def test_stop_strings_end_the_text(engine: Engine, hf: PreTrainedTokenizerBase) -> None:
    prompt = PROMPTS[2]
    full = expected(hf, prompt)[1]
    stop = full[len(full) // 2 :].split()[1]  # a word from the second half
    params = {**GREEDY, "stop": [stop, "never appears"]}
    out = one(engine.generate(prompt, params))
    assert out["text"] == full[: full.index(stop)]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    kept = one(engine.generate(prompt, {**params, "no_stop_trim": True}))
    assert kept["text"] == full[: full.index(stop) + len(stop)]


@pytest.mark.slow
def test_a_stop_string_counts_only_once_min_new_tokens_are_out(
    engine: Engine, model_dir: Path, hf: PreTrainedTokenizerBase
) -> None:
    prompt = PROMPTS[1]
    # The text after each token, as the scheduler decodes it.
    ids = one(engine.generate(prompt, {**GREEDY, "max_new_tokens": 24}))["output_ids"]
    detok = IncrementalDetokenizer(model_dir)
    detok.add_request("x", prompt_ids=hf(prompt)["input_ids"])
    ends, text = [], ""
    for token in ids:
        text += detok.step("x", [token])
        ends.append(len(text))

    def completed_by(end: int) -> int:
        """How many tokens are out when the text reaches `end` characters."""
        return next(k for k, n in enumerate(ends, 1) if n >= end)

    # A character whose first occurrence completes before a later one does.
    stop, first, later = next(
        (c, i, j)
        for i, c in enumerate(text)
        if not c.isspace()
        for j in [text.find(c, i + 1)]
        if j > 0 and completed_by(j + 1) > completed_by(i + 1)
    )
    params = {**GREEDY, "max_new_tokens": 24, "stop": [stop]}
    params["min_new_tokens"] = completed_by(first + 1) + 1
    whole = one(engine.generate(prompt, params))
    streamed = list(engine.generate(prompt, params, stream=True))
    for got in (whole["text"], "".join(c["text"] for c in streamed)):
        assert got == text[:later]
    assert whole["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert streamed[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    kept = one(engine.generate(prompt, {**params, "no_stop_trim": True}))
    assert kept["text"] == text[: later + 1]


@pytest.mark.slow
def test_async_generate_serves_concurrent_callers(
    engine: Engine, hf: PreTrainedTokenizerBase
) -> None:
    async def main() -> list[Any]:
        calls = [engine.async_generate(PROMPTS[i % 3], GREEDY) for i in range(12)]
        return await asyncio.gather(*calls)

    results = asyncio.run(main())
    assert [one(r)["text"] for r in results] == [expected(hf, PROMPTS[i % 3])[1] for i in range(12)]


@pytest.mark.slow
def test_generate_serves_several_threads(engine: Engine, hf: PreTrainedTokenizerBase) -> None:
    results: dict[int, str] = {}

    def work(i: int) -> None:
        results[i] = one(engine.generate(PROMPTS[i % 3], GREEDY))["text"]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: expected(hf, PROMPTS[i % 3])[1] for i in range(6)}


# ---- errors and control ------------------------------------------------------------------------


@pytest.mark.slow
def test_bad_requests_raise_clear_errors(engine: Engine, hf: PreTrainedTokenizerBase) -> None:
    with pytest.raises(ValueError, match=r"max_new_tokens is 600: .* context length of 512"):
        engine.generate(PROMPTS[0], {"max_new_tokens": 600})
    with pytest.raises(ValueError, match=r"the prompt has \d+ tokens.* context length of 512"):
        engine.generate("word " * 600)
    with pytest.raises(ValueError, match="request id 'twice' is already in flight"):
        engine.generate(PROMPTS[:2], GREEDY, rid=["twice", "twice"])
    with pytest.raises(ValueError, match=r"logprob_start_len \(3\) must be below the prompt"):
        engine.generate(input_ids=[1, 2, 3], return_logprob=True, logprob_start_len=3)
    with pytest.raises(ValueError, match="unknown sampling parameter 'temprature'"):
        engine.generate(PROMPTS[0], {"temprature": 0})

    async def bad_async() -> object:
        return await engine.async_generate(input_ids=[])

    with pytest.raises(ValueError, match="the prompt is empty"):
        asyncio.run(bad_async())
    assert one(engine.generate(PROMPTS[0], GREEDY))["text"] == expected(hf, PROMPTS[0])[1]


@pytest.mark.slow
def test_a_cancelled_caller_frees_its_request_id(engine: Engine) -> None:
    async def cancel_one() -> None:
        task = asyncio.ensure_future(engine.async_generate(PROMPTS[0], GREEDY, rid="gone"))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_one())
    deadline = time.monotonic() + 10
    while True:  # the id is free once the scheduler's final message for it has passed
        try:
            out = one(engine.generate(PROMPTS[0], GREEDY, rid="gone"))
            break
        except ValueError:
            assert time.monotonic() < deadline, "the cancelled request's id was never freed"
            time.sleep(0.05)
    assert out["meta_info"]["id"] == "gone"
    assert not engine.abort_request("gone")  # finished: nothing to abort


@pytest.mark.slow
def test_abort_request_ends_a_running_stream(engine: Engine) -> None:
    stream = engine.generate(PROMPTS[0], {**GREEDY, "max_new_tokens": 400}, stream=True, rid="ab")
    first = next(stream)
    assert first["meta_info"]["finish_reason"] is None
    assert engine.abort_request("ab")
    chunks = [first, *stream]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert len([t for c in chunks for t in c["output_ids"]]) < 400


@pytest.mark.slow
def test_control_requests_are_answered(engine: Engine) -> None:
    assert isinstance(engine.flush_cache(), FlushCacheOut)
    load = engine.get_load()
    assert isinstance(load, GetLoadOut)
    assert load.num_running_reqs == 0
    health = engine.health_check()
    assert isinstance(health, HealthCheckOut)
    assert health.healthy


# ---- life cycle --------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_context_manager_shuts_everything_down(model_dir: Path) -> None:
    shm_before = set(os.listdir("/dev/shm"))
    threads_before = set(threading.enumerate())
    with srt.Engine(model_path=str(model_dir)) as engine:
        children = [c.process.pid for c in engine.launcher.children]
        assert all(pid is not None for pid in children)
        one(engine.generate(PROMPTS[0], GREEDY))
    assert wait_gone([p for p in children if p is not None]) == []
    assert rings_of(os.getpid()) == []
    assert set(os.listdir("/dev/shm")) <= shm_before | {
        n for n in os.listdir("/dev/shm") if not n.startswith(f"srt-{os.getpid()}-")
    }
    engine.shutdown()  # idempotent
    with pytest.raises(EngineDeadError, match="shut down"):
        engine.generate(PROMPTS[0])
    assert set(threading.enumerate()) <= threads_before


@pytest.mark.slow
def test_a_dead_stage_fails_calls_instead_of_hanging(model_dir: Path) -> None:
    engine = Engine(model_path=str(model_dir))
    try:
        children = {c.name: c.process.pid for c in engine.launcher.children}
        pid = children["scheduler"]
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

        def generate_until_noticed() -> None:
            for _ in range(1000):
                engine.generate(PROMPTS[0], GREEDY)
                time.sleep(0.01)

        with pytest.raises(EngineDeadError, match=r"scheduler process .* SIGKILL"):
            generate_until_noticed()

        async def later() -> object:
            return await engine.async_generate(PROMPTS[0], GREEDY)

        with pytest.raises(EngineDeadError, match="scheduler process"):
            asyncio.run(later())
    finally:
        engine.shutdown()
    assert wait_gone([p for p in children.values() if p is not None]) == []
    assert rings_of(os.getpid()) == []


def test_an_engine_needs_a_model() -> None:
    with pytest.raises(ValueError, match="model_path"):
        Engine()
    with pytest.raises(TypeError, match="not both"):
        Engine(ServerArgs(model_path="x"), model_path="y")
