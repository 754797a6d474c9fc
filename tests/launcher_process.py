"""A launcher without the HTTP server, as a command for test_launcher's exit cases:

    python tests/launcher_process.py SRT-SERVE-FLAGS

Starts the stages, prints `srt: ready (scheduler pid N, detokenizer pid M)`, then runs until
SIGINT/SIGTERM (the stages take SIGTERM; exit 0) or until a stage dies (exit 1, naming it).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence
from typing import Any

import uvloop

from srt.entrypoints.launcher import ChildDied, Launcher
from srt.server_args import ServerArgs
from srt.server_cli import parse_args


def _set_once(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


async def serve(server_args: ServerArgs) -> int:
    """Starts the stages, then runs until SIGINT/SIGTERM (returns 0) or until a stage dies
    (returns 1). Signal handlers are installed before anything starts, so a signal during
    start-up is handled once the stages are up."""
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[Any] = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _set_once, stop, sig)
    launcher = Launcher(server_args)
    try:
        sender, receiver = launcher.start()
    except ChildDied as e:
        print(f"srt: {e}; cannot start", file=sys.stderr)
        return 1
    try:
        pids = ", ".join(f"{c.name} pid {c.process.pid}" for c in launcher.children)
        print(f"srt: ready ({pids})", flush=True)
        death: asyncio.Future[Any] = asyncio.ensure_future(launcher.watch())
        await asyncio.wait([death, stop], return_when=asyncio.FIRST_COMPLETED)
        if death.done():
            print(f"srt: {death.result().why()}; shutting down", file=sys.stderr, flush=True)
            launcher.close()
            return 1
        death.cancel()
        launcher.close()  # stages take SIGTERM for either signal (they leave ^C to us)
        for child in launcher.children:
            if child.process.exitcode != 0:
                print(f"srt: {child.why()}", file=sys.stderr)
        return 0
    finally:
        launcher.close()
        del sender, receiver


def main(argv: Sequence[str] | None = None) -> int:
    return uvloop.run(serve(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
