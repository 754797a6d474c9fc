"""`CudaGraphRunner`: decode batches through static buffers, replayed as CUDA graphs.

A decode batch of n sequences runs as the batch of the smallest captured size bs >= n: its
tensors are copied into the first n rows of static buffers, the other bs - n rows are padding
(input id 0 at position 0, written to the padding KV slot 0, read through the pool's padding
request row with length 1, so they touch no real sequence), the forward of size bs runs, and the
logits of the first n rows come back. On CUDA the forward of each size is captured once as a
graph and replayed; without capture (tests on the CPU) the same padded batch runs eagerly, so
that everything but the replay itself is exercised anywhere.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

import torch

from srt.forward_mode import ForwardMode
from srt.layers.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def capture_batch_sizes(max_bs: int, max_running_requests: int) -> list[int]:
    """SGLang's sizes (1, 2, 4, 8, then every multiple of 8) up to the smaller limit, which is
    itself always included so that the largest batch the scheduler can form replays a graph."""
    if max_bs < 1 or max_running_requests < 1:
        raise ValueError(f"limits must be positive, got {max_bs} and {max_running_requests}")
    limit = min(max_bs, max_running_requests)
    sizes = [bs for bs in [1, 2, 4, 8, *range(16, limit + 1, 8)] if bs <= limit]
    if sizes[-1] != limit:
        sizes.append(limit)
    return sizes


class CudaGraphRunner:
    def __init__(self, model_runner: ModelRunner, batch_sizes: list[int], capture: bool) -> None:
        """Static buffers for decode batches of up to max(batch_sizes) sequences; with `capture`
        (CUDA only), one graph per size, captured now."""
        if not batch_sizes or batch_sizes != sorted(set(batch_sizes)) or batch_sizes[0] < 1:
            raise ValueError(f"batch sizes must be positive and increasing, got {batch_sizes}")
        if capture and model_runner.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {model_runner.device}")
        self.model_runner = model_runner
        self.batch_sizes = batch_sizes
        self.max_bs = batch_sizes[-1]
        device = model_runner.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self.capture()

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return (
            forward_batch.forward_mode is ForwardMode.DECODE
            and 0 < forward_batch.batch_size <= self.max_bs
        )

    def padded_size(self, batch_size: int) -> int:
        """The smallest captured size that holds `batch_size` sequences."""
        if not 0 < batch_size <= self.max_bs:
            raise ValueError(f"batch size {batch_size} is outside 1..{self.max_bs}")
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, batch_size)]

    def _static_batch(self, forward_batch: ForwardBatch | None, bs: int) -> ForwardBatch:
        """The decode batch of size `bs` over the static buffers: `forward_batch`'s sequences in
        the first rows (none while capturing), padding in the rest."""
        n = 0 if forward_batch is None else forward_batch.batch_size
        if forward_batch is not None:
            self.input_ids[:n].copy_(forward_batch.input_ids)
            self.positions[:n].copy_(forward_batch.positions)
            self.out_cache_loc[:n].copy_(forward_batch.out_cache_loc)
            self.req_pool_indices[:n].copy_(forward_batch.req_pool_indices)
            self.seq_lens[:n].copy_(forward_batch.seq_lens)
        runner = self.model_runner
        self.input_ids[n:bs].zero_()
        self.positions[n:bs].zero_()
        self.out_cache_loc[n:bs].zero_()
        self.req_pool_indices[n:bs].fill_(runner.req_to_token_pool.padding_row)
        self.seq_lens[n:bs].fill_(1)
        seq_lens_cpu = [*(forward_batch.seq_lens_cpu if forward_batch else []), *[1] * (bs - n)]
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=seq_lens_cpu,
            extend_seq_lens_cpu=[1] * bs,
            req_to_token_pool=runner.req_to_token_pool,
            kv_pool=runner.kv_pool,
            attn_backend=runner.attn_backend,
        )

    def _forward(self, static: ForwardBatch) -> torch.Tensor:
        logits: torch.Tensor = self.model_runner.model(static.input_ids, static.positions, static)
        return logits

    @torch.inference_mode()
    def capture(self) -> None:
        """Captures the decode forward of every batch size, largest first, into one memory
        pool. The padding batches it runs write only the padding slot 0."""
        backend = self.model_runner.attn_backend
        max_context_len = self.model_runner.req_to_token_pool.max_context_len
        backend.init_cuda_graph_state(self.max_bs, max_context_len)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device=self.model_runner.device)
        for bs in reversed(self.batch_sizes):
            static = self._static_batch(None, bs)
            backend.init_forward_metadata_capture_cuda_graph(static)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # compiles kernels and settles allocations before capture
                    self._forward(static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self.outputs[bs] = self._forward(static)
            self.graphs[bs] = graph
        torch.cuda.synchronize(self.model_runner.device)
        logger.info("captured CUDA graphs for decode batch sizes %s", self.batch_sizes)

    @torch.inference_mode()
    def run(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """[batch, vocab] float32 logits of a decode batch. Replayed from a graph, they live in
        its output buffer and stay valid until the next decode forward."""
        if not self.can_run(forward_batch):
            raise ValueError(
                f"CUDA graphs run decode batches of 1..{self.max_bs} sequences, not a "
                f"{forward_batch.forward_mode.name} batch of {forward_batch.batch_size}"
            )
        bs = self.padded_size(forward_batch.batch_size)
        static = self._static_batch(forward_batch, bs)
        backend = self.model_runner.attn_backend
        if self.graphs:
            backend.init_forward_metadata_replay_cuda_graph(static)
            self.graphs[bs].replay()
            logits = self.outputs[bs]
        else:
            backend.init_forward_metadata(static)
            logits = self._forward(static)
        return logits[: forward_batch.batch_size]
