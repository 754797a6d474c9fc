"""The detokenizer stage (DESIGN §1). For now a thin stage on the real wiring: it decodes each
batch's new token ids with the model's `tokenizer.json` and passes the scheduler's replies to
control messages on to the main process unchanged. Incremental detokenization (Rust) and
stop-string trimming replace the plain decode in the next issues.
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from pathlib import Path

from tokenizers import Tokenizer

from srt.io_struct import (
    BatchStrOut,
    BatchTokenIDOut,
    FlushCacheOut,
    GetLoadOut,
    HealthCheckOut,
    ShutdownReq,
)
from srt.ipc.channel import Receiver, Sender
from srt.ipc.codec import decode, message_type
from srt.ipc.rings import RingNames
from srt.managers.stage_process import Stage, run_stage
from srt.server_args import ServerArgs

# Replies of the scheduler that ride ring "detokenizer" and go on to the main process as frames.
FORWARDED = (FlushCacheOut, GetLoadOut, HealthCheckOut)


def load_tokenizer(server_args: ServerArgs) -> Tokenizer:
    """The fast tokenizer of `--tokenizer-path` (or the model directory)."""
    path = server_args.tokenizer_path or server_args.model_path
    if path is None:
        raise ValueError("the detokenizer needs --tokenizer-path or --model-path")
    return Tokenizer.from_file(str(Path(path) / "tokenizer.json"))


class DetokenizerManager(Stage):
    """Receives on ring "detokenizer", sends on ring "tokenizer"."""

    def __init__(self, server_args: ServerArgs, rings: RingNames) -> None:
        self.tokenizer = load_tokenizer(server_args)
        self.recv_from_scheduler = Receiver(rings.detokenizer)
        self.send_to_tokenizer = Sender(rings.tokenizer)

    async def event_loop(self) -> None:
        """Serves until the `ShutdownReq` the scheduler passes on."""
        while True:
            frame = await self.recv_from_scheduler.recv_frame()
            kind = message_type(frame)
            if kind in FORWARDED:
                await self.send_to_tokenizer.send_frame(frame)
                continue
            msg = decode(frame)
            if isinstance(msg, ShutdownReq):
                return
            if not isinstance(msg, BatchTokenIDOut):
                raise TypeError(f"the detokenizer cannot handle {kind.__name__}")
            await self.send_to_tokenizer.send(self.detokenize(msg))

    def detokenize(self, batch: BatchTokenIDOut) -> BatchStrOut:
        texts = [
            self.tokenizer.decode(list(ids), skip_special_tokens=skip)
            for ids, skip in zip(batch.output_ids, batch.skip_special_tokens, strict=True)
        ]
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
        )


def run_detokenizer_process(
    server_args: ServerArgs, rings: RingNames, parent_pid: int, ready: Connection
) -> None:
    """Entry point of the detokenizer process (started by the launcher with `spawn`)."""
    run_stage(
        "detokenizer", rings, parent_pid, ready, lambda: DetokenizerManager(server_args, rings)
    )
