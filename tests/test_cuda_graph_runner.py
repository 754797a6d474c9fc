"""Decode through CUDA graphs: the batch-size buckets, the padded static batch that graphs
replay (run eagerly on the CPU, so the padding itself is tested everywhere), and on CUDA,
capture + replay against eager decoding."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from runner_helpers import TEST_DEVICE, SlotBook, greedy_generate, make_runner, take_rows

from srt.layers.forward_batch import ForwardBatch
from srt.model_executor.cuda_graph_runner import CudaGraphRunner, capture_batch_sizes
from srt.model_executor.model_runner import ModelRunner
from srt.testing.make_tiny_model import make_tiny_model

PROMPTS = [[5, 17, 42, 99, 7, 300, 12], [8, 9, 10], [61, 62], [3, 4, 5, 6], [70], [11, 12, 13]]


def test_capture_batch_sizes_follow_sglang() -> None:
    assert capture_batch_sizes(160, 256) == [1, 2, 4, 8, *range(16, 161, 8)]
    assert capture_batch_sizes(20, 256) == [1, 2, 4, 8, 16, 20]
    assert capture_batch_sizes(160, 5) == [1, 2, 4, 5]
    assert capture_batch_sizes(1, 16) == [1]
    with pytest.raises(ValueError, match="positive"):
        capture_batch_sizes(0, 16)


def test_batches_are_padded_to_the_next_captured_size(
    tiny_model_factory: Callable[[str], Path],
) -> None:
    graphs = CudaGraphRunner(make_runner(tiny_model_factory("llama")), [1, 2, 4, 8], capture=False)
    assert [graphs.padded_size(n) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    for n in (0, 9):
        with pytest.raises(ValueError, match=r"outside 1\.\.8"):
            graphs.padded_size(n)
    with pytest.raises(ValueError, match="increasing"):
        CudaGraphRunner(graphs.model_runner, [4, 2], capture=False)
    with pytest.raises(ValueError, match="need a CUDA device, not cpu"):
        CudaGraphRunner(graphs.model_runner, [1, 2], capture=True)


class Sequences:
    """The PROMPTS prefilled in one runner, then decoded in subsets of their rows."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.book = SlotBook(runner)
        rows = take_rows(runner, len(PROMPTS))
        self.rows = rows
        total = sum(len(p) for p in PROMPTS)
        runner.forward(runner.prepare_extend(rows, [0] * len(rows), PROMPTS, self.book.take(total)))
        self.seq_lens = [len(p) for p in PROMPTS]

    def decode(self, which: list[int], step: int) -> ForwardBatch:
        for i in which:
            self.seq_lens[i] += 1
        return self.runner.prepare_decode(
            [self.rows[i] for i in which],
            [self.seq_lens[i] for i in which],
            [20 + step + i for i in which],
            self.book.take(len(which)),
        )


@pytest.mark.parametrize("backend", ["cpu", pytest.param("triton", marks=pytest.mark.slow)])
def test_padded_decode_matches_the_unpadded_batch(
    backend: str, tiny_model_factory: Callable[[str], Path]
) -> None:
    """The real rows of a padded batch get the logits of the batch alone, and the padding rows
    write only the padding slot 0 of the KV cache (the real rows rewrite their own new slots
    with the values, up to rounding, that the eager step wrote there)."""
    runner = make_runner(
        tiny_model_factory("qwen3"), attention_backend=backend, device=TEST_DEVICE.type
    )
    graphs = CudaGraphRunner(runner, [1, 2, 4, 8], capture=False)
    seqs = Sequences(runner)
    for step, which in enumerate([[0, 1, 2], [0, 1, 2, 3, 4], [5], [1, 3, 4, 5]]):
        batch = seqs.decode(which, step)
        eager = runner.forward(batch)
        k_before = [k.clone() for k in runner.kv_pool.k_buffers]
        padded = graphs.run(batch)
        assert padded.shape == eager.shape
        torch.testing.assert_close(padded, eager, rtol=1e-5, atol=1e-5)
        untouched = torch.ones(runner.max_total_tokens + 1, dtype=torch.bool, device=runner.device)
        untouched[0] = False
        untouched[batch.out_cache_loc] = False
        for before, after in zip(k_before, runner.kv_pool.k_buffers, strict=True):
            assert torch.equal(before[untouched], after[untouched])
            torch.testing.assert_close(before[~untouched][1:], after[~untouched][1:])
        n, bs = len(which), graphs.padded_size(len(which))
        padding_row = runner.req_to_token_pool.padding_row
        assert graphs.req_pool_indices[n:bs].tolist() == [padding_row] * (bs - n)
        assert graphs.seq_lens[n:bs].tolist() == [1] * (bs - n)
        assert graphs.out_cache_loc[n:bs].tolist() == [0] * (bs - n)
    assert not runner.req_to_token_pool.req_to_token[padding_row].any()


def test_the_runner_routes_decode_through_the_graph_runner(
    tiny_model_factory: Callable[[str], Path],
) -> None:
    """On the CPU no graph runner exists; attached (without capture), the runner's forward sends
    decode batches that fit through it and everything else down the eager path."""
    path = tiny_model_factory("llama")
    expected = greedy_generate(make_runner(path), PROMPTS[:3], 6, banned=set())
    runner = make_runner(path)
    assert runner.cuda_graph_runner is None
    graphs = CudaGraphRunner(runner, [1, 2, 4], capture=False)
    runner.cuda_graph_runner = graphs
    assert greedy_generate(runner, PROMPTS[:3], 6, banned=set()) == expected

    seqs = Sequences(runner)
    prefill = runner.prepare_extend([seqs.rows[0]], [seqs.seq_lens[0]], [[7]], seqs.book.take(1))
    assert not graphs.can_run(prefill)
    with pytest.raises(ValueError, match="not a EXTEND batch"):
        graphs.run(prefill)
    assert graphs.can_run(seqs.decode([0, 1, 2, 3], 0))
    assert not graphs.can_run(seqs.decode([0, 1, 2, 3, 4], 1))


def test_cuda_graph_flags_on_cpu(tiny_model_factory: Callable[[str], Path]) -> None:
    runner = make_runner(tiny_model_factory("llama"), disable_cuda_graph=False, cuda_graph_max_bs=4)
    assert runner.cuda_graph_runner is None


GRAPH_BACKENDS = [
    pytest.param("triton", "float32", 1e-4, 1e-4, id="triton"),
    pytest.param(
        "flashinfer",
        "float16",
        1e-2,
        3e-2,
        id="flashinfer",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("flashinfer") is None, reason="needs flashinfer"
        ),
    ),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("backend", "dtype", "rtol", "atol"), GRAPH_BACKENDS)
def test_replayed_graphs_match_eager_decode(
    backend: str, dtype: str, rtol: float, atol: float, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = make_tiny_model("llama", tmp_path_factory.mktemp("hd64"), preset="tiny-hd64")
    steps = [[0, 1, 2, 3, 4, 5], [0], [0, 1, 2], [2, 3, 4, 5], [0, 1, 2, 3, 4, 5], [4]]

    def decode_logits(disable_cuda_graph: bool) -> tuple[ModelRunner, list[torch.Tensor]]:
        runner = make_runner(
            path,
            device=TEST_DEVICE.type,
            dtype=dtype,
            attention_backend=backend,
            disable_cuda_graph=disable_cuda_graph,
            cuda_graph_max_bs=8,
        )
        seqs = Sequences(runner)
        return runner, [runner.forward(seqs.decode(w, i)).cpu() for i, w in enumerate(steps)]

    eager_runner, expected = decode_logits(disable_cuda_graph=True)
    assert eager_runner.cuda_graph_runner is None
    runner, replayed = decode_logits(disable_cuda_graph=False)
    assert runner.cuda_graph_runner is not None
    assert sorted(runner.cuda_graph_runner.graphs) == [1, 2, 4, 8]
    for got, want in zip(replayed, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
