"""Messages larger than a ring, through a real server (issue 13): the channel splits a message
longer than a ring's frame into parts and reassembles it, in all three directions, so no stage
dies of the size of what it sends.

The server runs with 4 KiB rings (`SRT_RING_CAPACITY`), so that the issue's requests, scaled to
the tiny model, are many times a ring in each direction: prompt logprobs (scheduler →
detokenizer → main; the issue's 1,100 tokens with 1,024 top logprobs made an 18 MB frame for a
16 MiB ring, here 900 tokens with 20 make ~60 ring sizes from a request that fits one frame), a
prompt of 2,000 ids (main → scheduler), and a stop list that the scheduler sends on with every
output. Each answer is checked against transformers, and the three processes must be the ones
that started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
import torch
from transformers import AutoModelForCausalLM

from srt.testing.server_process import ServerProcess, running_server

pytestmark = pytest.mark.slow

RING_CAPACITY = 4096
VOCAB = 1024  # the tiny tokenizer's


@pytest.fixture(scope="module")
def model(tiny_model_factory: Any) -> Path:
    path: Path = tiny_model_factory("llama")
    return path


@pytest.fixture(scope="module")
def server(model: Path) -> Iterator[ServerProcess]:
    with contextlib.ExitStack() as stack:
        with pytest.MonkeyPatch.context() as env:  # for the server's start only
            env.setenv("SRT_RING_CAPACITY", str(RING_CAPACITY))
            # The stop list below is past the default --max-stop-sequences.
            # Float32: outputs are compared with transformers' float32 model.
            server = stack.enter_context(
                running_server(model, "--max-stop-sequences", "1000", "--dtype", "float32")
            )
        yield server


@pytest.fixture(scope="module")
def stage_pids(server: ServerProcess) -> list[int]:
    """The main process's pid, then its stages' (the scheduler and detokenizer processes)."""
    children = psutil.Process(server.process.pid).children()
    stages = [c.pid for c in children if "spawn_main" in " ".join(c.cmdline())]
    assert len(stages) == 2, [c.cmdline() for c in children]
    return [server.process.pid, *stages]


@pytest.fixture(scope="module")
def reference(model: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()


def generate(server: ServerProcess, body: dict[str, Any]) -> tuple[int, Any]:
    async def go() -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(server.url + "/generate", json=body) as response,
        ):
            return response.status, json.loads(await response.text())

    return asyncio.run(go())


def assert_unharmed(server: ServerProcess, stage_pids: list[int]) -> None:
    """The server answers `/health` and runs on the processes it started with."""
    assert server.health_status() == 200, server.output()
    assert server.process.poll() is None
    for pid in stage_pids:
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


@torch.inference_mode()
def prompt_logprobs(reference: Any, ids: list[int]) -> torch.Tensor:
    """log p(next token) at every prompt position, by transformers."""
    logits = reference(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


@torch.inference_mode()
def greedy_ids(reference: Any, ids: list[int], n: int) -> list[int]:
    out = reference.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
    )
    generated: list[int] = out[0, len(ids) :].tolist()
    return generated


def test_prompt_logprobs_many_times_a_ring_come_back_whole(
    server: ServerProcess, stage_pids: list[int], reference: Any
) -> None:
    # 900 ids (packed int32s): the request fits in one frame, its output does not.
    ids = [10 + (7 * i) % (VOCAB - 10) for i in range(900)]
    top = 20
    status, out = generate(
        server,
        {
            "input_ids": ids,
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": top,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        },
    )
    assert status == 200, out
    assert len(json.dumps(out)) > 50 * RING_CAPACITY
    expected = prompt_logprobs(reference, ids)
    meta = out["meta_info"]
    tokens = meta["input_token_logprobs"]
    assert [token for _, token, _ in tokens] == ids
    wanted = [expected[j - 1, ids[j]].item() for j in range(1, len(ids))]
    assert [logprob for logprob, _, _ in tokens[1:]] == pytest.approx(wanted, abs=1e-3)
    tops = meta["input_top_logprobs"]
    assert len(tops) == len(ids)
    assert tops[0] is None
    for j in range(1, len(ids)):
        best = expected[j - 1].topk(top).values.tolist()
        assert [logprob for logprob, _, _ in tops[j]] == pytest.approx(best, abs=1e-3)
    assert out["output_ids"] == [int(expected[-1].argmax())]
    assert_unharmed(server, stage_pids)


def test_a_prompt_many_times_a_ring_reaches_the_scheduler_whole(
    server: ServerProcess, stage_pids: list[int], reference: Any
) -> None:
    ids = [10 + (13 * i) % (VOCAB - 10) for i in range(2000)]
    sampling = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}
    status, out = generate(server, {"input_ids": ids, "sampling_params": sampling})
    assert status == 200, out
    assert out["meta_info"]["prompt_tokens"] == len(ids)
    assert out["output_ids"] == greedy_ids(reference, ids, 4)
    assert_unharmed(server, stage_pids)


def test_a_stop_list_many_times_a_ring_goes_through_every_stage(
    server: ServerProcess, stage_pids: list[int], reference: Any
) -> None:
    ids = [10 + (11 * i) % (VOCAB - 10) for i in range(50)]
    stop = [f"never seen {i:05d}" for i in range(1000)]  # ~17 KB
    sampling = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True, "stop": stop}
    status, out = generate(server, {"input_ids": ids, "sampling_params": sampling})
    assert status == 200, out
    assert out["output_ids"] == greedy_ids(reference, ids, 8)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    assert_unharmed(server, stage_pids)
