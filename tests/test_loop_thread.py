"""The Engine's background event loop: results, errors and early exits cross threads and loops,
and a caller that goes away stops the work it started."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from srt.entrypoints.loop_thread import LoopThread


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread("test-loop")
    yield thread
    thread.stop()


async def on_which_thread() -> str:
    return threading.current_thread().name


async def fail() -> None:
    raise KeyError("boom")


async def numbers(n: int, stopped: threading.Event, fail_at: int = -1) -> AsyncIterator[int]:
    try:
        for i in range(n):
            if i == fail_at:
                raise KeyError(f"failed at {i}")
            await asyncio.sleep(0)
            yield i
        await asyncio.sleep(3600)  # a producer that never ends by itself
    finally:
        stopped.set()


def test_call_runs_on_the_loop_and_passes_errors(loop_thread: LoopThread) -> None:
    assert loop_thread.call(on_which_thread()) == "test-loop"
    with pytest.raises(KeyError, match="boom"):
        loop_thread.call(fail())


def test_call_from_the_loops_own_thread_is_refused(loop_thread: LoopThread) -> None:
    async def nested() -> None:
        loop_thread.call(on_which_thread())

    with pytest.raises(RuntimeError, match="never return"):
        loop_thread.call(nested())


def test_call_async_bridges_and_cancels(loop_thread: LoopThread) -> None:
    started, stopped = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()

    async def main() -> None:
        assert await loop_thread.call_async(on_which_thread()) == "test-loop"
        task = asyncio.ensure_future(loop_thread.call_async(forever()))
        await asyncio.to_thread(started.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert stopped.wait(10), "cancelling the caller did not cancel the work on the loop"


def test_iterate_hands_items_and_errors_to_plain_code(loop_thread: LoopThread) -> None:
    stopped = threading.Event()
    items = loop_thread.iterate(lambda: numbers(3, stopped, fail_at=2))
    assert next(items) == 0
    assert next(items) == 1
    with pytest.raises(KeyError, match="failed at 2"):
        next(items)
    assert stopped.wait(10)


def test_leaving_an_iteration_early_stops_the_producer(loop_thread: LoopThread) -> None:
    stopped = threading.Event()
    for i in loop_thread.iterate(lambda: numbers(5, stopped)):
        if i == 1:
            break
    assert stopped.wait(10), "the producer kept running after the consumer left"


def test_iterate_async_hands_items_to_another_loop(loop_thread: LoopThread) -> None:
    stopped = threading.Event()

    async def main() -> list[int]:
        got = []
        async for i in loop_thread.iterate_async(lambda: numbers(10, stopped)):
            got.append(i)
            if i == 4:
                break
        return got

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]
    assert stopped.wait(10)


def test_stop_cancels_what_still_runs_and_is_idempotent() -> None:
    thread = LoopThread("test-loop")
    started, stopped = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()

    asyncio.run_coroutine_threadsafe(forever(), thread.loop)
    assert started.wait(10)
    thread.stop()
    thread.stop()
    assert stopped.is_set()
    assert not thread.thread.is_alive()
    assert thread.loop.is_closed()
