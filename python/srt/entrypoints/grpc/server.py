"""`srt-serve --grpc-mode`: the gRPC server in the main process, in the HTTP server's place, in
front of the same `Runtime` (docs/scale-out.md, "The gRPC entrance").

    listen (UNAVAILABLE) → start the stages → TokenizerManager → warm-up → ready (healthy)
        → SIGTERM: stop admitting (UNAVAILABLE), drain or abort, stop the stages → exit 0
        → a stage dies: UNAVAILABLE, stop the others → exit 1

Where it sits: the scheduler is unchanged, on the same ring "scheduler"; no detokenizer runs,
since a gRPC client (sglang-router) gets token ids and detokenizes them itself, so the
TokenizerManager reads the scheduler's ring "detokenizer" directly (`Launcher`). The server
listens before the model loads, like the HTTP server, and its health check says UNAVAILABLE
until the warm-up generation ran. With `--enable-metrics`, Prometheus text is served over HTTP
at `/metrics` on `--metrics-port` (the same handler as the HTTP server's).
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import grpc
from aiohttp import web

from srt.entrypoints.grpc import proto
from srt.entrypoints.grpc.auth import ApiKeyInterceptor
from srt.entrypoints.grpc.service import SchedulerService, service_handler
from srt.entrypoints.http import ops_api
from srt.entrypoints.http.context import CONTEXT, ServerContext
from srt.entrypoints.http.middleware import error_middleware
from srt.entrypoints.runtime import ABORT_DRAIN_S, Runtime
from srt.server_args import ServerArgs

MAX_SEND_BYTES = 256 << 20
"""The largest message sent: a long output with its top logprobs. Messages received are bounded
by `--max-request-bytes`, as HTTP bodies are."""


class GrpcServer:
    """One gRPC server: SGLang's scheduler service in front of a `Runtime`."""

    def __init__(self, args: ServerArgs, pb: Any) -> None:
        self.args = args
        assert args.served_model_name is not None  # ServerArgs defaults it once there is a model
        self.context = ServerContext(args, args.served_model_name)
        self.runtime = Runtime(self.context)
        self.server = grpc.aio.server(
            interceptors=[ApiKeyInterceptor(args.api_key)] if args.api_key is not None else [],
            options=[
                ("grpc.max_send_message_length", MAX_SEND_BYTES),
                ("grpc.max_receive_message_length", args.max_request_bytes),
            ],
        )
        self.server.add_generic_rpc_handlers((service_handler(SchedulerService(self.context, pb)),))
        self.metrics: web.AppRunner | None = None

    async def run(self, stop: asyncio.Future[Any]) -> int:
        """Serves until `stop` resolves (returns 0) or a stage dies (returns 1)."""
        address = f"{self.args.host}:{self.args.port}"
        try:
            self.server.add_insecure_port(address)
            await self.server.start()
            await self.start_metrics()
        except (OSError, RuntimeError) as e:
            print(f"srt-serve: cannot listen on {address}: {e}")
            await self.server.stop(None)
            return 1
        try:
            return await self.runtime.serve(stop, f"grpc://{address}")
        finally:
            # Calls still answering after the drain get a moment, then the stages stop.
            await self.server.stop(ABORT_DRAIN_S)
            if self.metrics is not None:
                await self.metrics.cleanup()
            await self.runtime.close()

    async def start_metrics(self) -> None:
        """With `--enable-metrics`, `/metrics` over HTTP on `--metrics-port`."""
        if not self.args.enable_metrics:
            return
        app = web.Application(middlewares=[error_middleware])
        app[CONTEXT] = self.context
        app.router.add_get("/metrics", ops_api.metrics)
        self.metrics = web.AppRunner(app, access_log=None)
        await self.metrics.setup()
        await web.TCPSite(self.metrics, self.args.host, self.args.metrics_port).start()


async def serve(args: ServerArgs) -> int:
    """Runs a gRPC server until SIGINT/SIGTERM (exit status 0) or a stage's death (1)."""
    try:
        pb = await asyncio.to_thread(proto.load)
    except proto.GrpcUnavailable as e:
        print(f"srt-serve: {e}")
        return 1
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[Any] = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _resolve, stop)
    return await GrpcServer(args, pb).run(stop)


def _resolve(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_result(None)
