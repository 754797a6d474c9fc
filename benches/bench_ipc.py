"""IPC between two processes: srt's shared-memory ring against pyzmq and multiprocessing.Pipe.

For frames of 64 B, 1 KiB and 64 KiB it measures messages/s and MB/s of a one-way stream from a
spawned child to the parent, and for 64 B frames the round-trip latency of a ping-pong (median
and p99). The ring is driven from asyncio on both ends (`srt.ipc.channel`), as the server drives
it; pyzmq PUSH/PULL over `ipc://` is measured from asyncio (`zmq.asyncio`, as SGLang's tokenizer
manager uses it; round trips only, see below) and blocking (as SGLang's scheduler uses it);
`multiprocessing.Pipe` blocking.

Each side sends and receives the way its users would at their fastest: the ring's producer
calls `try_send_frame` (awaiting `send_frame` only when the ring is full) and its consumer awaits
one frame, then drains bursts with `recv_frames_nowait`; blocking zmq and the Pipe call plain
`send`/`recv` in a loop, with no coroutine per message. Round trips await each step on all of
them. The ring spins briefly before sleeping (`SRT_RING_SPIN_US`, default 20; 0 turns it off):
with a free core per process its round trip is a few microseconds, on a machine short of cores
the spin backs off and the round trip is the doorbell's.

zmq.asyncio streams are not measured: with pyzmq 27.3 / libzmq 4.3.5 here, a `zmq.asyncio` PULL
socket fed by another process loses a few hundred of 30,000 back-to-back messages (a blocking PULL
gets them all), so the stream never completes.

    python benches/bench_ipc.py --json OUT

The headline ratios compare the ring with blocking zmq, the faster zmq mode:
`ring_vs_zmq_msgs_64B` (messages/s, higher is better for the ring) and `ring_vs_zmq_rtt`
(zmq's median round trip over the ring's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench_utils import emit

SIZES = {"64B": 64, "1KiB": 1024, "64KiB": 65536}
COUNTS = {"64B": 100_000, "1KiB": 50_000, "64KiB": 4_000}
ROUND_TRIPS = 3_000
RING_CAPACITY = 4 << 20

# A transport is a pair of child-side and parent-side callables; `address` is what they share.
# Stream: the child sends `count` frames of `size` bytes, the parent times their arrival.
# Ping-pong: the parent sends a frame, the child echoes it, `count` times.


def _run(main: Any) -> Any:
    """Runs a coroutine on uvloop, the loop the server runs on."""
    import uvloop

    return uvloop.run(main)


def _ring_names() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:12]
    return f"srt-bench-{tag}-a", f"srt-bench-{tag}-b"


def ring_child(names: tuple[str, str], mode: str, size: int, count: int) -> None:
    from srt.ipc.channel import Receiver, Sender

    async def main() -> None:
        if mode == "stream":
            sender = Sender(names[0])
            frame = b"x" * size
            for _ in range(count):
                # As a stage sends: a plain call, awaiting only while the ring is full.
                if not sender.try_send_frame(frame):
                    await sender.send_frame(frame)
        else:
            receiver, sender = Receiver(names[0]), Sender(names[1])
            for _ in range(count):
                await sender.send_frame(await receiver.recv_frame())

    _run(main())


async def ring_parent(names: tuple[str, str], mode: str, size: int, count: int) -> Any:
    from srt.ipc.channel import Receiver, Sender

    if mode == "stream":
        receiver = Receiver(names[0])

        async def recv_all() -> None:
            # As a stage consumes: await one message, then drain what is already there.
            n = 1
            while n < count:
                n += len(receiver.recv_frames_nowait())
                if n < count:
                    await receiver.recv_frame()
                    n += 1

        await receiver.recv_frame()
        start = time.perf_counter()
        await recv_all()
        return (time.perf_counter() - start) / (count - 1)
    sender, receiver = Sender(names[0]), Receiver(names[1])
    return await _time_ping_pong(sender.send_frame, receiver.recv_frame, size, count)


def zmq_child(address: tuple[str, str], mode: str, size: int, count: int, aio: bool) -> None:
    import zmq
    import zmq.asyncio

    ctx: Any = zmq.asyncio.Context() if aio and mode != "stream" else zmq.Context()
    if mode == "stream":
        push = ctx.socket(zmq.PUSH)
        push.connect(address[0])
        frame = b"x" * size
        for _ in range(count):
            push.send(frame, copy=False)
    else:
        pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        pull.connect(address[0])
        push.connect(address[1])
        if aio:

            async def echo() -> None:
                for _ in range(count):
                    await push.send(await pull.recv())

            _run(echo())
        else:
            for _ in range(count):
                push.send(pull.recv())
    ctx.destroy(linger=-1)  # deliver everything before exiting


async def zmq_parent(address: tuple[str, str], mode: str, size: int, count: int, aio: bool) -> Any:
    import zmq
    import zmq.asyncio

    ctx: Any = zmq.asyncio.Context() if aio else zmq.Context()
    try:
        pull = ctx.socket(zmq.PULL)
        pull.bind(address[0] if mode == "stream" else address[1])
        if mode == "stream":
            return _time_stream(pull.recv, count)
        push = ctx.socket(zmq.PUSH)
        push.bind(address[0])
        return await _time_ping_pong(
            _awaitable(push.send, aio), _awaitable(pull.recv, aio), size, count
        )
    finally:
        ctx.destroy(linger=0)


def pipe_child(conn: Connection, mode: str, size: int, count: int) -> None:
    if mode == "stream":
        frame = b"x" * size
        for _ in range(count):
            conn.send_bytes(frame)
    else:
        for _ in range(count):
            conn.send_bytes(conn.recv_bytes())


async def pipe_parent(conn: Connection, mode: str, size: int, count: int) -> Any:
    if mode == "stream":
        return _time_stream(conn.recv_bytes, count)
    return await _time_ping_pong(
        _awaitable(conn.send_bytes, False), _awaitable(conn.recv_bytes, False), size, count
    )


def _awaitable(fn: Callable[..., Any], aio: bool) -> Callable[..., Any]:
    if aio:
        return fn

    async def call(*args: Any) -> Any:
        return fn(*args)

    return call


def _time_stream(recv: Callable[[], Any], count: int) -> float:
    """Seconds from the first frame's arrival to the last's, per frame after the first, for a
    blocking `recv` called directly (no coroutine per message, as a blocking consumer runs)."""
    recv()
    start = time.perf_counter()
    for _ in range(count - 1):
        recv()
    return (time.perf_counter() - start) / (count - 1)


async def _time_ping_pong(
    send: Callable[[bytes], Any], recv: Callable[[], Any], size: int, count: int
) -> list[float]:
    frame = b"p" * size
    rtts = []
    for _ in range(count):
        start = time.perf_counter()
        await send(frame)
        await recv()
        rtts.append(time.perf_counter() - start)
    return rtts


def run(transport: str, mode: str, size: int, count: int) -> Any:
    """Runs one measurement with a fresh child; returns the parent's timing."""
    spawn = mp.get_context("spawn")
    cleanup: list[Callable[[], object]] = []
    parent: Any
    if transport == "ring":
        from srt._rust import ShmRing

        names = _ring_names()
        for name in names:
            ShmRing.create(name, RING_CAPACITY)
        child = spawn.Process(target=ring_child, args=(names, mode, size, count))
        parent = ring_parent(names, mode, size, count)
        cleanup = [partial(ShmRing.unlink, name) for name in names]
    elif transport in ("zmq", "zmq_asyncio"):
        tmp = tempfile.mkdtemp(prefix="srt-bench-")
        address = (f"ipc://{tmp}/a", f"ipc://{tmp}/b")
        aio = transport == "zmq_asyncio"
        child = spawn.Process(target=zmq_child, args=(address, mode, size, count, aio))
        parent = zmq_parent(address, mode, size, count, aio)
        cleanup = [partial(shutil.rmtree, tmp, ignore_errors=True)]
    else:
        ours, theirs = spawn.Pipe()
        child = spawn.Process(target=pipe_child, args=(theirs, mode, size, count))
        parent = pipe_parent(ours, mode, size, count)
    child.start()
    try:
        result = _run(parent)
        child.join(30)
        if child.exitcode != 0:
            raise RuntimeError(f"{transport} child exited with {child.exitcode}")
        return result
    finally:
        if child.is_alive():
            child.kill()
            child.join()
        for step in cleanup:
            with contextlib.suppress(OSError):
                step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the results here")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    opts = parser.parse_args()
    results: dict[str, Any] = {}
    for transport in ("ring", "zmq", "zmq_asyncio", "pipe"):
        out: dict[str, Any] = {}
        for label, size in SIZES.items() if transport != "zmq_asyncio" else ():
            per_msg = run(transport, "stream", size, max(10, int(COUNTS[label] * opts.scale)))
            out[label] = {"msgs_per_s": 1 / per_msg, "MB_per_s": size / per_msg / 1e6}
        rtts = sorted(run(transport, "ping", 64, max(10, int(ROUND_TRIPS * opts.scale))))
        out["rtt_us"] = {
            "median": statistics.median(rtts) * 1e6,
            "p99": rtts[int(len(rtts) * 0.99)] * 1e6,
        }
        results[transport] = out
        print(transport, json.dumps(out), file=sys.stderr)
    report = _ratios(results)
    report.update(results)
    report["cpus"] = os.cpu_count()
    emit(report, opts.json)


def _ratios(results: dict[str, Any]) -> dict[str, Any]:
    ring, zmq, pipe = results["ring"], results["zmq"], results["pipe"]
    ratios: dict[str, Any] = {}
    for label in SIZES:
        ratios[f"ring_vs_zmq_msgs_{label}"] = ring[label]["msgs_per_s"] / zmq[label]["msgs_per_s"]
    ratios["ring_vs_zmq_rtt"] = zmq["rtt_us"]["median"] / ring["rtt_us"]["median"]
    zmq_asyncio_rtt = results["zmq_asyncio"]["rtt_us"]["median"]
    ratios["ring_vs_zmq_asyncio_rtt"] = zmq_asyncio_rtt / ring["rtt_us"]["median"]
    ratios["ring_vs_pipe_msgs_64B"] = ring["64B"]["msgs_per_s"] / pipe["64B"]["msgs_per_s"]
    ratios["ring_vs_pipe_rtt"] = pipe["rtt_us"]["median"] / ring["rtt_us"]["median"]
    return ratios


if __name__ == "__main__":
    main()
