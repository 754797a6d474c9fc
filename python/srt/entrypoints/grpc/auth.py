"""`--api-key` on the gRPC entrance: every RPC but `HealthCheck` needs the key, as metadata
`authorization: Bearer KEY` or `x-api-key: KEY` (the HTTP entrance's two headers), compared with
it in constant time; a call without it ends UNAUTHENTICATED before its handler runs.

sglang-router 0.3.2's gRPC client sends no key: replicas behind it run without `--api-key`, on
a network only the router reaches (docs/scale-out.md).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

OPEN_METHODS = ("HealthCheck",)
REFUSAL = "a valid API key is required (metadata authorization: Bearer KEY, or x-api-key: KEY)"


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Lets through the calls that carry the key (and every health check)."""

    def __init__(self, key: str) -> None:
        self.key = key.encode("utf-8")

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        handler = await continuation(details)
        method = details.method.rpartition("/")[2]
        if handler is None or method in OPEN_METHODS or self.allows(details.invocation_metadata):
            return handler
        make = (
            grpc.unary_stream_rpc_method_handler
            if handler.response_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        return make(
            _refuse,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def allows(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> bool:
        given: bytes | None = None
        for name, value in metadata or ():
            raw = value if isinstance(value, bytes) else value.encode("utf-8")
            if name == "x-api-key":
                given = raw
                break
            scheme, _, token = raw.partition(b" ")
            if name == "authorization" and scheme.lower() == b"bearer":
                given = token.strip()
        return given is not None and hmac.compare_digest(given, self.key)


async def _refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)
