"""A server's life through real HTTP: 503 until warmed up, SIGTERM drains or aborts and exits 0
leaving nothing behind, a dead stage makes it exit 1."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from srt.testing.server_process import ServerProcess, spawn_server

pytestmark = pytest.mark.slow

LONG = {"max_new_tokens": None, "ignore_eos": True}
"""Runs for as long as the context allows: long enough to still run at shutdown."""


def shm_segments(pid: int) -> list[str]:
    """The shared-memory ring names of the server with main process `pid`."""
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"srt-{pid}-")]


def live(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `processes` still running (not exited, nor zombies) after a short grace."""
    _, alive = psutil.wait_procs(processes, timeout=5)
    return [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


async def stream_until_done(
    server: ServerProcess, body: dict[str, Any], started: asyncio.Event
) -> list[Any]:
    """The events of a streamed `/generate`; `started` is set at its first event."""
    events: list[Any] = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.url + "/generate", json={**body, "stream": True}) as response,
    ):
        async for line in response.content:
            if line.startswith(b"data: "):
                payload = line[len(b"data: ") :].strip()
                events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
                started.set()
    return events


async def status_of(server: ServerProcess, path: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(server.url + path) as response:
        return response.status


def run_sigterm_during_requests(
    server: ServerProcess, samplings: list[dict[str, Any]]
) -> tuple[list[list[Any]], int, int]:
    """Starts one streamed request per sampling, sends SIGTERM once all run; returns their
    events, the status `/health` answered during shutdown, and the server's exit status."""

    async def go() -> tuple[list[list[Any]], int]:
        starts = [asyncio.Event() for _ in samplings]
        requests = [
            asyncio.ensure_future(
                stream_until_done(
                    server, {"text": "Once upon a time", "sampling_params": sampling}, started
                )
            )
            for sampling, started in zip(samplings, starts, strict=True)
        ]
        for started in starts:
            await started.wait()
        server.process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        health = await status_of(server, "/health")
        return list(await asyncio.gather(*requests)), health

    events, health = asyncio.run(go())
    return events, health, server.process.wait(60)


def test_503_until_warm_then_sigterm_drains_within_the_grace_period_and_exits_0(
    tiny_model_factory: Callable[[str], Path], tmp_path: Path
) -> None:
    model = tiny_model_factory("llama")
    # A grace period far shorter than the long request (thousands of tokens), far longer than
    # the short one (8 tokens): whatever the machine, one finishes in it and one cannot.
    server = spawn_server(model, "--graceful-shutdown-timeout", "0.5", log_dir=tmp_path)
    try:
        statuses = set()
        while (status := server.health_status()) != 200:
            assert server.process.poll() is None, server.output()
            if status is not None:
                statuses.add(status)
        assert statuses == {503}
        children = psutil.Process(server.process.pid).children(recursive=True)
        assert len(children) >= 2
        assert shm_segments(server.process.pid) == []  # unlinked once both ends attached
        short = {"max_new_tokens": 8, "ignore_eos": True}
        (finished, cut), health, code = run_sigterm_during_requests(server, [short, LONG])
    finally:
        server.stop()
    assert health == 503
    assert code == 0, server.output()
    assert finished[-1] == cut[-1] == "[DONE]"
    # The short request finishes within the grace period; the long one is aborted after it.
    assert finished[-2]["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    assert cut[-2]["meta_info"]["finish_reason"]["type"] == "abort"
    assert live(children) == []
    assert shm_segments(server.process.pid) == []


def test_a_dead_stage_fails_requests_and_the_server_exits_1(
    tiny_model_factory: Callable[[str], Path], tmp_path: Path
) -> None:
    server = spawn_server(tiny_model_factory("llama"), log_dir=tmp_path)
    try:
        server.wait_healthy()
        scheduler = next(
            child
            for child in psutil.Process(server.process.pid).children()
            if child.name() == "srt-scheduler"
        )

        async def go() -> list[Any]:
            started = asyncio.Event()
            body = {"text": "Once upon a time", "sampling_params": LONG}
            request = asyncio.ensure_future(stream_until_done(server, body, started))
            await started.wait()
            scheduler.kill()
            return await request

        events = asyncio.run(go())
        code = server.process.wait(60)
    finally:
        server.stop()
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == 503
    assert "scheduler" in events[-2]["error"]["message"]
    assert code == 1
    assert "scheduler" in server.output()
    assert shm_segments(server.process.pid) == []
