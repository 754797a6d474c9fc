"""SGLang's `SglangScheduler` service on srt's TokenizerManager: one handler per RPC.

`Generate` sends a request's ids through the TokenizerManager as the HTTP entrance sends a
`/generate` body (`requests.py`: the same limits and refusals) and streams its ids back
(`responses.py`). A call whose client goes away (the router drops a stream when its own client
disconnects) is cancelled, and the cancellation aborts its requests in the scheduler, freeing
their KV slots: the TokenizerManager's `abandon`, as for an HTTP client. `Abort` aborts the
requests of a call still running, which then ends with their completions, finish reason
`abort` (as `/abort_request` ends an HTTP request).

Statuses: a refused request is INVALID_ARGUMENT with a message that starts with the field to
blame (`sampling_params.top_p: ...`); a full queue RESOURCE_EXHAUSTED; while the server starts
or stops, and when a stage died, UNAVAILABLE (which the router retries elsewhere). Health
answers UNAVAILABLE unless the server is ready, and then whether the scheduler's loop answers
a `HealthCheckReq` in time.

The handlers are registered by hand from the service's descriptor (`service_handler`), each
RPC's request and response messages taken from the generated module by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from srt import __version__
from srt.entrypoints.grpc.requests import generate_input, grpc_field
from srt.entrypoints.grpc.responses import ResponseBuilder, refusal
from srt.entrypoints.http.context import Phase, ServerContext
from srt.managers.generate_req_input import sample_rids
from srt.managers.hf_tokenizer import tokenizer_files
from srt.managers.tokenizer_manager import EngineDeadError, TokenizerManager
from srt.model_info import ModelInfo, local_files, read_json
from srt.request_limits import RequestError

SERVICE = "SglangScheduler"
HEALTH_TIMEOUT_S = 5.0
"""How long the scheduler's loop may take to answer a health check (it answers between two
forward passes)."""


class SchedulerService:
    """The RPC handlers of one server (`pb`: the generated message module)."""

    def __init__(self, context: ServerContext, pb: Any) -> None:
        self.context = context
        self.pb = pb
        self.calls: dict[str, int] = {}
        """The samples of each `Generate` call in flight, by request id (what `Abort` aborts)."""

    def manager(self) -> TokenizerManager:
        """The TokenizerManager; the call ends UNAVAILABLE unless the server is ready."""
        ctx = self.context
        if ctx.phase is not Phase.READY or ctx.manager is None:
            raise _Abort(grpc.StatusCode.UNAVAILABLE, ctx.why_unavailable)
        return ctx.manager

    # ---- Generate --------------------------------------------------------------------------

    async def generate(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """Streams the messages of one request (n samples): chunks as ids come when it streams,
        then each sample's completion."""
        request_id = request.request_id
        registered = False
        async with call_status(context):
            try:
                manager = self.manager()
                obj = generate_input(request)
                if request_id in self.calls:
                    raise RequestError(f"request id {request_id!r} is already in flight", "rid")
                self.calls[request_id] = request.sampling_params.n or 1
                registered = True
                builder = ResponseBuilder(self.pb, request_id, request.return_logprob)
                position = 0
                # Closed at once however the loop ends (an error, the call's cancellation), so
                # that its requests still running are aborted then, not when it is collected.
                results = contextlib.aclosing(manager.generate_request(obj))
                async with results as stream:
                    async for result in stream:
                        # Streamed results of several samples carry their index; final ones
                        # come in order.
                        index = result.get("index", 0) if obj.stream else position
                        position += 1
                        reason = result["meta_info"]["finish_reason"]
                        refused = refusal(reason)
                        if refused is not None:
                            raise _Abort(*refused)
                        if obj.stream and (result["output_ids"] or request.return_logprob):
                            yield builder.chunk(result, index)
                        if reason is not None:
                            yield builder.complete(result, index, streamed=obj.stream)
                context.set_trailing_metadata(builder.trailing_metadata())
            finally:
                if registered:
                    del self.calls[request_id]

    async def abort(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Aborts the requests of the `Generate` call of `request_id` (its samples)."""
        samples = self.calls.get(request.request_id)
        if samples is None:
            return self.pb.AbortResponse(
                success=False, message=f"no request {request.request_id!r} is in flight"
            )
        async with call_status(context):
            for rid in sample_rids(request.request_id, samples):
                await self.manager().abort_request(rid)
        return self.pb.AbortResponse(success=True, message=f"aborted: {request.reason}")

    async def embed(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, "srt serves generation models only: no embeddings"
        )

    # ---- health, model, server, load -------------------------------------------------------

    async def health_check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Healthy when the server is ready and its scheduler answers within
        `HEALTH_TIMEOUT_S`; UNAVAILABLE while it starts or stops."""
        async with call_status(context):
            manager = self.manager()
        try:
            await asyncio.wait_for(manager.health_check(), HEALTH_TIMEOUT_S)
        except TimeoutError:
            message = f"the scheduler did not answer within {HEALTH_TIMEOUT_S:g} s"
            return self.pb.HealthCheckResponse(healthy=False, message=message)
        except EngineDeadError as e:
            return self.pb.HealthCheckResponse(healthy=False, message=str(e))
        return self.pb.HealthCheckResponse(healthy=True, message="ready")

    async def get_model_info(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """The model's facts the router reads when a worker registers: its tokenizer's local
        directory (which it loads), context length, EOS ids, architecture. Read from the
        model's files, off the event loop."""
        return await asyncio.to_thread(self.model_info)

    def model_info(self) -> Any:
        args = self.context.server_args
        assert args.model_path is not None
        info = ModelInfo.read(args.model_path, args.context_length, args.trust_remote_code)
        config = read_json(
            local_files(args.model_path, "config.json", args.trust_remote_code) / "config.json"
        )
        return self.pb.GetModelInfoResponse(
            model_path=args.model_path,
            tokenizer_path=str(tokenizer_files(args)),
            is_generation=True,
            served_model_name=self.context.model_name,
            max_context_length=info.context_length,
            vocab_size=info.vocab_size,
            model_type=str(config.get("model_type", "")),
            eos_token_ids=sorted(info.eos_token_ids),
            pad_token_id=_int_or_zero(config.get("pad_token_id")),
            bos_token_id=_int_or_zero(config.get("bos_token_id")),
            max_req_input_len=info.context_length - 1,
            architectures=list(config.get("architectures") or []),
        )

    async def get_server_info(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """The server's arguments, its requests in flight, its version and age."""
        async with call_status(context):
            manager = self.manager()
            load = await manager.get_load()
        ctx = self.context
        out = self.pb.GetServerInfoResponse(
            active_requests=manager.num_in_flight,
            uptime_seconds=time.time() - ctx.started_at,
            sglang_version=__version__,
            server_type="grpc",
        )
        # JSON's values (a Struct holds no tuples); no secret: --grpc-mode takes no API key.
        out.server_args.update(json.loads(json.dumps(dataclasses.asdict(ctx.server_args))))
        out.scheduler_info.update({"max_total_num_tokens": load.max_total_tokens})
        out.start_time.FromSeconds(int(ctx.started_at))
        return out

    async def get_loads(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """The scheduler's load (one data-parallel rank); the `queues` section on request."""
        async with call_status(context):
            load = await self.manager().get_load()
        usage = load.num_used_tokens / load.max_total_tokens if load.max_total_tokens else 0.0
        total = load.num_running_reqs + load.num_waiting_reqs
        entry = self.pb.SchedulerLoad(
            dp_rank=0,
            num_running_reqs=load.num_running_reqs,
            num_waiting_reqs=load.num_waiting_reqs,
            num_total_reqs=total,
            num_used_tokens=load.num_used_tokens,
            max_total_num_tokens=load.max_total_tokens,
            token_usage=usage,
        )
        if {"queues", "all"} & set(request.include):
            entry.queues.waiting = load.num_waiting_reqs
            entry.queues.retracted = load.num_retracted_reqs
        return self.pb.GetLoadsResponse(
            timestamp=datetime.datetime.now(datetime.UTC).isoformat(),
            version=__version__,
            dp_rank_count=1,
            loads=[entry],
            aggregate=self.pb.AggregateMetrics(
                total_running_reqs=load.num_running_reqs,
                total_waiting_reqs=load.num_waiting_reqs,
                total_reqs=total,
                avg_token_usage=usage,
            ),
        )


@contextlib.asynccontextmanager
async def call_status(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
    """Ends the call with the status of what its handler raises inside: a refused request
    INVALID_ARGUMENT (the message led by this service's name of the field), a dead stage
    UNAVAILABLE, an `_Abort` its own."""
    try:
        yield
    except RequestError as e:
        param = grpc_field(e.param)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{param}: {e}" if param else str(e))
    except EngineDeadError as e:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"the server cannot serve: {e}")
    except _Abort as e:
        await context.abort(e.code, e.details)


class _Abort(Exception):
    """Ends a call with a status (raised where `context.abort` cannot be awaited)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def _int_or_zero(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def service_handler(service: SchedulerService) -> grpc.GenericRpcHandler:
    """The gRPC handler of every RPC of the .proto's service, bound to `service`'s methods
    (`Generate` → `generate`, `GetModelInfo` → `get_model_info`, ...)."""
    pb = service.pb
    descriptor = pb.DESCRIPTOR.services_by_name[SERVICE]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in descriptor.methods:
        behaviour = getattr(service, _snake(method.name))
        request_type = getattr(pb, method.input_type.name)
        response_type = getattr(pb, method.output_type.name)
        make: Callable[..., grpc.RpcMethodHandler] = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            behaviour,
            request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(descriptor.full_name, handlers)


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
