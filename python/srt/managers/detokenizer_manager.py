"""The detokenizer stage (docs/design.md §1): token ids in, text out, cut where the scheduler says.

Each `BatchTokenIDOut` from the scheduler carries, per request, the ids produced since its
previous message. A request enters the Rust incremental detokenizer with its first message
(whose `DetokenizeSettings` give its prompt context ids, `skip_special_tokens`, `no_stop_trim`
and stop strings) and leaves it with its finished message (`finished_reasons[i]` set), so no
state outlives a request. The `BatchStrOut` sent on carries only the text each message added.

Stop strings are the scheduler's to find (`srt.managers.stop_strings`): a request it stopped on
one has a finish reason with the string and its offset in the output text, and the text ends
there (after it with `no_stop_trim`). Until then, text that could still begin a stop string is
held back, so a stream never shows what the cut removes. Replies of the scheduler to control
messages are forwarded to the main process as frames, unread.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

from srt.io_struct import (
    BatchStrOut,
    BatchTokenIDOut,
    DetokenizeSettings,
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
from srt.managers.stop_strings import held_back
from srt.server_args import ServerArgs

Handler = Callable[[bytes], Awaitable[None]]


@dataclass
class _StopText:
    """The text of a request with stop strings, between its first and its finished message."""

    settings: DetokenizeSettings
    sent: int = 0  # characters sent on
    held: str = ""  # characters after those, held back: they could begin a stop string

    def cut(self, text: str, reason: FinishReason | None) -> str:
        """What of `text` (the text decoded since the last message) may be sent on now."""
        text = self.held + text
        if reason is None:
            keep = len(text) - held_back(text, self.settings.stop)
            self.held = text[keep:]
        elif reason.matched_str is not None and reason.matched_offset >= 0:
            keep = reason.matched_offset - self.sent
            if self.settings.no_stop_trim:
                keep += len(reason.matched_str)
        else:
            keep = len(text)
        self.sent += keep
        return text[:keep]


class DetokenizerManager(Stage):
    """Receives on ring "detokenizer", sends on ring "tokenizer"."""

    def __init__(self, server_args: ServerArgs, rings: RingNames) -> None:
        self.init_detokenizer(server_args)
        self.init_channels(rings)
        self.init_dispatch()

    def init_detokenizer(self, server_args: ServerArgs) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer_files(server_args))
        # Requests with stop strings, until their finished message passes.
        self.stop_texts: dict[str, _StopText] = {}

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
        for rid, settings in zip(batch.rids, batch.settings, strict=True):
            if settings is not None:
                detok.add_request(
                    rid,
                    prompt_ids=settings.context_ids,
                    skip_special_tokens=settings.skip_special_tokens,
                )
                if settings.stop:
                    self.stop_texts[rid] = _StopText(settings)
        texts = detok.step_batch(batch.rids, batch.output_ids)
        for i, rid in enumerate(batch.rids):
            reason = batch.finished_reasons[i]
            if reason is not None:
                texts[i] += detok.finish(rid)
                detok.free(rid)
            stop_text = self.stop_texts.get(rid)
            if stop_text is not None:
                texts[i] = stop_text.cut(texts[i], reason)
                if reason is not None:
                    del self.stop_texts[rid]
        return BatchStrOut(
            rids=batch.rids,
            output_strs=tuple(texts),
            output_ids=batch.output_ids,
            finished_reasons=batch.finished_reasons,
            prompt_tokens=batch.prompt_tokens,
            completion_tokens=batch.completion_tokens,
            cached_tokens=batch.cached_tokens,
            output_logprobs=batch.output_logprobs,
            output_top_logprobs=batch.output_top_logprobs,
            input_token_logprobs=batch.input_token_logprobs,
            input_top_logprobs=batch.input_top_logprobs,
            time_stats=batch.time_stats,
            # Only finishing requests need it: a step that finishes none pays no clock read.
            detokenized_at=time.time() if batch.time_stats else 0.0,
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
