"""The detokenizer stage (DESIGN §1): token ids in, text out, stop strings trimmed.

Each `BatchTokenIDOut` from the scheduler carries, per request, the ids produced since its
previous message. A request enters the Rust incremental detokenizer with its first message (its
prompt context ids, `skip_special_tokens` and stop strings ride along) and leaves it with its
finished message (`finished_reasons[i]` set: finished, aborted, or stopped by the scheduler), so
no state outlives a request. The `BatchStrOut` sent on carries only the text each message added.

When a stop string ends the text, the request's finish reason says so (`stop`, `matched` the
string), whatever the scheduler reported: the text the client sees ended there. Replies of the
scheduler to control messages are forwarded to the main process as frames, unread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection

from srt.io_struct import (
    BatchStrOut,
    BatchTokenIDOut,
    FinishReason,
    FlushCacheOut,
    GetLoadOut,
    HealthCheckOut,
    ShutdownReq,
)
from srt.ipc.channel import Receiver, Sender
from srt.ipc.codec import decode, message_type
from srt.ipc.rings import RingNames
from srt.managers.hf_tokenizer import tokenizer_files
from srt.managers.incremental_detokenizer import IncrementalDetokenizer
from srt.managers.stage_process import Stage, run_stage
from srt.server_args import ServerArgs

Handler = Callable[[bytes], Awaitable[None]]


class DetokenizerManager(Stage):
    """Receives on ring "detokenizer", sends on ring "tokenizer"."""

    def __init__(self, server_args: ServerArgs, rings: RingNames) -> None:
        self.init_detokenizer(server_args)
        self.init_channels(rings)
        self.init_dispatch()

    def init_detokenizer(self, server_args: ServerArgs) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer_files(server_args))
        # Requests whose text a stop string ended, until their finished message passes.
        self.matched_stops: dict[str, str] = {}

    def init_channels(self, rings: RingNames) -> None:
        self.recv_from_scheduler = Receiver(rings.detokenizer)
        self.send_to_tokenizer = Sender(rings.tokenizer)

    def init_dispatch(self) -> None:
        # Handlers take the frame: the scheduler's replies to control messages go on to the main
        # process without being decoded here.
        self.handlers: dict[type, Handler] = {
            BatchTokenIDOut: self.handle_batch_token_id_out,
            FlushCacheOut: self.forward,
            GetLoadOut: self.forward,
            HealthCheckOut: self.forward,
            ShutdownReq: self.handle_shutdown,
        }
        self.running = True

    async def event_loop(self) -> None:
        """Serves until the `ShutdownReq` the scheduler passes on."""
        while self.running:
            frame = await self.recv_from_scheduler.recv_frame()
            kind = message_type(frame)
            handler = self.handlers.get(kind)
            if handler is None:
                raise TypeError(f"the detokenizer cannot handle {kind.__name__}")
            await handler(frame)

    async def handle_batch_token_id_out(self, frame: bytes) -> None:
        batch = decode(frame)
        assert isinstance(batch, BatchTokenIDOut)
        await self.send_to_tokenizer.send(self.detokenize(batch))

    async def forward(self, frame: bytes) -> None:
        await self.send_to_tokenizer.send_frame(frame)

    async def handle_shutdown(self, frame: bytes) -> None:
        self.running = False

    def detokenize(self, batch: BatchTokenIDOut) -> BatchStrOut:
        """The text each entry of `batch` adds; frees the requests that `batch` finishes."""
        detok = self.detokenizer
        for i, rid in enumerate(batch.rids):
            if rid not in detok:
                detok.add_request(
                    rid,
                    prompt_ids=batch.context_ids[i],
                    skip_special_tokens=batch.skip_special_tokens[i],
                    spaces_between_special_tokens=batch.spaces_between_special_tokens[i],
                    stop=batch.stop[i],
                    include_stop_str_in_output=batch.no_stop_trim[i],
                )
        stepped = detok.step_batch(batch.rids, batch.output_ids)
        texts = stepped.texts
        reasons = list(batch.finished_reasons)
        for i, rid in enumerate(batch.rids):
            matched = stepped.matched_stops[i]
            reason = reasons[i]
            if reason is not None:
                final = detok.finish(rid)
                texts[i] += final.text
                matched = matched or final.matched_stop
                detok.free(rid)
            if matched is not None:
                self.matched_stops[rid] = matched
            if reason is not None:
                stop = self.matched_stops.pop(rid, None)
                if stop is not None:
                    reasons[i] = FinishReason("stop", matched_str=stop)
        return BatchStrOut(
            rids=batch.rids,
            output_strs=tuple(texts),
            output_ids=batch.output_ids,
            finished_reasons=tuple(reasons),
            prompt_tokens=batch.prompt_tokens,
            completion_tokens=batch.completion_tokens,
            cached_tokens=batch.cached_tokens,
            output_logprobs=batch.output_logprobs,
            output_top_logprobs=batch.output_top_logprobs,
            input_token_logprobs=batch.input_token_logprobs,
            input_top_logprobs=batch.input_top_logprobs,
        )


def run_detokenizer_process(
    server_args: ServerArgs, rings: RingNames, parent_pid: int, ready: Connection
) -> None:
    """Entry point of the detokenizer process (started by the launcher with `spawn`)."""
    run_stage(
        "detokenizer",
        rings,
        parent_pid,
        ready,
        lambda: DetokenizerManager(server_args, rings),
        server_args.log_level,
    )
