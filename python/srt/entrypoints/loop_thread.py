"""An event loop in a background thread, and the bridges that let plain code and other event
loops use coroutines and async iterators that live on it.

The offline Engine keeps its TokenizerManager here: the manager's receive loop must keep
running between (and during) calls, whether the caller is plain code (`call`, `iterate`) or a
coroutine on its own event loop (`call_async`, `iterate_async`). A caller that goes away
(cancelled, or stops iterating) cancels the work it started on this loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

# What a pump hands its consumer: an item, the end, or the error that ended the iteration.
_ITEM, _END, _ERROR = range(3)
Put = Callable[[tuple[int, Any]], None]


class LoopThread:
    """A uvloop event loop running forever in a daemon thread, until `stop`."""

    def __init__(self, name: str) -> None:
        import uvloop

        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs `coro` on the loop; blocks this (other) thread until it returns or raises. An
        interrupt (^C) while waiting cancels `coro`."""
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a blocking call from the loop's own thread would never return")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:  # ^C while waiting: the work stops too
            future.cancel()
            raise

    async def call_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs `coro` on the loop and awaits it from the caller's loop; cancelling the caller
        cancels `coro`."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def iterate(self, make: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
        """Iterates `make()` on the loop, handing each item to this (plain) caller."""
        items: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        pump = self._pump(make, items.put)
        try:
            while True:
                kind, value = items.get()
                if kind == _END:
                    return
                if kind == _ERROR:
                    raise value
                yield value
        finally:
            pump.cancel()

    async def iterate_async(self, make: Callable[[], AsyncIterator[T]]) -> AsyncIterator[T]:
        """Iterates `make()` on the loop, handing each item to the caller's event loop."""
        caller = asyncio.get_running_loop()
        items: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

        def put(entry: tuple[int, Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop is already closed
                caller.call_soon_threadsafe(items.put_nowait, entry)

        pump = self._pump(make, put)
        try:
            while True:
                kind, value = await items.get()
                if kind == _END:
                    return
                if kind == _ERROR:
                    raise value
                yield value
        finally:
            pump.cancel()

    def _pump(
        self, make: Callable[[], AsyncIterator[T]], put: Put
    ) -> concurrent.futures.Future[None]:
        async def pump() -> None:
            try:
                async for item in make():
                    put((_ITEM, item))
            except asyncio.CancelledError:
                put((_ERROR, RuntimeError("the iteration was cancelled on the engine's loop")))
                raise
            except Exception as e:
                put((_ERROR, e))
            else:
                put((_END, None))

        return asyncio.run_coroutine_threadsafe(pump(), self.loop)

    def stop(self) -> None:
        """Cancels what still runs on the loop, stops it and closes it. Idempotent."""
        if self.loop.is_closed():
            return
        if self.thread.is_alive():
            self.call(_cancel_all())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
        self.loop.close()


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()
