"""The TokenizerManager (DESIGN §1-2), in the main process: requests in, results out.

It tokenizes and validates each request, sends a `TokenizedGenerateReq` on ring "scheduler",
and keeps one `ReqState` per request id in flight. One receive loop reads ring "tokenizer" and
routes each `BatchStrOut` entry to its state (and the scheduler's replies to control messages to
the caller waiting for them); callers of `generate_request` wait on their states' event.

Everything runs on one asyncio loop: the one `start` is called on (the HTTP server's, or the
Engine's background thread). No HTTP here: the HTTP server and the offline Engine share this.

Life of a request id: registered when its request is sent, removed when its finished message
arrives. A caller that goes away early (its task cancelled, its generator closed) sends an
`AbortReq`; the state stays until the scheduler's final message for it, so the id cannot be
reused while the scheduler still holds it. If a stage process dies, `fail` ends every waiting
call, and every later one, with `EngineDeadError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from srt.io_struct import (
    AbortReq,
    BatchStrOut,
    FinishReason,
    FlushCacheOut,
    FlushCacheReq,
    GetLoadOut,
    GetLoadReq,
    HealthCheckOut,
    HealthCheckReq,
    Message,
    TokenizedGenerateReq,
)
from srt.ipc.channel import Receiver, Sender
from srt.ipc.codec import decode
from srt.managers.generate_req_input import GenerateReqInput, ReqInput, expand
from srt.managers.hf_tokenizer import load_tokenizer
from srt.model_executor.model_config import ModelConfig
from srt.sampling_params import SamplingParams
from srt.server_args import ServerArgs

# How long a broken ring waits for the launcher's word on which stage died and why.
DEATH_REPORT_WAIT_S = 5.0

ControlReq = FlushCacheReq | GetLoadReq | HealthCheckReq
Reply = TypeVar("Reply", FlushCacheOut, GetLoadOut, HealthCheckOut)


class EngineDeadError(RuntimeError):
    """A stage process stopped (or the engine shut down): no request can complete."""


@dataclass(eq=False)
class ReqState:
    """One request id in flight, as the receive loop updates it."""

    req: ReqInput
    prompt_tokens: int
    notify: asyncio.Event
    """Shared by the requests of one `generate_request` call: set on every update."""
    created: float = field(default_factory=time.perf_counter)
    pieces: list[str] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: FinishReason | None = None
    finished_at: float | None = None
    # What a stream has yielded so far: pieces and ids, and whether its last chunk went out.
    pieces_sent: int = 0
    ids_sent: int = 0
    done: bool = False
    sent: bool = False
    """Whether the scheduler got the request (else nothing of it can come back)."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def has_news(self) -> bool:
        """Whether a stream has something to yield (new ids, or the finish)."""
        return len(self.output_ids) > self.ids_sent or (self.finished and not self.done)


class TokenizerManager:
    """Tokenizes requests, sends them to the scheduler and hands their results back."""

    def __init__(
        self, server_args: ServerArgs, send_to_scheduler: Sender, recv_from_detokenizer: Receiver
    ) -> None:
        self.server_args = server_args
        self.init_tokenizer()
        self.init_channels(send_to_scheduler, recv_from_detokenizer)
        self.init_state()
        self.init_dispatch()

    def init_tokenizer(self) -> None:
        args = self.server_args
        if args.model_path is None:
            raise ValueError("the tokenizer manager needs --model-path")
        self.tokenizer = load_tokenizer(args)
        config = ModelConfig.load(
            args.model_path,
            args.dtype,
            torch.device("cpu"),
            context_length=args.context_length,
            trust_remote_code=args.trust_remote_code,
        )
        self.context_length = config.context_length
        # Ids the model can embed and the detokenizer can decode.
        self.vocab_size = min(len(self.tokenizer), config.vocab_size)

    def init_channels(self, sender: Sender, receiver: Receiver) -> None:
        self.send_to_scheduler = sender
        self.recv_from_detokenizer = receiver
        self.sending = 0  # callers in the slow (ring full) path of `send`
        self.send_lock: asyncio.Lock | None = None

    def init_state(self) -> None:
        self.rid_to_state: dict[str, ReqState] = {}
        self.pending_replies: dict[str, asyncio.Future[Any]] = {}
        self.dead: str | None = None
        self.tasks: list[asyncio.Future[Any]] = []

    def init_dispatch(self) -> None:
        self.handlers: dict[type, Callable[[Any], None]] = {
            BatchStrOut: self.handle_batch_str_out,
            FlushCacheOut: self.handle_reply,
            GetLoadOut: self.handle_reply,
            HealthCheckOut: self.handle_reply,
        }

    # ---- life cycle --------------------------------------------------------------------------

    def start(self, stage_exit: Awaitable[str] | None = None) -> None:
        """Starts the receive loop on the running event loop. `stage_exit`, when given, resolves
        to why a stage process ended; every request then fails with `EngineDeadError`."""
        if self.tasks:
            raise RuntimeError("the tokenizer manager is already started")
        self.send_lock = asyncio.Lock()
        self.tasks.append(asyncio.ensure_future(self.handle_loop()))
        if stage_exit is not None:
            self.tasks.append(asyncio.ensure_future(self.watch_stages(stage_exit)))

    async def close(self) -> None:
        """Stops the loops; calls still waiting fail with `EngineDeadError`. Idempotent."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.fail("the engine was shut down")

    def fail(self, reason: str) -> None:
        """Ends every waiting call, and every later one, with `EngineDeadError(reason)` (the
        first reason given wins)."""
        if self.dead is None:
            self.dead = reason
        for state in self.rid_to_state.values():
            state.notify.set()
        self.rid_to_state.clear()
        for future in self.pending_replies.values():
            if not future.done():
                future.set_exception(EngineDeadError(self.dead))
        self.pending_replies.clear()

    @property
    def num_in_flight(self) -> int:
        """Requests sent or about to be, whose final result has not arrived."""
        return len(self.rid_to_state)

    def check_alive(self) -> None:
        if self.dead is not None:
            raise EngineDeadError(self.dead)

    async def watch_stages(self, stage_exit: Awaitable[str]) -> None:
        self.fail(await stage_exit)

    # ---- receiving -----------------------------------------------------------------------------

    async def handle_loop(self) -> None:
        """Routes every message from the detokenizer until the ring breaks."""
        receiver = self.recv_from_detokenizer
        try:
            while True:
                frames = [await receiver.recv_frame(), *receiver.recv_frames_nowait()]
                for frame in frames:
                    self.dispatch(decode(frame))
        except BrokenPipeError:
            # A stage died: give the launcher's watch a moment to say which and why.
            watchers = self.tasks[1:]
            if watchers:
                await asyncio.wait(watchers, timeout=DEATH_REPORT_WAIT_S)
            self.fail("the detokenizer process stopped sending results")
        except Exception as e:
            self.fail(f"the tokenizer manager's receive loop failed: {e!r}")
            raise

    def dispatch(self, msg: Message) -> None:
        handler = self.handlers.get(type(msg))
        if handler is None:
            raise TypeError(f"the tokenizer manager cannot handle {type(msg).__name__}")
        handler(msg)

    def handle_batch_str_out(self, out: BatchStrOut) -> None:
        for i, rid in enumerate(out.rids):
            state = self.rid_to_state.get(rid)
            if state is None:  # a stray message of a request already failed
                continue
            state.pieces.append(out.output_strs[i])
            state.output_ids.extend(out.output_ids[i])
            state.completion_tokens = out.completion_tokens[i]
            state.cached_tokens = out.cached_tokens[i]
            if state.req.return_logprob:
                state.output_logprobs.extend(out.output_logprobs[i])
                state.output_top_logprobs.extend(out.output_top_logprobs[i])
            reason = out.finished_reasons[i]
            if reason is not None:
                state.finish_reason = reason
                state.finished_at = time.perf_counter()
                del self.rid_to_state[rid]
            state.notify.set()

    def handle_reply(self, reply: FlushCacheOut | GetLoadOut | HealthCheckOut) -> None:
        future = self.pending_replies.pop(reply.rid, None)
        if future is not None and not future.done():
            future.set_result(reply)

    # ---- sending -------------------------------------------------------------------------------

    async def send(self, msg: Message) -> None:
        """Sends in call order; waits (in order) while ring "scheduler" is full."""
        if self.sending == 0 and self.send_to_scheduler.try_send(msg):
            return
        if self.send_lock is None:
            raise RuntimeError("the tokenizer manager is not started")
        self.sending += 1
        try:
            async with self.send_lock:
                await self.send_to_scheduler.send(msg)
        except BrokenPipeError as e:
            raise EngineDeadError(self.dead or "the scheduler process is gone") from e
        finally:
            self.sending -= 1

    # ---- generate ------------------------------------------------------------------------------

    async def generate_request(self, obj: GenerateReqInput) -> AsyncGenerator[dict[str, Any], None]:
        """SGLang-shaped results of `obj`: with `obj.stream`, chunks as they come (each with
        the text and ids added since the previous chunk of its request; `finish_reason` set on
        its last); else one final dict per request, in order. Chunks of a batch or of `n` > 1
        samples carry the `index` of their request (see `expand`).

        Raises ValueError for a malformed or too long request (before anything is sent) or a
        request id already in flight, `EngineDeadError` when the pipeline is gone."""
        self.check_alive()
        reqs = expand(obj)
        tokenized = self.tokenize(reqs)
        self.check_new_rids(reqs)
        indexed = obj.stream and (not obj.is_single or len(reqs) > 1)
        notify = asyncio.Event()
        states = [
            ReqState(req, len(tok.input_ids), notify)
            for req, tok in zip(reqs, tokenized, strict=True)
        ]
        for state in states:  # all ids taken before the first send may wait
            self.rid_to_state[state.req.rid] = state
        try:
            for state, tok in zip(states, tokenized, strict=True):
                await self.send(tok)
                state.sent = True
            if obj.stream:
                async for chunk in self.stream_results(states, indexed):
                    yield chunk
            else:
                await self.wait_finished(states)
                for state in states:
                    yield self.result(state, indexed, stream=False)
        finally:
            await self.abandon(states)

    def check_new_rids(self, reqs: list[ReqInput]) -> None:
        seen: set[str] = set()
        for req in reqs:
            if req.rid in self.rid_to_state or req.rid in seen:
                raise ValueError(f"request id {req.rid!r} is already in flight")
            seen.add(req.rid)

    async def stream_results(
        self, states: list[ReqState], indexed: bool
    ) -> AsyncIterator[dict[str, Any]]:
        while not all(s.done for s in states):
            await self.wait_news(states)
            for state in states:
                if state.has_news:
                    yield self.result(state, indexed, stream=True)

    async def wait_finished(self, states: list[ReqState]) -> None:
        while not all(s.finished for s in states):
            await self.wait_news(states)

    async def wait_news(self, states: list[ReqState]) -> None:
        notify = states[0].notify
        await notify.wait()
        notify.clear()
        self.check_alive()

    async def abandon(self, states: list[ReqState]) -> None:
        """Aborts the requests of a call that ends before they finish (client gone, error)."""
        for state in states:
            rid = state.req.rid
            if state.finished or self.rid_to_state.get(rid) is not state:
                continue
            if self.dead is not None or not state.sent:
                del self.rid_to_state[rid]
                continue
            with contextlib.suppress(EngineDeadError):
                await self.send(AbortReq(rid))

    def result(self, state: ReqState, indexed: bool, stream: bool) -> dict[str, Any]:
        """The SGLang-shaped dict of a request: all of it, or (stream) what is new since the
        previous chunk."""
        start_piece = state.pieces_sent if stream else 0
        start_id = state.ids_sent if stream else 0
        ids = state.output_ids[start_id:]
        state.pieces_sent = len(state.pieces)
        state.ids_sent = len(state.output_ids)
        state.done = state.finished
        end = state.finished_at if state.finished_at is not None else time.perf_counter()
        reason = state.finish_reason
        meta: dict[str, Any] = {
            "id": state.req.rid,
            "prompt_tokens": state.prompt_tokens,
            "completion_tokens": state.completion_tokens,
            "cached_tokens": state.cached_tokens,
            "finish_reason": reason.to_json() if reason is not None else None,
            "e2e_latency": end - state.created,
        }
        if state.req.return_logprob:
            meta["output_token_logprobs"] = [
                (logprob, token, None)
                for logprob, token in zip(state.output_logprobs[start_id:], ids, strict=False)
            ]
            meta["output_top_logprobs"] = [
                [(logprob, token, None) for token, logprob in top]
                for top in state.output_top_logprobs[start_id:]
            ]
        out: dict[str, Any] = {
            "text": "".join(state.pieces[start_piece:]),
            "output_ids": ids,
            "meta_info": meta,
        }
        if indexed:
            out["index"] = state.req.index
        return out

    # ---- tokenization and validation ---------------------------------------------------------

    def tokenize(self, reqs: list[ReqInput]) -> list[TokenizedGenerateReq]:
        """Tokenized, validated requests (ValueError for the first bad one)."""
        texts = sorted({r.text for r in reqs if r.text is not None})
        encoded = self.tokenizer(texts)["input_ids"] if texts else []
        ids_of = dict(zip(texts, encoded, strict=True))
        out = []
        for req in reqs:
            if req.input_ids is not None:
                ids = req.input_ids
                self.check_ids(ids, "input_ids")
            else:
                assert req.text is not None
                ids = ids_of[req.text]
            out.append(self.build_req(req, ids))
        return out

    def build_req(self, req: ReqInput, ids: list[int]) -> TokenizedGenerateReq:
        if not ids or req.text == "":
            raise ValueError("the prompt is empty")
        kwargs = dict(req.sampling_kwargs)
        if kwargs.get("max_new_tokens", 0) is None:
            kwargs["max_new_tokens"] = max(self.context_length - len(ids), 0)
        params = SamplingParams(**kwargs)
        self.check_ids(params.stop_token_ids, "stop_token_ids")
        self.check_ids([token for token, _ in params.logit_bias], "logit_bias")
        total = len(ids) + params.max_new_tokens
        if len(ids) >= self.context_length:
            raise ValueError(
                f"the prompt has {len(ids)} tokens, which leaves no room for output in the "
                f"context length of {self.context_length} tokens"
            )
        if total > self.context_length:
            raise ValueError(
                f"the prompt has {len(ids)} tokens and max_new_tokens is "
                f"{params.max_new_tokens}: {total} tokens exceed the context length of "
                f"{self.context_length} tokens"
            )
        return TokenizedGenerateReq(
            rid=req.rid,
            input_text=req.text or "",
            input_ids=tuple(ids),
            sampling_params=params,
            stream=req.stream,
            return_logprob=req.return_logprob,
            top_logprobs_num=req.top_logprobs_num,
        )

    def check_ids(self, ids: list[int] | tuple[int, ...], what: str) -> None:
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(
                f"{what} holds token id {bad}, outside the vocabulary [0, {self.vocab_size})"
            )

    # ---- control -------------------------------------------------------------------------------

    async def abort_request(self, rid: str) -> bool:
        """Asks the scheduler to stop request `rid`; False if it is not in flight. Its caller
        gets the request's final result, with finish reason `abort`."""
        if rid == "" or rid not in self.rid_to_state:
            return False
        await self.send(AbortReq(rid))
        return True

    async def abort_all(self) -> None:
        """Asks the scheduler to stop every request."""
        self.check_alive()
        await self.send(AbortReq(""))

    async def flush_cache(self) -> FlushCacheOut:
        """Empties the radix cache (the scheduler refuses while requests run)."""
        return await self.control(FlushCacheReq, FlushCacheOut)

    async def get_load(self) -> GetLoadOut:
        """How busy the scheduler is."""
        return await self.control(GetLoadReq, GetLoadOut)

    async def health_check(self) -> HealthCheckOut:
        """Whether the scheduler's loop answers."""
        return await self.control(HealthCheckReq, HealthCheckOut)

    async def control(self, request: type[ControlReq], reply: type[Reply]) -> Reply:
        """Sends control message `request` (with a fresh id) and waits for its `reply`."""
        self.check_alive()
        rid = f"{request.__name__}-{uuid.uuid4().hex}"
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending_replies[rid] = future
        try:
            await self.send(request(rid))
            answer = await future
        finally:
            self.pending_replies.pop(rid, None)
        if not isinstance(answer, reply):
            raise TypeError(f"{request.__name__} got {type(answer).__name__} back")
        return answer
