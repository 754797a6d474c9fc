"""A machine of a multi-node server other than node 0 (`--nnodes`, `--node-rank` > 0): it runs
only its tensor-parallel ranks' scheduler processes, no HTTP server and no detokenizer; rank 0,
on node 0, hands them every request (`managers/tp_ranks.py`).

It ends when its ranks do: with exit status 0 when all of them stopped cleanly (node 0 shut
down and told them so), 1 when one failed (a rank that dies fails its peers' collectives, on
every node); and on SIGINT or SIGTERM, stopping its ranks (which fails node 0's in turn).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from srt.entrypoints.launcher import GRACE_S, ChildDied, Launcher
from srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


async def serve_ranks(args: ServerArgs) -> int:
    """Runs this node's ranks until they stop (0 if all stopped cleanly, else 1) or a signal
    (0)."""
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[Any] = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _resolve, stop)
    launcher = Launcher(args)
    try:
        starting = asyncio.ensure_future(asyncio.to_thread(launcher.spawn))
        await asyncio.wait([starting, stop], return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            return 0
        try:
            starting.result()
        except ChildDied as e:
            logger.error("%s; cannot start", e)
            return 1
        logger.info("node %d of %d: ranks ready, served by node 0", args.node_rank, args.nnodes)
        watch = asyncio.ensure_future(launcher.watch())
        await asyncio.wait([watch, stop], return_when=asyncio.FIRST_COMPLETED)
        if not watch.done():
            watch.cancel()
            return 0
        for child in launcher.children:
            await asyncio.to_thread(child.process.join, GRACE_S)
        failed = [c for c in launcher.children if c.process.exitcode != 0]
        for child in failed:
            logger.error("%s", child.why())
        return 1 if failed else 0
    finally:
        launcher.close()


def _resolve(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_result(None)
