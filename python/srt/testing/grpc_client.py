"""A blocking client of `srt-serve --grpc-mode`'s scheduler service, for tests and benches.

    with SchedulerClient("127.0.0.1:30000") as client:
        client.call("HealthCheck", client.pb.HealthCheckRequest())

Calls are made by RPC name on a plain channel, with the messages of the same generated module
the server uses (`srt.entrypoints.grpc.proto`); `Generate` returns its stream's messages.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import grpc

from srt.entrypoints.grpc import proto
from srt.entrypoints.grpc.service import SERVICE


class SchedulerClient:
    """A channel to one server's `SglangScheduler` service at `address` (`host:port`)."""

    def __init__(self, address: str) -> None:
        self.pb = proto.load()
        self.channel = grpc.insecure_channel(address)
        self.methods = {m.name: m for m in self.pb.DESCRIPTOR.services_by_name[SERVICE].methods}
        self.prefix = f"/{self.pb.DESCRIPTOR.services_by_name[SERVICE].full_name}/"

    def call(self, name: str, request: Any, timeout: float = 30.0) -> Any:
        """The response of unary RPC `name`; `grpc.RpcError` on a status other than OK."""
        response_type = getattr(self.pb, self.methods[name].output_type.name)
        stub = self.channel.unary_unary(
            self.prefix + name,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        return stub(request, timeout=timeout)

    def generate(self, request: Any, timeout: float = 60.0) -> Any:
        """A `Generate` call: an iterator of its messages as they come, whose
        `trailing_metadata()` is there once they are all read."""
        stub = self.channel.unary_stream(
            self.prefix + "Generate",
            request_serializer=self.pb.GenerateRequest.SerializeToString,
            response_deserializer=self.pb.GenerateResponse.FromString,
        )
        return stub(request, timeout=timeout)

    def healthy(self) -> bool:
        """Whether the server says it is healthy (False while it starts, or when nothing
        answers)."""
        try:
            return bool(self.call("HealthCheck", self.pb.HealthCheckRequest(), timeout=5).healthy)
        except grpc.RpcError:
            return False

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> SchedulerClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
