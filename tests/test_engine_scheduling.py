"""Continuous batching through the offline Engine (real scheduler and detokenizer processes).

Every request's greedy output must not depend on what else runs: 64 concurrent requests with
shared prefixes, a KV pool so small that the scheduler retracts, and chunked prefill all give the
outputs of each request run alone. The schedulers check their KV invariant after every step
(`SRT_CHECK_INVARIANTS=1`, set by conftest); each engine must end with no violation and no slot
in use.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from srt.entrypoints.engine import Engine

GREEDY = {"temperature": 0.0, "ignore_eos": True}
# Outputs alone and in batches are compared bit for bit: srt's float32 CPU kernels compute each
# row alone; bf16 products (oneDNN's) need not.
DTYPE = "float32"


def shared_prefix_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Prompts of 4 groups, each group sharing a 40-token system prompt."""
    rng = random.Random(seed)
    systems = [[rng.randrange(3, 500) for _ in range(40)] for _ in range(4)]
    return [
        systems[i % 4] + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 16))]
        for i in range(n)
    ]


PROMPTS = shared_prefix_prompts(64)
PARAMS: list[Mapping[str, Any]] = [{**GREEDY, "max_new_tokens": 4 + i % 13} for i in range(64)]
LONG: list[Mapping[str, Any]] = [{**GREEDY, "max_new_tokens": 48}] * 16  # for the first 16 prompts


def assert_clean(engine: Engine) -> None:
    load = engine.get_load()
    assert load.invariant_violations == 0
    assert load.num_used_tokens == 0
    assert (load.num_running_reqs, load.num_waiting_reqs) == (0, 0)


def generate_all(engine: Engine, prompts: list[list[int]], params: list[Mapping[str, Any]]) -> Any:
    results = engine.generate(input_ids=prompts, sampling_params=params)
    assert isinstance(results, list)
    return results


@pytest.fixture(scope="module")
def model(tiny_model_factory: Callable[[str], Path]) -> str:
    return str(tiny_model_factory("llama"))


@pytest.fixture(scope="module")
def alone(model: str) -> list[list[int]]:
    """Each request's output when it runs alone (one request at a time, no cache): PROMPTS with
    PARAMS, then the first 16 PROMPTS with LONG."""
    with Engine(
        model_path=model, max_running_requests=1, disable_radix_cache=True, dtype=DTYPE
    ) as engine:
        results = generate_all(engine, PROMPTS + PROMPTS[:16], PARAMS + LONG)
        assert_clean(engine)
    return [r["output_ids"] for r in results]


@pytest.fixture
def engine_of(model: str) -> Iterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def start(**server_args: Any) -> Engine:
        engines.append(Engine(model_path=model, dtype=DTYPE, **server_args))
        return engines[-1]

    yield start
    for engine in engines:
        assert_clean(engine)
        engine.shutdown()


@pytest.mark.slow
def test_concurrent_requests_match_each_alone_and_reuse_prefixes(
    engine_of: Callable[..., Engine], alone: list[list[int]]
) -> None:
    engine = engine_of(max_prefill_tokens=256)
    results = generate_all(engine, PROMPTS, PARAMS)
    assert [r["output_ids"] for r in results] == alone[:64]
    assert [r["meta_info"]["completion_tokens"] for r in results] == [
        p["max_new_tokens"] for p in PARAMS
    ]
    cached = [r["meta_info"]["cached_tokens"] for r in results]
    assert sum(c >= 40 for c in cached) >= 56  # all but the first of each group, roughly
    again = generate_all(engine, PROMPTS[:8], PARAMS[:8])
    assert all(r["meta_info"]["cached_tokens"] > 0 for r in again)


@pytest.mark.slow
def test_a_small_kv_pool_retracts_and_chunks_without_changing_outputs(
    engine_of: Callable[..., Engine], alone: list[list[int]]
) -> None:
    engine = engine_of(max_total_tokens=160, chunked_prefill_size=16, schedule_policy="lpm")
    results = generate_all(engine, PROMPTS[:16], LONG)
    assert [r["output_ids"] for r in results] == alone[64:]
    assert engine.get_load().num_retracted_reqs > 0


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fcfs", "lpm", "dfs-weight", "lof", "random"])
def test_every_policy_gives_the_same_outputs(
    engine_of: Callable[..., Engine], alone: list[list[int]], policy: str
) -> None:
    engine = engine_of(schedule_policy=policy, max_prefill_tokens=128, random_seed=1)
    results = generate_all(engine, PROMPTS[:16], PARAMS[:16])
    assert [r["output_ids"] for r in results] == alone[:16]


@pytest.mark.slow
def test_aborts_while_waiting_and_mid_decode_free_everything(
    engine_of: Callable[..., Engine],
) -> None:
    engine = engine_of(max_running_requests=1)
    long = {**GREEDY, "max_new_tokens": 1000}  # still decoding when the aborts arrive
    short = {**GREEDY, "max_new_tokens": 8}

    async def scenario() -> tuple[list[Any], Any, Any]:
        stream = await engine.async_generate(
            input_ids=PROMPTS[0], sampling_params=long, rid="r0", stream=True
        )
        assert isinstance(stream, AsyncIterator)
        waiting = [
            asyncio.ensure_future(
                engine.async_generate(input_ids=PROMPTS[i], sampling_params=short, rid=f"r{i}")
            )
            for i in (1, 2)
        ]
        chunks = [await anext(stream), await anext(stream)]
        assert chunks[-1]["meta_info"]["finish_reason"] is None  # r0 decodes; r1, r2 wait
        assert engine.abort_request("r2")
        assert engine.abort_request("r0")
        chunks += [chunk async for chunk in stream]
        r1, r2 = await asyncio.gather(*waiting)
        return chunks, r1, r2

    r0_chunks, r1, r2 = asyncio.run(scenario())
    assert r0_chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert 2 <= len([t for chunk in r0_chunks for t in chunk["output_ids"]]) < 1000
    assert r2["meta_info"]["finish_reason"]["type"] == "abort"
    assert r2["output_ids"] == []
    assert r1["meta_info"]["finish_reason"] == {"type": "length", "length": 8}


@pytest.mark.slow
def test_a_full_queue_refuses_with_429_and_the_others_finish(
    engine_of: Callable[..., Engine], alone: list[list[int]]
) -> None:
    engine = engine_of(max_running_requests=1, max_queued_requests=1)
    long = {**GREEDY, "max_new_tokens": 300}  # still decoding while r1 and r2 arrive

    async def scenario() -> tuple[list[Any], Any]:
        stream = await engine.async_generate(
            input_ids=PROMPTS[0], sampling_params=long, rid="r0", stream=True
        )
        assert isinstance(stream, AsyncIterator)
        chunks = [await anext(stream)]
        # r0 runs: r1 takes the one place in the queue and r2 finds it full.
        queued = asyncio.ensure_future(
            engine.async_generate(
                input_ids=PROMPTS[1:3], sampling_params=PARAMS[1:3], rid=["r1", "r2"]
            )
        )
        chunks += [chunk async for chunk in stream]
        return chunks, await queued

    chunks, (r1, r2) = asyncio.run(scenario())
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 300}
    assert r1["output_ids"] == alone[1]
    assert r2["output_ids"] == []
    assert r2["meta_info"]["finish_reason"] == {
        "type": "abort",
        "message": "too many requests: the waiting queue is full (--max-queued-requests 1)",
        "status_code": 429,
    }
