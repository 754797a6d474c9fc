"""The launcher: creates a server's rings, starts its scheduler and detokenizer processes with
`spawn`, waits until both are ready, watches them, and stops everything (docs/design.md §1).

Guarantees, whatever way the server ends:

- normal stop (`Launcher.stop`, or `Launcher.close` on a signal): the stages get a
  `ShutdownReq` (or SIGTERM) and exit 0; stragglers are killed;
- a child dies: `watch()` returns which one and why (its exception, exit code or signal), and
  its owner (the HTTP server, the Engine) stops the others;
- the launcher is killed (even `kill -9`): each child gets SIGTERM from the kernel
  (`PR_SET_PDEATHSIG`) and sees the launcher's pidfd close, and exits;
- no shared memory is left: the ring names vanish once both ends attached (the second end
  unlinks them), and whoever exits first (launcher or child) unlinks any that remain.

With `--grpc-mode` there is no detokenizer: the gRPC entrance streams token ids, so the main
process reads the scheduler's ring "detokenizer" itself, and ring "tokenizer" is not made.

With `--tp-size N` the scheduler is N processes, one per tensor-parallel rank (`scheduler`,
`scheduler-tp1`, ...), each a child like any other: one that dies is the stage to blame. Over
`--nnodes`, each machine's launcher starts its own ranks; node 0 also the detokenizer, and only
node 0 serves (`worker_node.py` runs the others).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing as mp
import os
import signal
import socket
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from srt import envs
from srt.io_struct import ShutdownReq
from srt.ipc.channel import Receiver, Sender
from srt.ipc.rings import RingNames
from srt.managers.stage_process import READY
from srt.server_args import ServerArgs

# Each stage's entry point, imported only in its own process: the launcher (and the HTTP server
# around it) never loads torch or the model code.
STAGES: dict[str, str] = {
    "scheduler": "srt.managers.scheduler_stage:run_scheduler_process",
    "detokenizer": "srt.managers.detokenizer_manager:run_detokenizer_process",
}
GRACE_S = 5.0


def run_entry_point(target: str, *args: Any) -> None:
    """Runs `module:function` with `args` (in a freshly spawned stage process)."""
    module, function = target.split(":")
    getattr(importlib.import_module(module), function)(*args)


class ChildDied(RuntimeError):
    """A stage process exited while the server needed it."""


@dataclass
class Child:
    name: str
    process: BaseProcess
    conn: Connection
    report: str = field(default="")

    def lost_peer(self) -> bool:
        """Whether the process stopped because a process it talks to went away first."""
        self.why()
        return self.report.startswith("BrokenPipeError")

    def why(self) -> str:
        """Why the process ended: its own report if it sent one, else its exit status."""
        try:
            while self.conn.poll():
                message = self.conn.recv_bytes().decode(errors="replace")
                if message != READY.decode():
                    self.report = message.splitlines()[0]
        except (EOFError, OSError):
            pass
        code = self.process.exitcode
        if code is not None and code < 0:
            status = f"was killed by {signal.Signals(-code).name}"
        else:
            status = f"exited with code {code}"
        pid = self.process.pid
        return f"{self.name} process (pid {pid}) {status}" + (
            f": {self.report}" if self.report else ""
        )


class Launcher:
    """Owns one server's rings and stage processes."""

    def __init__(self, server_args: ServerArgs) -> None:
        self.server_args = with_dist_init_addr(server_args)
        self.rings = RingNames.new()
        self.children: list[Child] = []

    def start(self) -> tuple[Sender, Receiver]:
        """Starts the stages and returns the main process's channel ends: to the scheduler, and
        from the detokenizer (with `--grpc-mode`, from the scheduler). Raises `ChildDied` if a
        stage fails to start."""
        grpc_mode = self.server_args.grpc_mode
        self.rings.create(envs.ring_capacity(), with_tokenizer=not grpc_mode)
        try:
            self.spawn()
            results = self.rings.detokenizer if grpc_mode else self.rings.tokenizer
            return Sender(self.rings.scheduler), Receiver(results)
        except BaseException:
            self.close()
            raise

    def spawn(self) -> None:
        """Starts this machine's stage processes (`stage_specs`) and waits until each is ready.
        Raises `ChildDied` if one fails to start (the caller closes the others)."""
        spawn = mp.get_context("spawn")
        for name, target, extra in stage_specs(self.server_args):
            ours, theirs = spawn.Pipe(duplex=False)
            args = (self.server_args, self.rings, mp.current_process().pid, theirs, *extra)
            process = spawn.Process(
                target=run_entry_point, args=(target, *args), name=f"srt-{name}"
            )
            process.start()
            theirs.close()
            self.children.append(Child(name, process, ours))
        self._wait_ready()

    def _wait_ready(self) -> None:
        pending = {child.conn: child for child in self.children}
        sentinels = {child.process.sentinel: child for child in self.children}
        while pending:
            for obj in wait([*pending, *sentinels]):
                if obj in sentinels:
                    raise ChildDied(sentinels[obj].why())
                child = pending.pop(obj)  # type: ignore[call-overload]
                try:
                    message = child.conn.recv_bytes()
                except EOFError:
                    message = b""
                if message != READY:  # a failure report (or silence), then the child exits
                    child.report = message.decode(errors="replace").partition("\n")[0]
                    child.process.join(GRACE_S)
                    raise ChildDied(child.why())

    def dead_child(self, exclude: Child | None = None) -> Child | None:
        """The first stage process (other than `exclude`) that has exited, if any."""
        return next(
            (c for c in self.children if c is not exclude and c.process.exitcode is not None),
            None,
        )

    async def watch(self) -> Child:
        """Waits (in the event loop) until a stage process exits and returns the one to blame.
        A stage whose peer vanished exits too (its ring raised `BrokenPipeError`), and may exit
        first: a killed process with a large address space takes a while to tear down after
        its ring descriptors close. Then the other is waited for, up to `GRACE_S`."""
        dead = await self._exited()
        if dead.lost_peer():
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(self._exited(exclude=dead), GRACE_S)
        return dead

    async def _exited(self, exclude: Child | None = None) -> Child:
        loop = asyncio.get_running_loop()
        watched = [c for c in self.children if c is not exclude]
        died: asyncio.Future[None] = loop.create_future()
        for child in watched:
            loop.add_reader(child.process.sentinel, _set_done, died)
        try:
            while (dead := self.dead_child(exclude)) is None:
                await died
                died = loop.create_future()
                for child in watched:
                    loop.add_reader(child.process.sentinel, _set_done, died)
            return dead
        finally:
            for child in watched:
                loop.remove_reader(child.process.sentinel)

    def stop(self, sender: Sender) -> None:
        """Asks the stages to finish (a `ShutdownReq` down the pipeline), then cleans up."""
        if self.dead_child() is None:
            with contextlib.suppress(BrokenPipeError):
                sender.send_blocking(ShutdownReq(rid="shutdown"))
        for child in self.children:
            child.process.join(GRACE_S)
        self.close()

    def close(self) -> None:
        """SIGTERMs every live stage, kills those that do not exit in time, removes the rings."""
        for child in self.children:
            if child.process.exitcode is None:
                os.kill(child.process.pid or 0, signal.SIGTERM)
        for child in self.children:
            child.process.join(GRACE_S)
            if child.process.exitcode is None:
                child.process.kill()
                child.process.join()
        self.rings.unlink()


def stage_specs(args: ServerArgs) -> list[tuple[str, str, tuple[Any, ...]]]:
    """(name, entry point, extra arguments) of each stage process this machine runs: its
    tensor-parallel ranks' schedulers, and on node 0 the detokenizer (unless `--grpc-mode`)."""
    per_node = args.tp_size // args.nnodes
    first = args.node_rank * per_node
    specs: list[tuple[str, str, tuple[Any, ...]]] = [
        ("scheduler" if rank == 0 else f"scheduler-tp{rank}", STAGES["scheduler"], (rank,))
        for rank in range(first, first + per_node)
    ]
    if args.node_rank == 0 and not args.grpc_mode:
        specs.append(("detokenizer", STAGES["detokenizer"], ()))
    return specs


def with_dist_init_addr(args: ServerArgs) -> ServerArgs:
    """`args` with the address where tensor-parallel ranks meet: the one given, else (one
    machine) a port free now on 127.0.0.1, which rank 0's store binds moments later."""
    if args.tp_size == 1 or args.dist_init_addr is not None:
        return args
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return args.replace(dist_init_addr=f"127.0.0.1:{port}")


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
