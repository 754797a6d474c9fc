"""Serving with `--tp-size 2` on the CPU (gloo): two scheduler processes, rank 0 broadcasting
what it receives. Greedy outputs are TP=1's (up to near ties: the all-reduce sums in another
order), and the scheduler behaves as with one rank: the radix cache serves shared prefixes,
prompts are chunked, requests retract when the KV cache runs short and abort cleanly, and every
rank ends with no slot in use (`SRT_CHECK_INVARIANTS=1`: each rank checks after every step). A
rank that dies, even mid-collective, takes the server down like any stage: exit 1, no process
or ring left behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
from test_engine_scheduling import shared_prefix_prompts
from test_launcher import rings_of, wait_gone

from srt.entrypoints.engine import Engine
from srt.testing.server_process import ServerProcess, free_port, running_server, spawn_server

GREEDY = {"temperature": 0.0, "ignore_eos": True}
PROMPTS = [[3 + (7 * i + 11 * j) % 400 for j in range(5 + 3 * i)] for i in range(6)]
SHARED = [[40 + j for j in range(24)] + [100 + i] for i in range(4)]
NEAR_TIE = 1e-3  # top-2 logprob gap under which TP=1's greedy choice may flip at TP=2
SCHEDULING = {
    "max_total_tokens": 160,
    "chunked_prefill_size": 16,
    "schedule_policy": "lpm",
    "dtype": "float32",
}


@pytest.fixture(scope="module")
def model(tiny_model_factory: Callable[[str], Path]) -> Path:
    return tiny_model_factory("llama")


@pytest.fixture(scope="module")
def reference(model: Path) -> list[dict[str, Any]]:
    """TP=1's greedy results of PROMPTS, with each step's top-2 logprobs."""
    params = {**GREEDY, "max_new_tokens": 12}
    with Engine(model_path=str(model), dtype="float32") as engine:
        results = engine.generate(
            input_ids=PROMPTS, sampling_params=params, return_logprob=True, top_logprobs_num=2
        )
    assert isinstance(results, list)
    return results


def assert_same_up_to_near_ties(ours: list[int], reference: dict[str, Any]) -> None:
    """`ours` is the reference's output, or leaves it where the reference's top two tokens
    were within NEAR_TIE of each other."""
    theirs = reference["output_ids"]
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:
            tops = reference["meta_info"]["output_top_logprobs"][step]
            assert abs(tops[0][0] - tops[1][0]) < NEAR_TIE, (step, ours, theirs)
            return


def post(server: ServerProcess, route: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        server.url + route, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def tp_server(model: Path) -> Iterator[ServerProcess]:
    with running_server(model, "--tp-size", "2", "--dtype", "float32") as server:
        yield server


def test_srt_serve_tp2_gives_tp1_greedy_outputs(
    tp_server: ServerProcess, reference: list[dict[str, Any]]
) -> None:
    params = {**GREEDY, "max_new_tokens": 12}
    results = post(tp_server, "/generate", {"input_ids": PROMPTS, "sampling_params": params})
    for result, expected in zip(results, reference, strict=True):
        assert_same_up_to_near_ties(result["output_ids"], expected)


def test_srt_serve_tp2_reuses_cached_prefixes(tp_server: ServerProcess) -> None:
    params = {**GREEDY, "max_new_tokens": 2}
    post(tp_server, "/generate", {"input_ids": SHARED[0], "sampling_params": params})
    again = post(tp_server, "/generate", {"input_ids": SHARED[1], "sampling_params": params})
    assert again["meta_info"]["cached_tokens"] >= 24


def test_idle_ranks_use_no_cpu(tp_server: ServerProcess) -> None:
    """Rank 0 sleeps on its ring, the others in rank 0's broadcast: neither spins."""
    procs = psutil.Process(tp_server.process.pid).children()
    # Settle first: on a busy 2-core machine a rank can still be finishing the previous test's
    # request half a second after its answer (seen once: 50-70 ms of CPU in the window).
    time.sleep(1.5)
    before = [sum(p.cpu_times()[:2]) for p in procs]
    time.sleep(2)
    used = [sum(p.cpu_times()[:2]) - b for p, b in zip(procs, before, strict=True)]
    assert max(used) < 0.02 * 2, f"idle stages used {used} s of CPU in 2 s"


def test_srt_serve_tp2_stops_cleanly(model: Path, tmp_path: Path) -> None:
    """SIGTERM: both ranks and the detokenizer exit 0, and so does srt-serve."""
    server = spawn_server(model, "--tp-size", "2", log_dir=tmp_path)
    try:
        server.wait_healthy()
    finally:
        assert server.stop() == 0, server.output_tail()
    assert "process" not in server.output().split("shutting down")[-1], server.output_tail()


@pytest.fixture
def engines(model: Path) -> Iterator[Callable[..., Engine]]:
    started: list[Engine] = []

    def start(**server_args: Any) -> Engine:
        started.append(Engine(model_path=str(model), **server_args))
        return started[-1]

    yield start
    for engine in started:
        load = engine.get_load()
        assert load.invariant_violations == 0
        assert (load.num_used_tokens, load.num_running_reqs, load.num_waiting_reqs) == (0, 0, 0)
        engine.shutdown()


@pytest.mark.slow
def test_chunks_retractions_aborts_and_grammars_as_with_one_rank(
    engines: Callable[..., Engine],
) -> None:
    """A KV cache of 160 tokens and 16-token chunks (test_engine_scheduling's pressure): 16
    requests of 41- to 55-token prompts and 48 new tokens each retract; the outputs are TP=1's
    under the same pressure, an abort mid-decode frees everything on both ranks, and a
    constrained request waits for its grammar on both."""
    prompts = shared_prefix_prompts(16)
    params = {**GREEDY, "max_new_tokens": 48}
    one = engines(**SCHEDULING)
    expected = one.generate(input_ids=prompts, sampling_params=params)
    two = engines(tp_size=2, **SCHEDULING)
    results = two.generate(input_ids=prompts, sampling_params=params)
    assert isinstance(results, list)
    assert isinstance(expected, list)
    assert [r["output_ids"] for r in results] == [r["output_ids"] for r in expected]
    assert two.get_load().num_retracted_reqs > 0

    async def abort_mid_decode() -> Any:
        stream = await two.async_generate(
            input_ids=prompts[0],
            sampling_params={**GREEDY, "max_new_tokens": 100},
            rid="long",
            stream=True,
        )
        assert isinstance(stream, AsyncIterator)
        chunks = [await anext(stream), await anext(stream)]
        assert chunks[-1]["meta_info"]["finish_reason"] is None  # still decoding
        assert two.abort_request("long")
        chunks += [chunk async for chunk in stream]
        return chunks[-1]

    last = asyncio.run(abort_mid_decode())
    assert last["meta_info"]["finish_reason"]["type"] == "abort"

    # A grammar compiles on every rank before its request is admitted on any.
    constrained = {"temperature": 0.0, "regex": "[0-9]{3}-[a-c]{2}", "max_new_tokens": 16}
    result = two.generate(input_ids=prompts[0], sampling_params=constrained)
    assert isinstance(result, dict)
    assert re.fullmatch("[0-9]{3}-[a-c]{2}", result["text"]), result["text"]


@pytest.mark.slow
def test_a_rank_dying_mid_generation_takes_the_server_down_cleanly(
    model: Path, tmp_path: Path
) -> None:
    """SIGKILL of rank 1's scheduler while rank 0 waits in a decode step's all-reduce: the
    request gets a 503, srt-serve names the rank and exits 1, and no stage process or ring is
    left behind."""
    server = spawn_server(model, "--tp-size", "2", log_dir=tmp_path)
    stages: dict[str, int] = {}
    try:
        server.wait_healthy()
        stages = {c.name(): c.pid for c in psutil.Process(server.process.pid).children()}
        assert {"srt-scheduler", "srt-scheduler-t", "srt-detokenizer"} <= set(stages)
        body = {"input_ids": PROMPTS[0], "sampling_params": {**GREEDY, "max_new_tokens": 2000}}
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(try_post, server, body)
            wait_for_decoding(server)
            os.kill(stages["srt-scheduler-t"], signal.SIGKILL)
            assert server.process.wait(60) == 1
            assert answer.result(60) == 503
    finally:
        server.stop()
    assert "scheduler-tp1 process" in server.output(), server.output_tail()
    assert "SIGKILL" in server.output(), server.output_tail()
    assert wait_gone(list(stages.values())) == []
    assert rings_of(server.process.pid) == []


def try_post(server: ServerProcess, body: dict[str, Any]) -> int:
    """The status of a /generate request (an error's too)."""
    try:
        post(server, "/generate", body)
        return 200
    except urllib.error.HTTPError as e:
        return e.code


def wait_for_decoding(server: ServerProcess, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while "Decode batch" not in server.output():
        assert time.monotonic() < deadline, server.output_tail()
        time.sleep(0.1)


@pytest.mark.slow
def test_two_nodes_on_loopback(
    model: Path, tmp_path: Path, reference: list[dict[str, Any]]
) -> None:
    """`--nnodes 2`: node 0 serves HTTP with rank 0, node 1 runs rank 1 only; the outputs are
    TP=1's, and node 1 exits 0 when node 0 shuts down."""
    addr = f"127.0.0.1:{free_port()}"
    flags = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", addr, "--dtype", "float32"]
    node1 = spawn_server(model, *flags, "--node-rank", "1", log_dir=tmp_path)
    try:
        with running_server(model, *flags, "--node-rank", "0") as node0:
            params = {**GREEDY, "max_new_tokens": 12}
            results = post(node0, "/generate", {"input_ids": PROMPTS, "sampling_params": params})
            for result, expected in zip(results, reference, strict=True):
                assert_same_up_to_near_ties(result["output_ids"], expected)
        assert node1.process.wait(60) == 0, node1.output_tail()
    finally:
        if node1.process.poll() is None:
            node1.process.send_signal(signal.SIGTERM)
            node1.process.wait(30)
