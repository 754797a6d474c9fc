"""The scheduler's side of tensor parallelism (`--tp-size`), as SGLang runs it: one scheduler
process per rank, each with its own `Scheduler` and `ModelRunner` shard. Rank 0 alone reads ring
"scheduler" and writes ring "detokenizer"; each loop iteration it broadcasts the messages it
took (`RankSync.share`) and every rank handles the same messages in the same order, so every
rank's scheduler makes the same decisions from the same state and runs the same batches, whose
collectives then meet. What else could set ranks apart is made equal: the sampling seed (rank
0's, `join`), each sampled token (rank 0's, `SamplingStates.sync_ids`) and when a grammar is
ready (every rank waits for its compile, `ModelRunner.grammar_status`).

The messages travel as the rings carry them (`ipc.codec` frames, each after its length), never
pickled. The broadcast waits in a worker thread so that the stage's event loop still sees
SIGTERM and its launcher's exit while rank 0 is idle.
"""

from __future__ import annotations

import asyncio
import random
import struct

from srt.distributed import TPGroup, get_tp_group, init_tensor_parallel
from srt.io_struct import Message
from srt.ipc import codec
from srt.server_args import ServerArgs

_LENGTH = struct.Struct("<I")


def join(server_args: ServerArgs, tp_rank: int, device_type: str) -> tuple[ServerArgs, TPGroup]:
    """Joins the ranks of `--tp-size` as `tp_rank` (nothing to join for one); returns the
    arguments every rank runs with (rank 0's sampling seed, or one rank 0 drew) and the group."""
    if server_args.tp_size == 1:
        return server_args, get_tp_group()
    addr = server_args.dist_init_addr
    if addr is None:
        raise ValueError("tensor-parallel ranks need --dist-init-addr (the launcher sets one)")
    per_node = server_args.tp_size // server_args.nnodes
    group = init_tensor_parallel(
        tp_rank, server_args.tp_size, addr, device_type, local_rank=tp_rank % per_node
    )
    seed = server_args.random_seed
    if seed is None:
        seed = random.randrange(2**31)
    (seed,) = group.broadcast_ints([seed])
    return server_args.replace(random_seed=seed), group


def pack(messages: list[Message]) -> bytes:
    """The messages as one byte string: each message's codec frame after its length."""
    out = bytearray()
    for message in messages:
        frame = codec.encode(message)
        out += _LENGTH.pack(len(frame))
        out += frame
    return bytes(out)


def unpack(data: bytes) -> list[Message]:
    """The messages `pack` wrote, in order; `codec.CodecError` for bytes it did not write."""
    messages, offset = [], 0
    while offset < len(data):
        if offset + _LENGTH.size > len(data):
            raise codec.CodecError("a truncated message length")
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if offset + length > len(data):
            raise codec.CodecError("a truncated message")
        messages.append(codec.decode(data[offset : offset + length]))
        offset += length
    return messages


class RankSync:
    """Every iteration, rank 0's messages on every rank."""

    def __init__(self, group: TPGroup) -> None:
        self.group = group

    async def share(self, messages: list[Message] | None) -> list[Message]:
        """Rank 0 passes what it received, the others None; all get rank 0's messages."""
        payload = pack(messages) if messages is not None else None
        return unpack(await asyncio.to_thread(self.group.broadcast_bytes, payload))
