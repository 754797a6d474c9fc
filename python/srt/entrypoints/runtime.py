"""What an entrance serves from: the stage processes, the TokenizerManager, and their life
(docs/design.md §1). The HTTP server and the gRPC server each put their listener in front of
one `Runtime`; everything between listening and exiting is the same for both:

    start the stages → TokenizerManager → warm-up → READY
        → stop (SIGTERM): STOPPING, drain or abort, stop the stages → exit 0
        → a stage dies: DEAD, stop the others → exit 1

The phase lives in the entrance's `ServerContext`, which its routes read (503 or UNAVAILABLE
unless READY).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from srt.entrypoints.http.context import Phase, ServerContext
from srt.entrypoints.launcher import ChildDied, Launcher
from srt.ipc.channel import Receiver, Sender
from srt.managers.generate_req_input import GenerateReqInput
from srt.managers.tokenizer_manager import TokenizerManager
from srt.startup import Stages, log_process_start

logger = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05
ABORT_DRAIN_S = 5.0
WARMUP_PROMPT = "The capital of France is"


class Runtime:
    """One server's stages and TokenizerManager, behind the entrance that owns `context`."""

    def __init__(self, context: ServerContext) -> None:
        self.args = context.server_args
        self.context = context
        self.launcher = Launcher(self.args)
        self.channels: tuple[Sender, Receiver] | None = None
        self.manager: TokenizerManager | None = None
        self.stage_death: asyncio.Future[Any] | None = None

    async def serve(self, stop: asyncio.Future[Any], address: str) -> int:
        """Starts, then serves until `stop` resolves (drains; returns 0) or a stage dies
        (returns 1). The entrance listens on `address` already."""
        starting = asyncio.ensure_future(self.start())
        await asyncio.wait([starting, stop], return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # a signal while loading: stop the stages under the start
            self.launcher.close()
            with contextlib.suppress(Exception):
                await starting
            return 0
        try:
            starting.result()
        except ChildDied as e:
            logger.error("%s; cannot start", e)
            return 1
        except Exception:
            logger.exception("the server could not start")
            return 1
        assert self.stage_death is not None
        self.context.phase = Phase.READY
        log_process_start("ready, since srt-serve started")
        logger.info("serving %s on %s", self.context.model_name, address)
        await asyncio.wait([self.stage_death, stop], return_when=asyncio.FIRST_COMPLETED)
        if self.stage_death.done():
            why = self.stage_death.result().why()
            self.context.set_unavailable(Phase.DEAD, f"the server stopped: {why}")
            logger.error("%s; shutting down", why)
            return 1
        await self.drain()
        return 0

    async def start(self) -> None:
        """Starts the stages and the TokenizerManager, then runs a warm-up generation."""
        stages = Stages()
        self.channels = await asyncio.to_thread(self.launcher.start)
        stages.done("stages started")
        self.stage_death = asyncio.ensure_future(self.launcher.watch())
        self.manager = await asyncio.to_thread(TokenizerManager, self.args, *self.channels)
        self.manager.start(stage_exit=self.stage_exit())
        self.context.manager = self.manager
        stages.done("tokenizer manager")
        if not self.args.skip_server_warmup:
            await self.warm_up(self.manager)
            stages.done("warm-up generation")

    async def stage_exit(self) -> str:
        assert self.stage_death is not None
        child = await asyncio.shield(self.stage_death)
        return str(child.why())

    async def warm_up(self, manager: TokenizerManager) -> None:
        """One short greedy generation, then a cache flush so that no client sees its prefix."""
        warmup = GenerateReqInput(
            text=WARMUP_PROMPT, sampling_params={"max_new_tokens": 4, "temperature": 0.0}
        )
        async for _ in manager.generate_request(warmup):
            pass
        await manager.flush_cache()

    async def drain(self) -> None:
        """Stop: refuse new requests, let running ones finish within the grace period, then
        abort the rest and give their callers a moment to answer."""
        self.context.set_unavailable(Phase.STOPPING, "the server is shutting down")
        manager = self.manager
        assert manager is not None
        grace = self.args.graceful_shutdown_timeout
        logger.info("shutting down: %d requests in flight", manager.num_in_flight)
        if not await _wait_until_idle(manager, grace):
            logger.info("aborting %d requests still running", manager.num_in_flight)
            await manager.abort_all()
            await _wait_until_idle(manager, ABORT_DRAIN_S)

    async def close(self) -> None:
        """Stops the TokenizerManager and the stages (the entrance stopped listening first)."""
        if self.manager is not None:
            await self.manager.close()
        if self.channels is not None:
            self.launcher.stop(self.channels[0])
            for channel in self.channels:
                channel.close()
        self.launcher.close()
        if self.stage_death is not None:
            self.stage_death.cancel()


async def _wait_until_idle(manager: TokenizerManager, timeout: float) -> bool:
    """Whether every request finished within `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while manager.num_in_flight and loop.time() < deadline:
        await asyncio.sleep(DRAIN_POLL_S)
    return manager.num_in_flight == 0
