"""The server under soak: starting and stopping one, finding its three processes (by the names
the stages give themselves), their RSS, and the scheduler's load, which carries the KV
integrity check's count of violations.

The scheduler runs its integrity check (`check_and_count`) every time it runs out of work, before
it takes the next message; `wait_idle` therefore asks for the load until two answers in a row
find it idle: the second was handled after a check of the idle state.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from srt.testing.server_process import ServerProcess, spawn_server

START_TIMEOUT_S = 900.0
"""SmolLM2's first start converts its GGUF file, which takes minutes on a small machine."""
STOP_TIMEOUT_S = 90.0
"""Past srt's 30 s graceful-shutdown window and the stages' own grace."""
IDLE_POLL_S = 0.2
STAGES = {"srt-scheduler": "scheduler", "srt-detokenizer": "detokenizer"}
"""Process name (`comm`, set by each stage) → the role reported."""
ROLES = ("main", *STAGES.values())


def start_server(
    model: str | None, api_key: str | None, extra_args: list[str], log_dir: Path
) -> ServerProcess:
    """Starts `srt-serve` (SmolLM2 when `model` is None, as srt-serve itself does) on a free
    port and waits until `/health` answers 200; RuntimeError if it stops or never gets there."""
    flags = [*(["--api-key", api_key] if api_key else []), *extra_args]
    server = spawn_server(model, *flags, log_dir=log_dir)
    try:
        server.wait_healthy(START_TIMEOUT_S)
    except TimeoutError as e:
        stop_server(server, [])
        raise RuntimeError(str(e)) from None
    return server


def stop_server(server: ServerProcess, stages: list[psutil.Process]) -> dict[str, Any]:
    """SIGTERM, then waits for the server and its `stages` to exit; whatever outlives the
    wait is killed, and listed in `left_running`."""
    server.process.terminate()
    try:
        code: int | None = server.process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        code = None
    survivors = [p for p in stages if _alive(p)]
    left = ([server.process.pid] if code is None else []) + [p.pid for p in survivors]
    if code is None:
        server.process.kill()
        server.process.wait()
    for process in survivors:
        process.kill()
    psutil.wait_procs(survivors, timeout=10)
    return {"exit_code": code, "left_running": left}


def _alive(process: psutil.Process) -> bool:
    """Running, and still the same process (psutil compares creation times); not a zombie."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def listener_pid(port: int) -> int | None:
    """The process listening on TCP `port` on this machine, if it can be seen."""
    try:
        connections = psutil.net_connections("tcp")
    except psutil.AccessDenied:  # some systems show other users' sockets only to root
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            return conn.pid
    return None


def server_processes(main_pid: int) -> dict[str, psutil.Process]:
    """The server's processes by role: main, scheduler, detokenizer. ValueError if any is
    missing."""
    try:
        main = psutil.Process(main_pid)
        found = {"main": main}
        for child in main.children(recursive=True):
            role = STAGES.get(child.name())
            if role is not None:
                found[role] = child
    except psutil.Error as e:
        raise ValueError(f"cannot inspect the server's processes (pid {main_pid}): {e}") from e
    missing = [role for role in ROLES if role not in found]
    if missing:
        raise ValueError(f"pid {main_pid} has no {' or '.join(missing)} process: not srt-serve?")
    return found


def rss_bytes(processes: dict[str, psutil.Process]) -> dict[str, int | None]:
    """Each process's resident set size (None for one that is gone)."""
    out: dict[str, int | None] = {}
    for role, process in processes.items():
        try:
            out[role] = process.memory_info().rss if _alive(process) else None
        except psutil.NoSuchProcess:
            out[role] = None
    return out


def same_processes(processes: dict[str, psutil.Process]) -> dict[str, bool]:
    """Whether each process is still the one found at the start (not restarted, not gone)."""
    return {role: _alive(process) for role, process in processes.items()}


async def get_load(session: aiohttp.ClientSession, base_url: str) -> dict[str, int]:
    """The scheduler's load from `/get_server_info`: running and waiting requests, used and
    total KV slots, integrity violations."""
    async with session.get(f"{base_url}/get_server_info") as response:
        if response.status != 200:
            raise ValueError(f"GET /get_server_info answered {response.status}")
        info = await response.json()
    return {k: int(v) for k, v in info["load"].items()}


async def wait_idle(
    session: aiohttp.ClientSession, base_url: str, timeout_s: float
) -> dict[str, int] | None:
    """The load once the scheduler is idle and has checked its KV bookkeeping (see the module's
    note); None if it is not idle within `timeout_s` or stops answering."""
    deadline = time.monotonic() + timeout_s
    idle_before = False
    while time.monotonic() < deadline:
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.1)):
                load = await get_load(session, base_url)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None
        idle = load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0
        if idle and idle_before:
            return load
        idle_before = idle
        await asyncio.sleep(IDLE_POLL_S)
    return None
