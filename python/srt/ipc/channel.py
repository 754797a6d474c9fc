"""Channels: typed message senders and receivers over one shared-memory ring each.

A channel is named after the stage that receives on it (`scheduler`, `detokenizer`,
`tokenizer`). Waiting never spins and never blocks an event loop: an empty receiver (or a
sender facing a full ring) announces that it sleeps and lets the loop watch the ring's doorbell
descriptor; the other side rings it only when it sees that announcement, so a busy channel costs
no system call per message. When the other process is gone, waiting raises `BrokenPipeError`
(a receiver first gets every message sent before that).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from srt._rust import ShmRing
from srt.io_struct import Message
from srt.ipc.codec import decode, encode


async def _wait(ring: ShmRing, need: int = 0) -> None:
    """Sleeps until `ring` may have data (consumer) or room for `need` bytes (producer)."""
    if not ring.prepare_wait(need):
        return
    loop = asyncio.get_running_loop()
    woken = loop.create_future()
    fd = ring.fileno()
    loop.add_reader(fd, _wake, woken)
    try:
        await woken
    except BaseException:
        loop.remove_reader(fd)
        with contextlib.suppress(BrokenPipeError):
            ring.finish_wait()
        raise
    loop.remove_reader(fd)
    ring.finish_wait()


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


class Sender:
    """The producing end of a channel: `await send(msg)` waits for room, never drops."""

    def __init__(self, name: str) -> None:
        self._ring = ShmRing.attach(name, "producer")
        self.name = name

    async def send(self, msg: Message) -> None:
        """Sends one message, waiting (asynchronously) while the ring is full."""
        await self.send_frame(encode(msg))

    async def send_frame(self, frame: bytes) -> None:
        """Sends an already encoded message (a receiver forwarding frames it did not decode)."""
        ring = self._ring
        while not ring.try_push(frame):
            await _wait(ring, len(frame))

    def send_blocking(self, msg: Message) -> None:
        """Sends one message from code without an event loop, sleeping while the ring is full."""
        frame = encode(msg)
        while not self._ring.try_push(frame):
            self._ring.wait(None, len(frame))

    def close(self) -> None:
        """Detaches; the receiver sees the sender gone once it has drained the ring."""
        del self._ring


class Receiver:
    """The consuming end of a channel: `await recv()` sleeps while the ring is empty."""

    def __init__(self, name: str) -> None:
        self._ring = ShmRing.attach(name, "consumer")
        self.name = name

    def recv_nowait(self) -> Message | None:
        """The next message, or None when none is waiting."""
        frame = self._ring.try_pop()
        return None if frame is None else decode(frame)

    async def recv(self) -> Message:
        """The next message, waiting (asynchronously) for one."""
        return decode(await self.recv_frame())

    def recv_frame_nowait(self) -> bytes | None:
        """The next frame, undecoded, or None when none is waiting."""
        return self._ring.try_pop()

    async def recv_frame(self) -> bytes:
        """The next frame, undecoded."""
        ring = self._ring
        while (frame := ring.try_pop()) is None:
            await _wait(ring)
        return frame

    def recv_blocking(self, timeout: float | None = None) -> Message | None:
        """The next message, sleeping up to `timeout` seconds (forever when None) for one."""
        ring = self._ring
        deadline = None if timeout is None else time.monotonic() + timeout
        while (frame := ring.try_pop()) is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            ring.wait(remaining)
        return decode(frame)

    def close(self) -> None:
        """Detaches; a sender waiting for room sees the receiver gone."""
        del self._ring
