"""The offline Engine (docs/design.md §6): `srt-serve`'s scheduler and detokenizer processes,
driven from Python without HTTP.

    with Engine(model_path="path/to/model") as engine:
        out = engine.generate("The capital of France is", {"max_new_tokens": 16})
        print(out["text"], out["meta_info"]["finish_reason"])

The Engine starts the stages with the `Launcher` and keeps a `TokenizerManager` on an event
loop of its own, in a background thread (`LoopThread`), so that `generate` works from plain code
and `async_generate` from any caller's event loop, and both may run at once from several
threads or tasks. Results have SGLang's shape (`text`, `output_ids`, `meta_info`). A stage
process that dies fails every waiting and later call with `EngineDeadError`.
"""

from __future__ import annotations

import atexit
from collections.abc import AsyncIterator, Iterator, Mapping
from types import TracebackType
from typing import Any, Literal, overload

from srt.entrypoints.launcher import Launcher
from srt.entrypoints.loop_thread import LoopThread
from srt.io_struct import FlushCacheOut, GetLoadOut, HealthCheckOut
from srt.ipc.channel import Receiver, Sender
from srt.managers.generate_req_input import GenerateReqInput
from srt.managers.hf_tokenizer import Tokenizer
from srt.managers.tokenizer_manager import EngineDeadError, TokenizerManager
from srt.server_args import ServerArgs

Prompt = str | list[str] | None
InputIds = list[int] | list[list[int]] | None
SamplingArg = Mapping[str, Any] | list[Mapping[str, Any]] | None
Result = dict[str, Any]


class Engine:
    """An LLM engine in this process's hands: `Engine(model_path=..., **server_args)`."""

    def __init__(self, server_args: ServerArgs | None = None, **kwargs: Any) -> None:
        """Starts the stages; takes a `ServerArgs` or its fields as keyword arguments."""
        if server_args is not None and kwargs:
            raise TypeError("give either server_args or ServerArgs fields, not both")
        self.server_args = server_args if server_args is not None else ServerArgs(**kwargs)
        if self.server_args.model_path is None:
            raise ValueError("the Engine needs model_path")
        self._closed = False
        self._channels: tuple[Sender, Receiver] | None = None
        self._tokenizer_manager: TokenizerManager | None = None
        self._loop: LoopThread | None = None
        self.launcher = Launcher(self.server_args)
        atexit.register(self.shutdown)
        try:
            self._channels = self.launcher.start()
            self._loop = LoopThread("srt-engine-loop")
            self._tokenizer_manager = TokenizerManager(self.server_args, *self._channels)
            self._loop.call(self._start())
        except BaseException:
            self.shutdown()
            raise

    async def _start(self) -> None:
        self.tokenizer_manager.start(stage_exit=self._stage_exit())

    async def _stage_exit(self) -> str:
        child = await self.launcher.watch()
        return child.why()

    @property
    def tokenizer_manager(self) -> TokenizerManager:
        if self._closed or self._tokenizer_manager is None:
            raise EngineDeadError("the engine was shut down")
        return self._tokenizer_manager

    @property
    def loop(self) -> LoopThread:
        if self._closed or self._loop is None:
            raise EngineDeadError("the engine was shut down")
        return self._loop

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer requests are tokenized with (`encode`, `decode`, `len`)."""
        return self.tokenizer_manager.tokenizer

    # ---- generate ------------------------------------------------------------------------------

    @overload
    def generate(
        self,
        prompt: Prompt = None,
        sampling_params: SamplingArg = None,
        input_ids: InputIds = None,
        return_logprob: bool | list[bool] = False,
        top_logprobs_num: int | list[int] = 0,
        stream: Literal[False] = False,
        rid: str | list[str] | None = None,
        logprob_start_len: int | list[int] = -1,
    ) -> Result | list[Result]: ...

    @overload
    def generate(
        self,
        prompt: Prompt = None,
        sampling_params: SamplingArg = None,
        input_ids: InputIds = None,
        return_logprob: bool | list[bool] = False,
        top_logprobs_num: int | list[int] = 0,
        *,
        stream: Literal[True],
        rid: str | list[str] | None = None,
        logprob_start_len: int | list[int] = -1,
    ) -> Iterator[Result]: ...

    def generate(
        self,
        prompt: Prompt = None,
        sampling_params: SamplingArg = None,
        input_ids: InputIds = None,
        return_logprob: bool | list[bool] = False,
        top_logprobs_num: int | list[int] = 0,
        stream: bool = False,
        rid: str | list[str] | None = None,
        logprob_start_len: int | list[int] = -1,
    ) -> Result | list[Result] | Iterator[Result]:
        """Generates for one prompt (a dict back) or a batch, or `n` > 1 samples (a list, prompt
        by prompt, each prompt's samples together). With `stream`, an iterator of chunks, each
        with the text and ids new since its request's previous chunk and, for a batch or `n` >
        1, the `index` of its request; `meta_info["finish_reason"]` is set on a request's last.
        With `return_logprob`, `meta_info` has the logprobs of the output tokens and, with
        `logprob_start_len` >= 0, of the prompt tokens from that position on.
        Blocks; from a coroutine, use `async_generate`."""
        obj = GenerateReqInput(
            text=prompt,
            input_ids=input_ids,
            sampling_params=sampling_params,
            rid=rid,
            return_logprob=return_logprob,
            top_logprobs_num=top_logprobs_num,
            stream=stream,
            logprob_start_len=logprob_start_len,
        )
        if stream:
            manager = self.tokenizer_manager
            return self.loop.iterate(lambda: manager.generate_request(obj))
        return self.loop.call(self._collect(obj))

    async def async_generate(
        self,
        prompt: Prompt = None,
        sampling_params: SamplingArg = None,
        input_ids: InputIds = None,
        return_logprob: bool | list[bool] = False,
        top_logprobs_num: int | list[int] = 0,
        stream: bool = False,
        rid: str | list[str] | None = None,
        logprob_start_len: int | list[int] = -1,
    ) -> Result | list[Result] | AsyncIterator[Result]:
        """`generate` for a coroutine: awaits the result, or (with `stream`) returns an async
        iterator of chunks. Cancelling the awaiting task, or leaving the iteration early,
        aborts the requests."""
        obj = GenerateReqInput(
            text=prompt,
            input_ids=input_ids,
            sampling_params=sampling_params,
            rid=rid,
            return_logprob=return_logprob,
            top_logprobs_num=top_logprobs_num,
            stream=stream,
            logprob_start_len=logprob_start_len,
        )
        if stream:
            manager = self.tokenizer_manager
            return self.loop.iterate_async(lambda: manager.generate_request(obj))
        return await self.loop.call_async(self._collect(obj))

    async def _collect(self, obj: GenerateReqInput) -> Result | list[Result]:
        results = [r async for r in self.tokenizer_manager.generate_request(obj)]
        return results[0] if obj.is_single and len(results) == 1 else results

    # ---- control -------------------------------------------------------------------------------

    def abort_request(self, rid: str) -> bool:
        """Stops request `rid` (its caller gets finish reason `abort`); False if not in flight."""
        return self.loop.call(self.tokenizer_manager.abort_request(rid))

    def flush_cache(self) -> FlushCacheOut:
        """Empties the radix cache; `success` is False while requests run."""
        return self.loop.call(self.tokenizer_manager.flush_cache())

    def get_load(self) -> GetLoadOut:
        """How busy the scheduler is."""
        return self.loop.call(self.tokenizer_manager.get_load())

    def health_check(self) -> HealthCheckOut:
        """Whether the scheduler's loop answers."""
        return self.loop.call(self.tokenizer_manager.health_check())

    # ---- life cycle ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stops the stage processes and the loop; leaves no process or shared memory behind.
        Calls still waiting, and later ones, raise `EngineDeadError`. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        loop, manager, channels = self._loop, self._tokenizer_manager, self._channels
        try:
            if loop is not None and manager is not None:
                loop.call(manager.close())
            if channels is not None:
                self.launcher.stop(channels[0])
        finally:
            self.launcher.close()
            if loop is not None:
                if channels is not None:
                    loop.call(_close_channels(*channels))
                loop.stop()

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()


async def _close_channels(sender: Sender, receiver: Receiver) -> None:
    """Detaches the main process's ring ends (on the loop that watches their doorbells)."""
    sender.close()
    receiver.close()
