"""Shared-memory rings across processes: stress, backpressure, messages many times a ring's size,
idle CPU, dead peers, corruption."""

from __future__ import annotations

import asyncio
import mmap
import multiprocessing as mp
import os
import signal
import struct
import time
import uuid
import zlib
from collections.abc import Iterator

import numpy as np
import psutil
import pytest

from srt._rust import InvariantError, ShmRing
from srt.io_struct import AbortReq
from srt.ipc.channel import Receiver, Sender

SPAWN = mp.get_context("spawn")


@pytest.fixture
def ring_name() -> Iterator[str]:
    name = f"srt-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    ShmRing.unlink(name)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(name)]


def stress_plan(n: int, capacity: int) -> tuple[np.ndarray, np.ndarray, bytes]:
    """Frame sizes (mostly small, 1% above half the capacity), offsets into a random pool."""
    rng = np.random.default_rng(1234)
    sizes = np.minimum(rng.geometric(1 / 64, n), capacity // 2)
    big = rng.random(n) < 0.01
    sizes[big] = rng.integers(capacity // 2 + 1, capacity - 8, big.sum())
    pool = rng.bytes(2 * capacity)
    offsets = rng.integers(0, capacity, n)
    return sizes, offsets, pool


def stress_producer(name: str, n: int, capacity: int, report: mp.connection.Connection) -> None:
    ring = ShmRing.attach(name, "producer")
    sizes, offsets, pool = stress_plan(n, capacity)
    view = memoryview(pool)
    crc = 0
    for size, offset in zip(sizes.tolist(), offsets.tolist(), strict=True):
        frame = bytes(view[offset : offset + size])
        while not ring.try_push(frame):
            ring.wait(None, size)
        crc = zlib.crc32(frame, crc)
    report.send_bytes(struct.pack("<I", crc))


@pytest.mark.slow
def test_a_million_frames_arrive_in_order_complete_and_intact(ring_name: str) -> None:
    n, capacity = 1_000_000, 1 << 14
    ShmRing.create(ring_name, capacity)
    ours, theirs = SPAWN.Pipe(duplex=False)
    producer = SPAWN.Process(target=stress_producer, args=(ring_name, n, capacity, theirs))
    producer.start()
    receiver = Receiver(ring_name)
    sizes, offsets, pool = stress_plan(n, capacity)
    assert sizes.min() == 1
    assert sizes.max() > capacity // 2
    view = memoryview(pool)

    async def consume() -> tuple[int, int, int]:
        count = crc = mismatches = 0
        expected = zip(sizes.tolist(), offsets.tolist(), strict=True)
        while True:
            try:
                frame = await receiver.recv_frame()
            except BrokenPipeError:
                return count, crc, mismatches
            while True:
                size, offset = next(expected, (-1, 0))
                mismatches += frame != view[offset : offset + size]
                crc = zlib.crc32(frame, crc)
                count += 1
                if (next_frame := receiver.recv_frame_nowait()) is None:
                    break
                frame = next_frame

    count, crc, mismatches = asyncio.run(consume())
    producer.join(10)
    assert producer.exitcode == 0
    assert (count, mismatches) == (n, 0)
    assert struct.unpack("<I", ours.recv_bytes())[0] == crc


def test_a_full_ring_makes_send_wait_without_blocking_the_loop(ring_name: str) -> None:
    ShmRing.create(ring_name, 4096)
    receiver, sender = Receiver(ring_name), Sender(ring_name)
    frames = [bytes([i]) * 1000 for i in range(50)]

    async def scenario() -> list[bytes]:
        async def send_all() -> None:
            for frame in frames:
                await sender.send_frame(frame)

        sending = asyncio.ensure_future(send_all())
        ticks = 0
        while ticks < 20:  # the loop keeps running other work while the sender waits
            await asyncio.sleep(0.005)
            ticks += 1
        assert not sending.done(), "50 KB cannot fit a 4 KiB ring before anything is read"
        received = [await receiver.recv_frame() for _ in frames]
        await sending
        return received

    assert asyncio.run(scenario()) == frames
    assert receiver.recv_frame_nowait() is None


def test_bursts_go_by_plain_calls_and_waits_survive_cancellation_and_new_loops(
    ring_name: str,
) -> None:
    ShmRing.create(ring_name, 4096)
    receiver, sender = Receiver(ring_name), Sender(ring_name)
    frames = [bytes([i]) * 100 for i in range(60)]
    sent = [frame for frame in frames if sender.try_send_frame(frame)]
    assert 0 < len(sent) < len(frames), "a 4 KiB ring takes some frames, then says it is full"
    assert sent == frames[: len(sent)]
    assert receiver.recv_frames_nowait(10) == sent[:10]
    assert receiver.recv_frames_nowait(max_bytes=250) == sent[10:13]
    assert receiver.recv_frames_nowait(max_bytes=0) == sent[13:14]
    assert receiver.recv_frames_nowait() == sent[14:]
    assert receiver.recv_frames_nowait() == []

    async def wait_cancelled() -> None:
        waiting = asyncio.ensure_future(receiver.recv_frame())
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    async def wait_woken(frame: bytes) -> bytes:
        async def send_later() -> None:
            await asyncio.sleep(0.01)
            assert sender.try_send_frame(frame)

        sending = asyncio.ensure_future(send_later())
        received = await receiver.recv_frame()
        await sending
        return received

    for i in range(3):  # each run is a new loop: the doorbell registers with it
        asyncio.run(wait_cancelled())
        assert asyncio.run(wait_woken(b"%d" % i)) == b"%d" % i
    assert receiver.recv_frame_nowait() is None
    receiver.close()
    sender.close()


def big_message(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(size)


def long_message_producer(name: str) -> None:
    """Small frames around messages of up to 80 times the ring's size, by every awaiting send."""
    sender = Sender(name)

    async def send_all() -> None:
        for i in range(3):
            await sender.send_frame(b"before %d" % i)
            await sender.send_frame(big_message((5 << 20) + i, i))
            await sender.send_frame(b"after %d" % i)

    asyncio.run(send_all())
    sender.send_blocking(AbortReq("x" * (3 << 20)))
    sender.send_blocking(AbortReq("last"))


def test_messages_many_times_the_ring_cross_processes_whole_and_in_order(ring_name: str) -> None:
    ShmRing.create(ring_name, 64 << 10)
    producer = SPAWN.Process(target=long_message_producer, args=(ring_name,))
    producer.start()
    receiver = Receiver(ring_name)

    async def receive_all() -> list[bytes]:
        return [await receiver.recv_frame() for _ in range(9)]

    frames = asyncio.run(receive_all())
    for i in range(3):
        assert frames[3 * i] == b"before %d" % i
        assert frames[3 * i + 1] == big_message((5 << 20) + i, i)
        assert frames[3 * i + 2] == b"after %d" % i
    assert receiver.recv_blocking(timeout=30) == AbortReq("x" * (3 << 20))
    assert receiver.recv_blocking(timeout=30) == AbortReq("last")
    producer.join(30)
    assert producer.exitcode == 0


def test_plain_sends_refuse_a_message_longer_than_a_frame_and_send_waits_for_its_parts(
    ring_name: str,
) -> None:
    ShmRing.create(ring_name, 4096)
    receiver, sender = Receiver(ring_name), Sender(ring_name)
    long_abort = AbortReq("r" * 10_000)
    assert not sender.try_send(long_abort), "needs parts: the caller falls back to send"
    assert not sender.try_send_frame(b"x" * 4089)
    assert receiver.recv_frame_nowait() is None, "nothing was sent"

    async def scenario() -> list[object]:
        sending = asyncio.ensure_future(sender.send(long_abort))
        await asyncio.sleep(0.05)
        assert not sending.done(), "10 KB go through a 4 KiB ring only as it is read"
        got: list[object] = [await receiver.recv()]
        await sending
        assert sender.try_send(AbortReq("next"))
        got.append(await receiver.recv())
        return got

    assert asyncio.run(scenario()) == [long_abort, AbortReq("next")]
    receiver.close()
    sender.close()


def test_a_cancelled_long_send_still_delivers_its_message_before_the_next(ring_name: str) -> None:
    ShmRing.create(ring_name, 4096)
    receiver, sender = Receiver(ring_name), Sender(ring_name)
    long_frame = big_message(50_000, 7)

    async def scenario() -> list[bytes]:
        sending = asyncio.ensure_future(sender.send_frame(long_frame))
        await asyncio.sleep(0.05)  # its first parts are in; the ring is full
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        assert not sender.try_send_frame(b"next"), "the rest of the long message goes first"
        next_sent = asyncio.ensure_future(sender.send_frame(b"next"))
        got = [await receiver.recv_frame(), await receiver.recv_frame()]
        await next_sent
        return got

    assert asyncio.run(scenario()) == [long_frame, b"next"]
    receiver.close()
    sender.close()


def idle_consumer(name: str) -> None:
    receiver = Receiver(name)
    asyncio.run(receiver.recv_frame())


def test_an_idle_consumer_uses_no_cpu(ring_name: str) -> None:
    ShmRing.create(ring_name, 4096)
    consumer = SPAWN.Process(target=idle_consumer, args=(ring_name,))
    consumer.start()
    sender = Sender(ring_name)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/dev/shm/{ring_name}") and time.monotonic() < deadline:
        time.sleep(0.05)  # the names vanish once the consumer attached too
    time.sleep(0.5)  # let it finish starting up and go to sleep
    proc = psutil.Process(consumer.pid)
    before = proc.cpu_times()
    time.sleep(2)
    after = proc.cpu_times()
    used = (after.user + after.system) - (before.user + before.system)
    assert used < 0.02 * 2, f"the idle consumer used {used:.3f} s of CPU in 2 s"
    asyncio.run(_send(sender, b"wake up"))
    consumer.join(10)
    assert consumer.exitcode == 0


async def _send(sender: Sender, frame: bytes) -> None:
    await sender.send_frame(frame)


def stuck_producer(name: str) -> None:
    ring = ShmRing.attach(name, "producer")
    assert ring.try_push(b"before")
    time.sleep(60)


def stuck_consumer(name: str) -> None:
    ShmRing.attach(name, "consumer")
    time.sleep(60)


def test_a_killed_producer_is_noticed_within_a_second(ring_name: str) -> None:
    ShmRing.create(ring_name, 4096)
    producer = SPAWN.Process(target=stuck_producer, args=(ring_name,))
    producer.start()
    receiver = Receiver(ring_name)

    async def scenario() -> float:
        assert await receiver.recv_frame() == b"before"
        waiting = asyncio.ensure_future(receiver.recv_frame())
        await asyncio.sleep(0.2)
        assert not waiting.done()
        killed = time.monotonic()
        os.kill(producer.pid or 0, signal.SIGKILL)
        with pytest.raises(BrokenPipeError, match="producer"):
            await waiting
        return time.monotonic() - killed

    assert asyncio.run(scenario()) < 1.0
    producer.join()


def test_a_killed_consumer_is_noticed_by_a_blocked_producer_within_a_second(
    ring_name: str,
) -> None:
    ShmRing.create(ring_name, 4096)
    consumer = SPAWN.Process(target=stuck_consumer, args=(ring_name,))
    consumer.start()
    ring = ShmRing.attach(ring_name, "producer")
    while ring.peer_pid == 0:
        time.sleep(0.01)
    assert ring.try_push(b"x" * 4000)
    assert not ring.try_push(b"x" * 100)
    os.kill(consumer.pid or 0, signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(BrokenPipeError, match="consumer"):
        ring.wait(5.0, 100)
    assert time.monotonic() - killed < 1.0
    consumer.join()


def test_a_corrupt_frame_raises_and_never_crashes(ring_name: str) -> None:
    ShmRing.create(ring_name, 4096)
    with open(f"/dev/shm/{ring_name}", "r+b") as f:
        shm = mmap.mmap(f.fileno(), 0)
    producer = ShmRing.attach(ring_name, "producer")
    consumer = ShmRing.attach(ring_name, "consumer")
    assert producer.try_push(b"hello")
    shm[256:260] = struct.pack("<I", 1 << 30)  # a length far beyond what was published
    with pytest.raises(InvariantError, match="corrupt"):
        consumer.try_pop()
    with pytest.raises(InvariantError):
        consumer.try_pop()  # stays poisoned
    shm[128:136] = struct.pack("<Q", 12345)  # a tail ahead of the head, off frame boundaries
    with pytest.raises(InvariantError):
        producer.try_push(b"x" * 4088)  # needs the consumer's tail, which is now impossible
    shm.close()


def test_a_corrupt_header_refuses_attach(ring_name: str) -> None:
    ShmRing.create(ring_name, 4096)
    with open(f"/dev/shm/{ring_name}", "r+b") as f, mmap.mmap(f.fileno(), 0) as shm:
        shm[16:24] = struct.pack("<Q", 1 << 40)
    with pytest.raises(InvariantError, match="capacity"):
        ShmRing.attach(ring_name, "consumer")


def test_arguments_are_checked(ring_name: str) -> None:
    with pytest.raises(ValueError, match="power of two"):
        ShmRing.create(ring_name, 1000)
    with pytest.raises(ValueError, match="name"):
        ShmRing.create("../etc/x", 4096)
    ShmRing.create(ring_name, 64)
    with pytest.raises(ValueError, match="role"):
        ShmRing.attach(ring_name, "both")
    ShmRing.attach(ring_name, "producer")
    with pytest.raises(ValueError, match="already has"):
        ShmRing.attach(ring_name, "producer")
