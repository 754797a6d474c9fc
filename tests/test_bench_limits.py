"""The arithmetic behind the benchmarks' distance-to-the-limit figures, and the machine record
every benchmark JSON carries."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from bench_one_batch import against_limits, step_work
from bench_utils import emit, parse_cpuinfo
from roofline import decode_flops, decode_weight_bytes, linear_params, prefill_flops
from torch import nn
from transformers import LlamaConfig
from transformers import LlamaForCausalLM as HfLlama

from srt.kernels.cpu.quant_kernels import QuantizedWeight
from srt.layers.linear import Linear
from srt.layers.vocab_embedding import VocabEmbedding
from srt.model_executor.model_runner import ModelRunner
from srt.models.llama import LlamaForCausalLM
from srt.server_args import ServerArgs

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 64, 128, 2, 4, 2, 16, 100

# Per layer: q (4 heads), k and v (2 heads each) and o projections, gate and up, down.
LAYER_MATMUL = HIDDEN * (HEADS + 2 * KV_HEADS) * HEAD_DIM + HEADS * HEAD_DIM * HIDDEN
LAYER_MATMUL += HIDDEN * 2 * INTERMEDIATE + INTERMEDIATE * HIDDEN
PROJECTIONS = LAYERS * LAYER_MATMUL
NORMS = LAYERS * 2 * HIDDEN + HIDDEN
TABLE = VOCAB * HIDDEN  # the embedding table, and the lm_head's matrix


def config(tied: bool) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        tie_word_embeddings=tied,
    )


@pytest.mark.parametrize(("dtype", "size"), [(torch.float32, 4), (torch.bfloat16, 2)])
@pytest.mark.parametrize("tied", [True, False])
def test_decode_weight_bytes(dtype: torch.dtype, size: int, tied: bool) -> None:
    # The same count from srt's model and from transformers': fused or separate projections,
    # the same weights.
    models: list[nn.Module] = [LlamaForCausalLM(config(tied)), HfLlama(config(tied))]
    for model in models:
        model.to(dtype)
        streamed = PROJECTIONS + NORMS + TABLE  # the lm_head reads its matrix in full
        # Untied, the embedding table is a second matrix, of which each token reads one row.
        assert decode_weight_bytes(model, 3) == size * (streamed + (0 if tied else 3 * HIDDEN))
        # A batch larger than the vocabulary reads the table at most once.
        assert decode_weight_bytes(model, 1000) == size * (streamed + (0 if tied else TABLE))
        assert linear_params(model) == (PROJECTIONS, TABLE)


@pytest.mark.parametrize("tied", [True, False])
def test_decode_weight_bytes_of_blocks(tied: bool) -> None:
    # Every matrix in Q8_0 blocks (34 bytes per 32 weights); the norms stay float32.
    model = LlamaForCausalLM(config(tied))
    for module in model.modules():
        if isinstance(module, Linear | VocabEmbedding) and module.quant is None:
            out_features, in_features = module.weight.shape
            blocks = torch.zeros(out_features, in_features // 32 * 34, dtype=torch.uint8)
            module.set_quantized(QuantizedWeight(blocks, "q8_0", in_features))
    if tied:
        model.lm_head.set_quantized(model.model.embed_tokens.quant)  # type: ignore[arg-type]
    streamed = (PROJECTIONS + TABLE) // 32 * 34 + 4 * NORMS
    assert decode_weight_bytes(model, 3) == streamed + (0 if tied else 3 * HIDDEN // 32 * 34)
    assert linear_params(model) == (PROJECTIONS, TABLE)


def test_prefill_and_decode_flops() -> None:
    # Two prompts of 3 tokens: the projections for all 6 tokens, the lm_head for the last token
    # of each, and causal attention: queries see 1, 2 and 3 keys, over 2 layers and 4 heads.
    attention = 2 * LAYERS * HEADS * (1 + 2 + 3) * 2 * HEAD_DIM * 2
    expected = 2 * PROJECTIONS * 6 + 2 * TABLE * 2 + attention
    assert prefill_flops(PROJECTIONS, TABLE, LAYERS, HEADS, HEAD_DIM, 2, 3) == expected
    # A decode step of 5 sequences of 10 tokens: one token each, through every matrix.
    attention = 5 * LAYERS * HEADS * 10 * 2 * HEAD_DIM * 2
    expected = 2 * (PROJECTIONS + TABLE) * 5 + attention
    assert decode_flops(PROJECTIONS, TABLE, LAYERS, HEADS, HEAD_DIM, 5, 10) == expected


def test_step_work_follows_the_runner_dtype(tiny_model_factory: Callable[[str], Path]) -> None:
    work = {}
    for dtype in ("float32", "bfloat16"):
        args = ServerArgs(device="cpu", dtype=dtype, max_total_tokens=64, max_running_requests=4)
        runner = ModelRunner(args, str(tiny_model_factory("qwen2")))
        work[dtype] = step_work(runner, batch_size=4, input_len=8, output_len=4)
    # Weights and KV cache both halve in bf16; the arithmetic does not change.
    assert work["float32"]["decode_step_bytes"] == 2 * work["bfloat16"]["decode_step_bytes"]
    assert work["float32"]["prefill_flops"] == work["bfloat16"]["prefill_flops"] > 0


def test_against_limits() -> None:
    timings = {"prefill_s": 0.5, "decode_step_s": 0.1}
    work = {"decode_step_bytes": 10**9, "decode_step_flops": 10**10, "prefill_flops": 10**12}
    limits = {"copy_bandwidth_GBps": 20.0, "gemm_TFLOPs": {"float32": 1.0, "bfloat16": 4.0}}
    rates = against_limits(timings, work, limits, "bfloat16")
    assert rates["decode_GBps"] == pytest.approx(10.0)
    assert rates["decode_fraction_of_copy_bw"] == pytest.approx(0.5)
    assert rates["decode_TFLOPs"] == pytest.approx(0.1)
    assert rates["decode_fraction_of_gemm_rate"] == pytest.approx(0.025)
    assert rates["prefill_TFLOPs"] == pytest.approx(2.0)
    assert rates["prefill_fraction_of_gemm_rate"] == pytest.approx(0.5)
    assert rates["prefill_s"] == 0.5


X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8
bogomips\t: 4000.00

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2
"""

ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes sve bf16 i8mm
CPU implementer\t: 0x41
"""


def test_parse_cpuinfo() -> None:
    assert parse_cpuinfo(X86_CPUINFO) == {
        "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
        "cpu_flags": [
            "avx2",
            "fma",
            "avx512f",
            "avx512_bf16",
            "avx512_vnni",
            "amx_bf16",
            "amx_int8",
            "amx_tile",
        ],
    }
    assert parse_cpuinfo(ARM_CPUINFO) == {
        "cpu_model": None,
        "cpu_flags": ["asimd", "sve", "bf16", "i8mm"],
    }


def test_emit_records_the_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "result.json"
    emit({"ratio": 2.0}, out)
    written = json.loads(out.read_text())
    assert written == json.loads(capsys.readouterr().out)
    assert written["ratio"] == 2.0
    machine = written["machine"]
    assert machine["cpu_model"]
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        assert machine["cpu_flags"] == parse_cpuinfo(cpuinfo.read_text())["cpu_flags"]
    assert machine["torch_version"] == torch.__version__
    assert machine["torch_threads"] == torch.get_num_threads()
