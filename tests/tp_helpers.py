"""Tensor-parallel ranks in test processes: each spawned rank joins a gloo group on loopback,
builds its shard of a model and writes what it computed to a file the test reads back."""

from __future__ import annotations

import multiprocessing as mp
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from runner_helpers import make_runner, runner_extend_and_decode_logits

from srt.distributed import init_tensor_parallel

RANK_TIMEOUT_S = 300.0


def run_ranks(size: int, body: Callable[..., Any], out_dir: Path, *args: Any) -> list[Any]:
    """Runs `body(rank, out_dir, *args)` in `size` spawned processes joined in one gloo group;
    returns what each rank saved (`torch.save` to out_dir/rank{r}.pt) in rank order."""
    # A file, not a TCP port: a port found free may be taken by another process before rank 0
    # binds it.
    addr = f"file://{out_dir / f'rendezvous-{uuid.uuid4().hex}'}"
    context = mp.get_context("spawn")
    processes = [
        context.Process(target=_rank_main, args=(rank, size, addr, body, out_dir, *args))
        for rank in range(size)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(RANK_TIMEOUT_S)
        if process.exitcode is None:
            process.kill()
    codes = [p.exitcode for p in processes]
    assert codes == [0] * size, f"ranks exited with {codes}"
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(size)]


def _rank_main(
    rank: int, size: int, addr: str, body: Callable[..., Any], out_dir: Path, *args: Any
) -> None:
    torch.set_num_threads(1)
    init_tensor_parallel(rank, size, addr, "cpu")
    torch.save(body(rank, out_dir, *args), out_dir / f"rank{rank}.pt")
    # Leave together and without running the process group's C++ destructors, as stage
    # processes do: a group torn down after its peer has gone may abort the process.
    dist.barrier()
    os._exit(0)


def extend_and_decode(rank: int, out_dir: Path, model: Path) -> dict[str, Any]:
    """`runner_helpers.extend_and_decode_logits` on this rank's shard of `model`, on the CPU,
    with the rank's KV cache shape [slots, KV heads, head dim] and its attention's head counts."""
    runner = make_runner(model, max_total_tokens=256)
    attn: Any = runner.model.get_submodule("model.layers.0.self_attn")
    shapes = [*runner.kv_pool.k_buffers[0].shape[1:], attn.num_heads, attn.num_kv_heads]
    return {"logits": runner_extend_and_decode_logits(runner), "shapes": shapes}


def quantized_extend_and_decode(rank: int, out_dir: Path, model: Path) -> list[torch.Tensor]:
    """`extend_and_decode`'s logits with every projection and the embedding (tied to the
    lm_head in Qwen) in Q8_0 blocks, sharded as they load: rows of q/k/v, gate/up and the
    vocabulary, 32-column blocks of o_proj and down_proj."""
    from test_quantized_loading import checkpoint, every_matrix, loaded

    return runner_extend_and_decode_logits(loaded(model, checkpoint(model, every_matrix("q8_0"))))


def dequantized_extend_and_decode(model: Path) -> list[torch.Tensor]:
    """`quantized_extend_and_decode`'s logits at one rank from the blocks dequantized to
    float32: the reference test_quantized_loading holds quantized logits to."""
    from test_quantized_loading import checkpoint, dequantized, every_matrix, loaded

    tensors = checkpoint(model, every_matrix("q8_0"))
    return runner_extend_and_decode_logits(loaded(model, dequantized(tensors)))
