"""The scheduler process: `SchedulerStage` runs the `Scheduler` between ring "scheduler" (from the
main process) and ring "detokenizer", answering control messages on the way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from srt.io_struct import (
    AbortReq,
    FlushCacheOut,
    FlushCacheReq,
    GetLoadReq,
    HealthCheckOut,
    HealthCheckReq,
    Message,
    ShutdownReq,
    TokenizedGenerateReq,
)
from srt.ipc.channel import Receiver, Sender
from srt.ipc.rings import RingNames
from srt.managers.hf_tokenizer import tokenizer_files
from srt.managers.scheduler import GRAMMAR_POLL_S, Scheduler
from srt.managers.stage_process import Stage, run_stage
from srt.model_executor.cpu_threads import bind_cpu_threads
from srt.model_executor.model_runner import ModelRunner
from srt.model_executor.resolve import resolve_device
from srt.server_args import ServerArgs


class SchedulerStage(Stage):
    """The scheduler process's loop: receives on ring "scheduler", sends on ring "detokenizer".

    Between forward passes it takes every message that has arrived; when nothing is left to run
    it checks the KV invariants and sleeps until the next message.
    """

    def __init__(self, server_args: ServerArgs, rings: RingNames) -> None:
        if server_args.model_path is None:
            raise ValueError("the scheduler needs --model-path")
        if resolve_device(server_args.device).type == "cpu":
            bind_cpu_threads(server_args.cpu_omp_threads_bind)
        runner = ModelRunner(server_args, server_args.model_path)
        # The same tokenizer.json the detokenizer decodes with (a GGUF file's is written out).
        tokenizer_dir = str(tokenizer_files(server_args))
        # The runner resolved the device defaults: the scheduler reads its resolved arguments.
        self.scheduler = Scheduler(runner.server_args, runner, tokenizer_dir)
        self.recv_from_tokenizer = Receiver(rings.scheduler)
        self.send_to_detokenizer = Sender(rings.detokenizer)
        self.init_handlers()

    async def event_loop(self) -> None:
        """Serves until a `ShutdownReq`, which it passes on to the detokenizer."""
        scheduler = self.scheduler
        while True:
            if not scheduler.has_work():
                scheduler.check_and_count()
                if not await self.handle(await self.recv_from_tokenizer.recv()):
                    return
            while (msg := self.recv_from_tokenizer.recv_nowait()) is not None:
                if not await self.handle(msg):
                    return
            out = scheduler.step()
            if out is not None:
                await self.send_to_detokenizer.send(out)
            # Let signals and the parent watch run between steps; while only grammars compile
            # (on the runner's thread), wait a little rather than spin against it.
            await asyncio.sleep(GRAMMAR_POLL_S if scheduler.only_compiling() else 0)

    def init_handlers(self) -> None:
        """Message type → handler; a handler returns the reply to send on, if any."""
        scheduler = self.scheduler
        self.handlers: dict[type, Callable[[Any], Message | None]] = {
            TokenizedGenerateReq: scheduler.add_request,
            AbortReq: lambda msg: scheduler.abort(msg.rid),
            FlushCacheReq: self.flush_cache,
            GetLoadReq: lambda msg: scheduler.get_load(msg.rid),
            HealthCheckReq: lambda msg: HealthCheckOut(msg.rid, healthy=True),
        }

    async def handle(self, msg: Message) -> bool:
        """Acts on one message; False for `ShutdownReq` (after passing it on)."""
        if isinstance(msg, ShutdownReq):
            await self.send_to_detokenizer.send(msg)
            return False
        handler = self.handlers.get(type(msg))
        if handler is None:
            raise TypeError(f"the scheduler cannot handle {type(msg).__name__}")
        reply = handler(msg)
        if reply is not None:
            await self.send_to_detokenizer.send(reply)
        return True

    def flush_cache(self, msg: FlushCacheReq) -> FlushCacheOut:
        refused = self.scheduler.flush_cache()
        return FlushCacheOut(msg.rid, refused is None, refused or "")


def run_scheduler_process(
    server_args: ServerArgs, rings: RingNames, parent_pid: int, ready: Connection
) -> None:
    """Entry point of the scheduler process (started by the launcher with `spawn`)."""
    run_stage(
        "scheduler",
        rings,
        parent_pid,
        ready,
        lambda: SchedulerStage(server_args, rings),
        server_args.log_level,
    )
