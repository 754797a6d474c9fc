"""Tensor parallelism on the CPU (gloo): a model's shards over 2 (and 4) ranks compute the
logits one rank does, within float32 tolerance (the all-reduce sums partial products in another
order); the pieces it is made of (shards of quantized weights, the split of cores, the frames
rank 0 broadcasts) are checked on their own. tests/test_tensor_parallel_serving.py serves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from runner_helpers import assert_logits_close, extend_and_decode_logits
from safetensors import safe_open
from safetensors.torch import save_file
from tp_helpers import (
    dequantized_extend_and_decode,
    extend_and_decode,
    quantized_extend_and_decode,
    run_ranks,
)

from srt.distributed import TPGroup, kv_heads_per_rank, set_tp_group
from srt.io_struct import AbortReq, FlushCacheReq, Message, ShutdownReq
from srt.ipc.codec import CodecError
from srt.kernels.cpu.quant_kernels import QuantizedWeight
from srt.layers.lazy_tensor import LazyTensor
from srt.layers.parallel_linear import take_rows, vocab_shard
from srt.managers.tp_ranks import pack, unpack
from srt.model_executor.cpu_threads import share_of
from srt.server_args import ServerArgs
from srt.server_args_check import ServerArgsError

# Float32 logits of the tiny models are O(1): sums in another order differ by a few ulps.
ATOL = 1e-4


def assert_close_logits(ours: list[torch.Tensor], reference: list[torch.Tensor]) -> None:
    assert len(ours) == len(reference)
    for step, (a, b) in enumerate(zip(ours, reference, strict=True)):
        assert a.shape == b.shape, step
        assert torch.allclose(a, b, atol=ATOL, rtol=0), (step, float((a - b).abs().max()))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "qwen3_moe"])
def test_two_ranks_compute_one_ranks_logits(
    arch: str, tiny_model_factory: Callable[[str], Path], tmp_path: Path
) -> None:
    """Prefill, a prefix reused from the KV cache, decode steps: every logit row of TP=2 (each
    rank's, all-gathered) is TP=1's. Qwen2 has q/k/v biases, Qwen3 q/k norms, both tie the
    lm_head to the embedding; Qwen3-MoE shards every expert's rows and all-reduces their sum
    once; the vocabulary does not split evenly (padding)."""
    model = tiny_model_factory(arch)
    reference = extend_and_decode_logits(model, device="cpu")
    ranks = run_ranks(2, extend_and_decode, tmp_path, model)
    assert [r["shapes"] for r in ranks] == [[1, 16, 2, 1]] * 2  # 4 heads, 2 KV heads: halves
    for rank in ranks:
        assert_close_logits(rank["logits"], reference)


def test_kv_heads_fewer_than_ranks_are_replicated(
    tiny_model_factory: Callable[[str], Path], tmp_path: Path
) -> None:
    """The tiny llama has 4 query heads and 2 KV heads: over 4 ranks each rank holds one query
    head and one KV head (ranks 0-1 KV head 0, ranks 2-3 KV head 1), and the logits are TP=1's."""
    model = tiny_model_factory("llama")
    reference = extend_and_decode_logits(model, device="cpu")
    ranks = run_ranks(4, extend_and_decode, tmp_path, model)
    assert [r["shapes"] for r in ranks] == [[1, 16, 1, 1]] * 4
    for rank in ranks:
        assert_close_logits(rank["logits"], reference)


def test_quantized_shards_compute_one_ranks_logits(
    tiny_model_factory: Callable[[str], Path], tmp_path: Path
) -> None:
    """GGUF blocks shard too (Qwen2: q/k/v biases, the lm_head reads the embedding's blocks):
    TP=2's logits are the dequantized blocks' within the quantized kernels' rounding, the bound
    test_quantized_loading holds one rank to (each product's path is chosen by a timing, so
    TP=1 and TP=2 may round differently)."""
    model = tiny_model_factory("qwen2")
    reference = dequantized_extend_and_decode(model)
    for logits in run_ranks(2, quantized_extend_and_decode, tmp_path, model):
        assert_logits_close(logits, reference)


def test_a_rank_reads_only_its_slice_of_a_safetensors_tensor(tmp_path: Path) -> None:
    """`LazyTensor`: the rows or columns asked for, read from the file; all of it on `load`."""
    weight, bias = torch.randn(6, 4), torch.randn(6)
    save_file({"w": weight, "b": bias}, tmp_path / "m.safetensors")
    with safe_open(str(tmp_path / "m.safetensors"), framework="pt") as f:
        lazy_weight, lazy_bias = LazyTensor(f.get_slice("w")), LazyTensor(f.get_slice("b"))
        assert (lazy_weight.shape, lazy_weight.dim()) == ((6, 4), 2)
        assert torch.equal(lazy_weight.narrow(0, 2, 3), weight[2:5])
        assert torch.equal(lazy_weight.narrow(1, 2, 2), weight[:, 2:])
        assert torch.equal(lazy_weight.load(), weight)
        assert torch.equal(lazy_bias.load(), bias)
        rows = take_rows(lazy_weight, 4, 2, padded=3)
        assert isinstance(rows, torch.Tensor)
        assert torch.equal(rows, torch.cat([weight[4:], torch.zeros(1, 4)]))
        with pytest.raises(ValueError, match="cannot narrow"):
            lazy_weight.narrow(1, 3, 2)


def test_kv_heads_per_rank() -> None:
    assert kv_heads_per_rank(8, 2) == 4
    assert kv_heads_per_rank(2, 4) == 1
    assert kv_heads_per_rank(1, 2) == 1
    with pytest.raises(ValueError, match="split"):
        kv_heads_per_rank(6, 4)
    with pytest.raises(ValueError, match="evenly"):
        kv_heads_per_rank(4, 6)


def quantized(rows: int, cols: int, seed: int = 0) -> QuantizedWeight:
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows, cols // 32 * 34), dtype=torch.uint8, generator=generator)
    blocks.view(rows, -1, 34)[:, :, 1] = 0x10  # small finite fp16 scales (no inf or nan)
    return QuantizedWeight(blocks.contiguous(), "q8_0", cols)


def test_quantized_column_shards_sum_to_the_whole_product() -> None:
    """A row-parallel layer's GGUF blocks split at block boundaries: the shards' partial
    products sum to the whole weight's, and each shard is the whole's columns."""
    weight = quantized(8, 128)
    x = torch.randn(3, 128)
    whole = weight.dequantize()
    shards = [weight.select_columns(0, 64), weight.select_columns(64, 128)]
    assert torch.equal(shards[1].dequantize(), whole[:, 64:])
    partial = shards[0].dequantize() @ x[:, :64].T + shards[1].dequantize() @ x[:, 64:].T
    assert torch.allclose(partial, whole @ x.T, atol=1e-3)
    with pytest.raises(ValueError, match="multiples of 32"):
        weight.select_columns(0, 48)


def test_a_vocabulary_shard_is_padded_with_zero_rows() -> None:
    """The last rank's share of a vocabulary that does not split evenly ends in zero rows, in
    float and in blocks (a zero scale dequantizes to 0)."""
    set_tp_group(TPGroup(rank=1, size=2))
    try:
        assert vocab_shard(7) == (4, 7, 4)
    finally:
        set_tp_group(TPGroup())
    table = torch.arange(14.0).view(7, 2)
    rows = take_rows(table, 4, 3, padded=4)
    assert isinstance(rows, torch.Tensor)
    assert torch.equal(rows, torch.tensor([[8, 9], [10, 11], [12, 13], [0, 0.0]]))
    blocks = take_rows(quantized(7, 32), 4, 3, padded=4)
    assert isinstance(blocks, QuantizedWeight)
    assert torch.equal(blocks.dequantize()[:3], quantized(7, 32).dequantize()[4:])
    assert not blocks.dequantize()[3].any()


def test_cores_split_between_ranks() -> None:
    cores = [0, 1, 2, 3, 4]
    assert [share_of(cores, i, 2) for i in range(2)] == [[0, 1, 2], [3, 4]]
    assert [share_of([0, 1], i, 2) for i in range(2)] == [[0], [1]]
    assert [share_of([5], i, 2) for i in range(2)] == [[5], [5]]  # fewer cores: shared
    with pytest.raises(ValueError, match="share 2 of 2"):
        share_of(cores, 2, 2)


def test_rank_zero_broadcasts_messages_as_codec_frames() -> None:
    messages: list[Message] = [AbortReq(rid="a"), FlushCacheReq(rid="f"), ShutdownReq(rid="s")]
    assert unpack(pack(messages)) == messages
    assert unpack(b"") == []
    with pytest.raises(CodecError):
        unpack(pack(messages)[:-1])


def test_parallelism_arguments_are_checked() -> None:
    assert ServerArgs(tp_size=4, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000")
    with pytest.raises(ServerArgsError, match="--tp-size"):
        ServerArgs(tp_size=3, nnodes=2, dist_init_addr="h:1")
    with pytest.raises(ServerArgsError, match="--node-rank"):
        ServerArgs(tp_size=2, nnodes=2, node_rank=2, dist_init_addr="h:1")
    with pytest.raises(ServerArgsError, match="--dist-init-addr"):
        ServerArgs(tp_size=2, nnodes=2)
    with pytest.raises(ServerArgsError, match="--dist-init-addr"):
        ServerArgs(dist_init_addr="no-port")
