"""The scheduler process: `SchedulerStage` runs the `Scheduler` between ring "scheduler" (from the
main process) and ring "detokenizer", answering control messages on the way. With `--tp-size N`
there are N such processes, one per tensor-parallel rank; rank 0 alone talks to the rings and
shares what it receives with the others (`tp_ranks`)."""

from __future__ import annotations

import asyncio
import logging
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
from srt.managers import batch_log
from srt.managers.hf_tokenizer import tokenizer_files
from srt.managers.scheduler import GRAMMAR_POLL_S, Scheduler
from srt.managers.stage_process import Stage, run_stage
from srt.managers.tp_ranks import RankSync, join
from srt.model_executor.cpu_threads import bind_cpu_threads
from srt.model_executor.model_runner import ModelRunner
from srt.model_executor.resolve import resolve_device
from srt.server_args import ServerArgs


class SchedulerStage(Stage):
    """The scheduler process's loop: receives on ring "scheduler", sends on ring "detokenizer".

    Between forward passes it takes every message that has arrived; when nothing is left to run
    it checks the KV invariants and sleeps until the next message.
    """

    def __init__(self, server_args: ServerArgs, rings: RingNames, tp_rank: int = 0) -> None:
        model_path = server_args.model_path
        if model_path is None:
            raise ValueError("the scheduler needs --model-path")
        device_type = resolve_device(server_args.device).type
        if device_type == "cpu":  # before the group's threads start: they inherit the binding
            per_node = server_args.tp_size // server_args.nnodes
            bind_cpu_threads(server_args.cpu_omp_threads_bind, (tp_rank % per_node, per_node))
        server_args, group = join(server_args, tp_rank, device_type)
        self.first_rank = group.is_first
        if not self.first_rank:  # every rank runs the same batches: rank 0 logs them
            logging.getLogger(batch_log.__name__).setLevel(logging.WARNING)
        self.sync = RankSync(group) if group.size > 1 else None
        runner = ModelRunner(server_args, model_path)
        # The same tokenizer.json the detokenizer decodes with (a GGUF file's is written out).
        tokenizer_dir = str(tokenizer_files(server_args))
        # The runner resolved the device defaults: the scheduler reads its resolved arguments.
        self.scheduler = Scheduler(runner.server_args, runner, tokenizer_dir)
        self.recv_from_tokenizer = Receiver(rings.scheduler) if self.first_rank else None
        self.send_to_detokenizer = Sender(rings.detokenizer) if self.first_rank else None
        self.init_handlers()

    async def event_loop(self) -> None:
        """Serves until a `ShutdownReq`, which it passes on to the detokenizer."""
        scheduler = self.scheduler
        while True:
            if not scheduler.has_work():
                scheduler.check_and_count()
            for msg in await self.recv_requests():
                if not await self.handle(msg):
                    return
            out = scheduler.step()
            if out is not None:
                await self.send(out)
            # Let signals and the parent watch run between steps; while only grammars compile
            # (on the runner's thread), wait a little rather than spin against it.
            await asyncio.sleep(GRAMMAR_POLL_S if scheduler.only_compiling() else 0)

    async def recv_requests(self) -> list[Message]:
        """Every message that has arrived (at least one, waiting for it, when there is no work
        to do); on every rank, rank 0's."""
        messages: list[Message] = []
        receiver = self.recv_from_tokenizer
        if receiver is not None:
            if not self.scheduler.has_work():
                messages.append(await receiver.recv())
            while (msg := receiver.recv_nowait()) is not None:
                messages.append(msg)
                if isinstance(msg, ShutdownReq):
                    break
        if self.sync is not None:
            return await self.sync.share(messages if self.first_rank else None)
        return messages

    async def send(self, msg: Message) -> None:
        """Sends on to the detokenizer: rank 0 does, the other ranks' copies go nowhere."""
        if self.send_to_detokenizer is not None:
            await self.send_to_detokenizer.send(msg)

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
            await self.send(msg)
            return False
        handler = self.handlers.get(type(msg))
        if handler is None:
            raise TypeError(f"the scheduler cannot handle {type(msg).__name__}")
        reply = handler(msg)
        if reply is not None:
            await self.send(reply)
        return True

    def flush_cache(self, msg: FlushCacheReq) -> FlushCacheOut:
        refused = self.scheduler.flush_cache()
        return FlushCacheOut(msg.rid, refused is None, refused or "")


def run_scheduler_process(
    server_args: ServerArgs,
    rings: RingNames,
    parent_pid: int,
    ready: Connection,
    tp_rank: int = 0,
) -> None:
    """Entry point of the scheduler process of tensor-parallel rank `tp_rank` (started by the
    launcher with `spawn`)."""
    run_stage(
        scheduler_name(tp_rank),
        rings,
        parent_pid,
        ready,
        lambda: SchedulerStage(server_args, rings, tp_rank),
        server_args.log_level,
    )


def scheduler_name(tp_rank: int) -> str:
    """The stage name (log prefix, process name) of rank `tp_rank`'s scheduler."""
    return "scheduler" if tp_rank == 0 else f"scheduler-tp{tp_rank}"
