"""The TokenizerManager (docs/design.md §1-2), in the main process: requests in, results out.

It validates, chat-templates and tokenizes each request (`request_tokenizer`), sends a
`TokenizedGenerateReq` on ring "scheduler", and keeps one `ReqState` (`req_state`) per request id
in flight. One receive loop reads ring "tokenizer" and routes each `BatchStrOut` entry to its state
(and the scheduler's replies to control messages to the caller waiting for them); callers of
`generate_request` wait on their states' event and get the results their states build.

Behind the gRPC entrance (`--grpc-mode`) no detokenizer runs: the loop reads the scheduler's own
ring and takes `BatchTokenIDOut`s, whose entries bring ids without text (requests come as ids
too, so nothing here tokenizes or detokenizes them), and the `ShutdownReq` the scheduler passes
on when the server stops.

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
from typing import Any, TypeVar

from srt.io_struct import (
    AbortReq,
    BatchStrOut,
    BatchTokenIDOut,
    FlushCacheOut,
    FlushCacheReq,
    GetLoadOut,
    GetLoadReq,
    HealthCheckOut,
    HealthCheckReq,
    Message,
    ShutdownReq,
    TokenizedGenerateReq,
)
from srt.ipc.channel import Receiver, Sender
from srt.ipc.codec import decode
from srt.managers.generate_req_input import GenerateReqInput, ReqInput, expand
from srt.managers.metrics import TokenizerMetrics
from srt.managers.req_state import ReqState
from srt.managers.request_report import RequestReporter
from srt.managers.request_times import RequestTimes
from srt.managers.request_tokenizer import RequestTokenizer
from srt.managers.tracing import RequestTracer
from srt.request_limits import RequestError, RequestLimits
from srt.server_args import ServerArgs

# How long a broken ring waits for the launcher's word on which stage died and why.
DEATH_REPORT_WAIT_S = 5.0
# Samples built or sent between two yields to the event loop: each is tokenized, checked and
# encoded on its own (up to ~0.5 ms with a long prompt and a full logit_bias), so a request of
# --max-samples-per-request samples would otherwise hold every other request and /health for
# a large fraction of a second.
YIELD_EVERY = 16

ControlReq = FlushCacheReq | GetLoadReq | HealthCheckReq
Reply = TypeVar("Reply", FlushCacheOut, GetLoadOut, HealthCheckOut)


class EngineDeadError(RuntimeError):
    """A stage process stopped (or the engine shut down): no request can complete."""


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
        self.init_metrics()

    def init_tokenizer(self) -> None:
        self.request_tokenizer = RequestTokenizer(self.server_args)
        self.tokenizer = self.request_tokenizer.tokenizer
        self.context_length = self.request_tokenizer.context_length
        self.vocab_size = self.request_tokenizer.vocab_size
        self.limits = RequestLimits.of(self.server_args)

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
            BatchStrOut: self.handle_batch_out,
            BatchTokenIDOut: self.handle_batch_out,
            FlushCacheOut: self.handle_reply,
            GetLoadOut: self.handle_reply,
            HealthCheckOut: self.handle_reply,
            ShutdownReq: lambda msg: None,  # --grpc-mode: the stages are stopping, as asked
        }

    def init_metrics(self) -> None:
        """`self.metrics`: the Prometheus metrics with `--enable-metrics`, else None; with them,
        final results carry their stage times in `meta_info` (as SGLang's do). `self.reporter`
        logs, counts and (with `--enable-trace`) traces each finished request."""
        args = self.server_args
        self.metrics: TokenizerMetrics | None = None
        if args.enable_metrics:
            self.metrics = TokenizerMetrics(str(args.served_model_name), args.metrics_name_prefix)
        self.timing_in_meta = args.enable_metrics
        tracer = RequestTracer(args.otlp_traces_endpoint) if args.enable_trace else None
        self.reporter = RequestReporter(self.metrics, args.log_requests, tracer)

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
        self.reporter.close()

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

    def handle_batch_out(self, out: BatchStrOut | BatchTokenIDOut) -> None:
        """Appends each entry of `out` to its request's state: text and ids from the
        detokenizer, or ids alone from the scheduler (`--grpc-mode`)."""
        now = time.perf_counter()
        texts = out.output_strs if isinstance(out, BatchStrOut) else None
        # Without a detokenizer, its point is when this process read the finished message.
        detokenized_at = out.detokenized_at if isinstance(out, BatchStrOut) else time.time()
        for stats in out.time_stats:
            finishing = self.rid_to_state.get(out.rids[stats.index])
            if finishing is not None:
                finishing.times.absorb(stats, detokenized_at)
        for i, rid in enumerate(out.rids):
            state = self.rid_to_state.get(rid)
            if state is None:  # a stray message of a request already failed
                continue
            if texts is not None:
                state.pieces.append(texts[i])
            state.output_ids.extend(out.output_ids[i])
            state.completion_tokens = out.completion_tokens[i]
            state.cached_tokens = out.cached_tokens[i]
            if state.req.return_logprob:
                state.output_logprobs.extend(out.output_logprobs[i])
                state.output_top_logprobs.extend(out.output_top_logprobs[i])
                state.input_token_logprobs.extend(out.input_token_logprobs[i])
                state.input_top_logprobs.extend(out.input_top_logprobs[i])
            if out.output_ids[i]:
                self.on_tokens(state, len(out.output_ids[i]), now)
            reason = out.finished_reasons[i]
            if reason is not None:
                state.finish_reason = reason
                state.finished_at = now
                del self.rid_to_state[rid]
                if state.abandoned:  # no caller will build its answer
                    self.reporter.report(state)
            state.notify.set()

    def on_tokens(self, state: ReqState, count: int, now: float) -> None:
        if self.metrics is not None:
            first = state.last_token_at is None
            since = state.created if state.last_token_at is None else state.last_token_at
            self.metrics.observe_tokens(count, now - since, first, state.req.stream)
        state.last_token_at = now

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

        Raises `RequestError` (a ValueError naming the field) for a malformed, too large or too
        long request (before anything is sent) or a request id already in flight,
        `EngineDeadError` when the pipeline is gone."""
        created, received = time.perf_counter(), time.time()
        self.check_alive()
        reqs = expand(obj, self.limits)
        tokenized = await self.tokenize(reqs)
        self.check_alive()  # the pipeline may have gone while tokenizing
        self.check_new_rids(reqs)
        indexed = obj.stream and (not obj.is_single or len(reqs) > 1)
        notify = asyncio.Event()
        at = time.time()
        states = [
            ReqState(req, tok.input_ids, notify, RequestTimes(received, tokenized=at), created)
            for req, tok in zip(reqs, tokenized, strict=True)
        ]
        for state in states:  # all ids taken before the first send may wait
            self.rid_to_state[state.req.rid] = state
        try:
            for i, (state, tok) in enumerate(zip(states, tokenized, strict=True)):
                if i and i % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                # Stamped before: the scheduler may read it before `send` returns.
                state.times.sent = time.time()
                await self.send(tok)
                state.sent = True
            if obj.stream:
                async for chunk in self.stream_results(states, indexed):
                    yield chunk
            else:
                await self.wait_finished(states)
                for state in states:
                    yield self.answer(state, indexed, stream=False)
        finally:
            await self.abandon(states)

    async def tokenize(self, reqs: list[ReqInput]) -> list[TokenizedGenerateReq]:
        """`reqs` tokenized and checked, `YIELD_EVERY` at a time with a yield to the event loop
        in between (nothing is registered or sent yet, so nothing can change under them)."""
        out: list[TokenizedGenerateReq] = []
        for start in range(0, len(reqs), YIELD_EVERY):
            if start:
                await asyncio.sleep(0)
            out += self.request_tokenizer.tokenize(reqs[start : start + YIELD_EVERY])
        return out

    def check_new_rids(self, reqs: list[ReqInput]) -> None:
        seen: set[str] = set()
        for req in reqs:
            if req.rid in self.rid_to_state or req.rid in seen:
                raise RequestError(f"request id {req.rid!r} is already in flight", "rid")
            seen.add(req.rid)

    async def stream_results(
        self, states: list[ReqState], indexed: bool
    ) -> AsyncIterator[dict[str, Any]]:
        while not all(s.done for s in states):
            await self.wait_news(states)
            for state in states:
                if state.has_news:
                    yield self.answer(state, indexed, stream=True)

    async def wait_finished(self, states: list[ReqState]) -> None:
        while not all(s.finished for s in states):
            await self.wait_news(states)

    async def wait_news(self, states: list[ReqState]) -> None:
        notify = states[0].notify
        await notify.wait()
        notify.clear()
        self.check_alive()

    def answer(self, state: ReqState, indexed: bool, stream: bool) -> dict[str, Any]:
        """`state.result`; the final one also reports the request (log line, metrics)."""
        out = state.result(indexed, stream, self.timing_in_meta)
        if state.done:
            self.reporter.report(state)
        return out

    async def abandon(self, states: list[ReqState]) -> None:
        """Aborts the requests of a call that ends before they finish (client gone, error);
        reports those that finished unanswered."""
        for state in states:
            rid = state.req.rid
            if state.finished:
                self.reporter.report(state)
                continue
            if self.rid_to_state.get(rid) is not state:
                continue
            if self.dead is not None or not state.sent:
                del self.rid_to_state[rid]
                continue
            state.abandoned = True
            with contextlib.suppress(EngineDeadError):
                await self.send(AbortReq(rid))

    def check_ids(self, ids: list[int] | tuple[int, ...], what: str) -> None:
        """RequestError (for field `what`) if `ids` hold an id outside the vocabulary."""
        self.request_tokenizer.check_ids(ids, what)

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
