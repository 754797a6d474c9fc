"""What every stage process (scheduler, detokenizer) does around its own work.

A stage is started by the launcher with the `spawn` method. It:

- dies with its parent: `PR_SET_PDEATHSIG` delivers SIGTERM when the launcher dies, and the
  stage also watches the launcher's pidfd, so a `kill -9` of the launcher stops it promptly;
- leaves SIGINT to the launcher (a terminal's ^C reaches the whole group) and stops on SIGTERM;
- reports on its ready pipe either `ready` or, if it fails, the exception that killed it, so the
  launcher can say which stage died and why;
- unlinks the server's ring names on its way out, in case it outlives the launcher before every
  ring was attached;
- logs with its own name as the prefix of every line (`srt.logs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Coroutine
from multiprocessing.connection import Connection
from typing import Any

from srt.ipc.rings import RingNames
from srt.logs import configure_logging
from srt.startup import Stages, log_process_start

READY = b"ready"
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


class Stage:
    """One stage's work: `event_loop` runs until a `ShutdownReq` (returns) or a failure (raises)."""

    async def event_loop(self) -> None:
        raise NotImplementedError


def name_process(name: str) -> None:
    """Names this process for `ps`, `top` and psutil (`comm`, at most 15 bytes)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def die_with_parent(parent_pid: int) -> None:
    """Asks the kernel to SIGTERM this process when its parent dies; exits if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        raise SystemExit(f"the launcher (pid {parent_pid}) is already gone")


def run_stage(
    name: str,
    rings: RingNames,
    parent_pid: int,
    ready: Connection,
    build: Callable[[], Stage],
    log_level: str,
) -> None:
    """The body of a stage process `name`: build the stage, report ready, serve, clean up."""
    configure_logging(name, log_level)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_quietly)  # until the event loop takes over
    code = 0
    name_process(f"srt-{name}")
    try:
        die_with_parent(parent_pid)
        log_process_start()
        stages = Stages()
        stage = build()
        stages.done(f"{name} built")
        _run(_serve(stage, parent_pid, ready))
    except BaseException as e:
        if not (isinstance(e, SystemExit) and e.code in (None, 0)):
            code = 1
            report = "".join(traceback.format_exception_only(e)).strip()
            with contextlib.suppress(OSError):  # the launcher may be gone: nobody to tell
                ready.send_bytes(report.encode() + b"\n" + traceback.format_exc().encode())
    finally:
        rings.unlink()
    # Straight out: a normal interpreter exit garbage-collects every module torch and
    # transformers loaded, which takes seconds, past the launcher's grace period.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run(main: Coroutine[Any, Any, None]) -> None:
    import uvloop

    uvloop.run(main)


def _exit_quietly(signum: int, frame: object) -> None:
    raise SystemExit(0)


async def _serve(stage: Stage, parent_pid: int, ready: Connection) -> None:
    """Runs the stage until it returns, fails, gets SIGTERM, or the launcher dies."""
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[Any] = loop.create_future()

    def stop_with(reason: str) -> None:
        if not stop.done():
            stop.set_result(reason)

    loop.add_signal_handler(signal.SIGTERM, stop_with, "SIGTERM")
    parent = os.pidfd_open(parent_pid)
    loop.add_reader(parent, stop_with, "the launcher exited")
    if os.getppid() != parent_pid:  # died between the pdeathsig check and the pidfd
        stop_with("the launcher exited")
    ready.send_bytes(READY)  # only now: a SIGTERM from here on stops the stage cleanly
    work: asyncio.Future[Any] = asyncio.ensure_future(stage.event_loop())
    try:
        await asyncio.wait([work, stop], return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            work.result()
        elif stop.result() == "the launcher exited":
            raise SystemExit(stop.result())
    finally:
        work.cancel()
        loop.remove_reader(parent)
        os.close(parent)
