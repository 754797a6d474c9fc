"""The scheduler stage (DESIGN §1, §4). For now a thin stage on the real wiring: it answers the
control messages and "generates" by echoing each prompt's token ids, at most `max_new_tokens` of
them, as one finished `BatchTokenIDOut`. Continuous batching and the model runner replace the
echo in the next issues; the rings, messages and process life cycle stay as they are.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any

from srt.io_struct import (
    AbortReq,
    BatchTokenIDOut,
    FinishReason,
    FlushCacheOut,
    FlushCacheReq,
    GetLoadOut,
    GetLoadReq,
    HealthCheckOut,
    HealthCheckReq,
    ShutdownReq,
    TokenizedGenerateReq,
)
from srt.ipc.channel import Receiver, Sender
from srt.ipc.rings import RingNames
from srt.managers.stage_process import Stage, run_stage
from srt.server_args import ServerArgs


class Scheduler(Stage):
    """Receives on ring "scheduler", sends on ring "detokenizer"."""

    def __init__(self, server_args: ServerArgs, rings: RingNames) -> None:
        self.server_args = server_args
        self.init_channels(rings)
        self.init_dispatch()

    def init_channels(self, rings: RingNames) -> None:
        self.recv_from_tokenizer = Receiver(rings.scheduler)
        self.send_to_detokenizer = Sender(rings.detokenizer)

    def init_dispatch(self) -> None:
        self.handlers: dict[type, Callable[[Any], Awaitable[None]]] = {
            TokenizedGenerateReq: self.handle_generate,
            AbortReq: self.handle_abort,
            FlushCacheReq: self.handle_flush_cache,
            GetLoadReq: self.handle_get_load,
            HealthCheckReq: self.handle_health_check,
        }

    async def event_loop(self) -> None:
        """Serves until a `ShutdownReq`, which it passes on to the detokenizer."""
        while True:
            msg = await self.recv_from_tokenizer.recv()
            if isinstance(msg, ShutdownReq):
                await self.send_to_detokenizer.send(msg)
                return
            handler = self.handlers.get(type(msg))
            if handler is None:
                raise TypeError(f"the scheduler cannot handle {type(msg).__name__}")
            await handler(msg)

    async def handle_generate(self, req: TokenizedGenerateReq) -> None:
        output = req.input_ids[: req.sampling_params.max_new_tokens]
        params = req.sampling_params
        await self.send_to_detokenizer.send(
            BatchTokenIDOut(
                rids=(req.rid,),
                output_ids=(output,),
                finished_reasons=(FinishReason("length", length=params.max_new_tokens),),
                prompt_tokens=(len(req.input_ids),),
                completion_tokens=(len(output),),
                cached_tokens=(0,),
                context_ids=(req.input_ids[-5:],),
                skip_special_tokens=(params.skip_special_tokens,),
                spaces_between_special_tokens=(params.spaces_between_special_tokens,),
                no_stop_trim=(params.no_stop_trim,),
                stop=(params.stop,),
                output_logprobs=((),),
                output_top_logprobs=((),),
            )
        )

    async def handle_abort(self, req: AbortReq) -> None:
        """Nothing runs across steps yet, so there is nothing to abort."""

    async def handle_flush_cache(self, req: FlushCacheReq) -> None:
        await self.send_to_detokenizer.send(FlushCacheOut(rid=req.rid, success=True))

    async def handle_get_load(self, req: GetLoadReq) -> None:
        await self.send_to_detokenizer.send(
            GetLoadOut(
                rid=req.rid,
                num_running_reqs=0,
                num_waiting_reqs=0,
                num_used_tokens=0,
                max_total_tokens=self.server_args.max_total_tokens or 0,
            )
        )

    async def handle_health_check(self, req: HealthCheckReq) -> None:
        await self.send_to_detokenizer.send(HealthCheckOut(rid=req.rid, healthy=True))


def run_scheduler_process(
    server_args: ServerArgs, rings: RingNames, parent_pid: int, ready: Connection
) -> None:
    """Entry point of the scheduler process (started by the launcher with `spawn`)."""
    run_stage("scheduler", rings, parent_pid, ready, lambda: Scheduler(server_args, rings))
