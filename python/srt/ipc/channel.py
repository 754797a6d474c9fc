"""Channels: typed message senders and receivers over one shared-memory ring each.

A channel is named after the stage that receives on it (`scheduler`, `detokenizer`,
`tokenizer`). Sending and receiving bursts costs a plain call per message (`try_send`,
`recv_frames_nowait`). Waiting never blocks an event loop for more than a few microseconds: an
empty receiver (or a sender facing a full ring) first polls the ring briefly (`SPIN_S`, backing
off while that finds nothing), then announces that it sleeps and lets the loop watch the ring's
doorbell descriptor, which stays registered between waits; the other side rings it only when it
sees that announcement, so a busy channel costs no system call per message. When the other
process is gone, waiting raises `BrokenPipeError` (a receiver first gets every message sent
before that).

No message is too long for a channel: the ring splits one longer than a frame into parts as the
receiver makes room, and the receiver gets it whole (see `srt._rust.ShmRing`). Only the
awaiting sends (`send`, `send_frame`, `send_blocking`) send such a message; the plain calls
return False for it, as for a full ring.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from srt import envs
from srt._rust import ShmRing
from srt.io_struct import Message
from srt.ipc.codec import decode, encode

SPIN_S = envs.ring_spin_us() * 1e-6
"""How long a side that just ran out of work polls the ring (GIL released, the loop blocked)
before it sleeps. A peer that answers within this saves the doorbell's round trip (FIFO write,
epoll, callback, task wake-up); an idle side spins once, right after its last message, then
sleeps without using CPU. Spins that keep finding nothing back off (see `_Doorbell._spin`)."""

_MAX_MISSES = 10


class _Doorbell:
    """Waits for one ring end on the running loop. The ring's descriptor stays registered with
    the loop between waits (no `add_reader`/`remove_reader` per wait); the reader callback
    drains the bell and completes the pending wait's future. While registered, the loop holds
    the ring: `close()` the channel to detach it before its loop ends."""

    def __init__(self, ring: ShmRing) -> None:
        self._ring = ring
        self._loop: asyncio.AbstractEventLoop | None = None
        self._woken: asyncio.Future[None] | None = None
        self._misses = 0  # spins in a row that found nothing
        self._skip = 0  # waits left that sleep without spinning

    async def wait(self, need: int = 0) -> None:
        """Returns once `ring` may have data (consumer), or room to go on pushing a `need`-byte
        message (producer; the ring waits for room for what it pushes first, never more than
        fits)."""
        ring = self._ring
        if SPIN_S and self._spin(need):
            return
        if not ring.prepare_wait(need):
            return
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self.close()
            loop.add_reader(ring.fileno(), self._on_bell)
            self._loop = loop
        woken = self._woken = loop.create_future()
        try:
            await woken
        except BaseException:
            with contextlib.suppress(BrokenPipeError):
                ring.finish_wait()
            raise
        finally:
            self._woken = None

    def _spin(self, need: int) -> bool:
        """Polls the ring for up to `SPIN_S`, unless recent spins found nothing: after `k` misses
        in a row the next `2**k - 1` waits go straight to sleep (a peer that cannot run while
        we spin, on a machine short of cores, turns spinning off by itself)."""
        if self._skip:
            self._skip -= 1
            return False
        if self._ring.spin(SPIN_S, need):
            self._misses = 0
            return True
        self._misses = min(self._misses + 1, _MAX_MISSES)
        self._skip = (1 << self._misses) - 1
        return False

    def _on_bell(self) -> None:
        woken = self._woken
        if woken is None or woken.done():
            # Readable with nobody waiting: a late bell or a gone peer (which stays readable).
            # Unregister rather than be called again and again; the next wait registers anew.
            self.close()
            return
        try:
            self._ring.finish_wait()
        except Exception as e:  # BrokenPipeError, or a corrupt ring
            self.close()
            woken.set_exception(e)
        else:
            woken.set_result(None)

    def close(self) -> None:
        """Unregisters the descriptor (before the ring that owns it is closed)."""
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._ring.fileno())


class Sender:
    """The producing end of a channel: `await send(msg)` waits for room, never drops.

    A stage that sends bursts calls `try_send`/`try_send_frame` (no coroutine per message) and
    awaits `send` only when that returns False (the ring is full, or the message needs more than
    one frame). Sends are not concurrent: a stage sends from one task, or under a lock."""

    try_send_frame: Callable[[bytes], bool]
    """Sends an already encoded message if it fits one frame and the ring has room for it now;
    False (nothing sent) otherwise. The ring's own `try_push_frame`, bound once: no Python frame
    per message."""

    def __init__(self, name: str) -> None:
        self._ring = ShmRing.attach(name, "producer")
        self._bell = _Doorbell(self._ring)
        self._max_frame_len = self._ring.max_frame_len
        self.try_send_frame = self._ring.try_push_frame
        self.name = name

    def try_send(self, msg: Message) -> bool:
        """Sends one message if it fits one frame and the ring has room for it now; False
        (nothing sent) otherwise."""
        return self._ring.try_push_frame(encode(msg))

    async def send(self, msg: Message) -> None:
        """Sends one message of any length, waiting (asynchronously) while the ring is full."""
        await self.send_frame(encode(msg))

    async def send_frame(self, frame: bytes) -> None:
        """Sends an already encoded message (a receiver forwarding frames it did not decode).

        A message longer than a frame goes in parts, pushed as the receiver makes room. Once its
        first part is in, the message is sent: if this call is cancelled after that, the ring
        keeps the rest and pushes it before anything sent later."""
        ring = self._ring
        while not ring.try_push(frame):
            await self._bell.wait(len(frame))
        if len(frame) > self._max_frame_len:
            while not ring.flush():
                await self._bell.wait()

    def send_blocking(self, msg: Message) -> None:
        """Sends one message from code without an event loop, sleeping while the ring is full."""
        frame = encode(msg)
        ring = self._ring
        while not ring.try_push(frame):
            ring.wait(None, len(frame))
        while not ring.flush():
            ring.wait(None)

    def close(self) -> None:
        """Detaches; the receiver sees the sender gone once it has drained the ring."""
        self._bell.close()
        del self._bell, self._ring, self.try_send_frame


class Receiver:
    """The consuming end of a channel: `await recv()` sleeps while the ring is empty.

    A stage that drains bursts per step awaits one message, then takes what else is already
    there with `recv_frames_nowait(max)` (one call for many frames)."""

    def __init__(self, name: str) -> None:
        self._ring = ShmRing.attach(name, "consumer")
        self._bell = _Doorbell(self._ring)
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

    def recv_frames_nowait(self, max_frames: int = 256, max_bytes: int = 256 << 10) -> list[bytes]:
        """Up to `max_frames` waiting frames, undecoded, oldest first; empty when none wait.
        Stops once the frames hold `max_bytes` (a burst that big would fall out of cache)."""
        return self._ring.try_pop_many(max_frames, max_bytes)

    async def recv_frame(self) -> bytes:
        """The next frame, undecoded."""
        ring = self._ring
        while (frame := ring.try_pop()) is None:
            await self._bell.wait()
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
        self._bell.close()
        del self._bell, self._ring
