"""K-quant GGUF files (llama.cpp's Q4_K_M and Q5_K_M mixes of tiny models) served from their
blocks: the types held, logits and greedy tokens against the same file dequantized to float32,
weight memory against the file's tensor bytes (as `benches/bench_startup.py` reports it), the
decode steps in the fused stack (a qkv in parts included), and `srt-serve` answering from the
blocks over HTTP."""

from __future__ import annotations

import json
import logging
import re
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from bench_startup import gguf_memory, weights
from runner_helpers import assert_logits_close, greedy_generate, make_runner, teacher_forced_logits
from runner_helpers import runner_extend_and_decode_logits as extend_and_decode
from test_gguf_kquant_models import LOADER, dequantized_log, gguf_alone

from srt.kernels.cpu import cpu_kernels
from srt.kernels.cpu.quant_kernels import QuantizedWeight
from srt.kernels.cpu.quant_parts import QuantizedParts
from srt.model_executor.model_runner import ModelRunner
from srt.testing.server_process import running_server

# Largest logit difference from the dequantized float32 model, as a fraction of its largest
# logit. The weights are the same numbers either way; the integer kernel (on CPUs with one)
# splits each block of 32 activations into two int8 parts, about 15 bits, so each product errs
# by about 2^-15 of its inputs' magnitudes (the dense path and the float kernel by float32's
# sums alone). Measured on these models: 6e-5 to 3e-4; a wrong scale, layout or order of parts
# errs by the whole logit.
K_LOGITS_RTOL = 1e-3
# The file's tensor bytes bound the weights': the K-quants' tiles are within 3% of their blocks.
MEMORY_OVER_FILE = 1.1
# How quantized weights are held: repacked where the CPU has the integer kernel.
KEPT = "tiles" if cpu_kernels.quant_packed_kernel() is not None else "blocks"
CPU_DECODE = "srt.model_executor.cpu_decode"
FALLBACK = "decode steps run layer by layer, not in one Rust call: "
PROMPTS = [[5, 17, 42, 99, 7, 300, 12], [8, 9, 10], [61, 62, 63, 64, 65]]
GREEDY_TOKENS = 12


def held(runner: ModelRunner) -> dict[str, str]:
    """Each quantized layer's weight, by module name: its format, its parts' formats, or the
    name of the layer whose weight it shares."""
    found: dict[str, str] = {}
    owners: dict[int, str] = {}
    for name, module in runner.model.named_modules():
        quant = getattr(module, "quant", None)
        if quant is None:
            continue
        if id(quant) in owners:
            found[name] = f"= {owners[id(quant)]}"
            continue
        owners[id(quant)] = name
        assert isinstance(quant, QuantizedWeight | QuantizedParts), name
        found[name] = quant.fmt if isinstance(quant, QuantizedWeight) else "+".join(quant.formats)
    return found


def dequantized_reference(model: Path, expected: dict[str, torch.Tensor]) -> ModelRunner:
    """The model from its Hugging Face config, given the file's tensors' dequantized values."""
    reference = make_runner(model, load_format="dummy", max_total_tokens=256)
    reference.model.load_weights(iter(expected.items()))  # type: ignore[operator]
    return reference


def clear_steps(logits: torch.Tensor, atol: float) -> int:
    """How many leading steps of `logits` [steps, vocab] have a top-1 lead over the runner-up
    of more than 2 * atol: where logits within atol of these choose the same token."""
    top = logits.topk(2, dim=-1).values
    unclear = ((top[:, 0] - top[:, 1]) <= 2 * atol).nonzero()
    return len(logits) if len(unclear) == 0 else int(unclear[0])


@pytest.mark.parametrize(
    ("arch", "beside", "mix", "tied"),
    [
        # untied (an output layer of Q6_K), q/k rows permuted by llama.cpp; transformers reads
        # the file as Llama, its Hugging Face config as Mistral
        ("mistral", False, "Q4_K_M", False),
        ("mistral", True, "Q4_K_M", False),
        # Llama 3's rope scaling from the file's rope_freqs tensor, or the config beside it
        ("llama", False, "Q4_K_M", False),
        ("llama", True, "Q4_K_M", False),
        ("qwen2", False, "Q4_K_M", True),  # q/k/v biases
        ("qwen3", False, "Q4_K_M", True),  # RMSNorm of each q and k head
        ("qwen3", False, "Q5_K_M", True),
    ],
)
def test_a_k_quant_file_is_served_from_its_blocks(
    tiny_k_model: Callable[[str], Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    arch: str,
    beside: bool,
    mix: str,
    tied: bool,
) -> None:
    model = tiny_k_model(arch)
    gguf, expected = gguf_alone(model, tmp_path / "gguf", mix, beside)
    with caplog.at_level(logging.INFO, logger=LOADER):
        served = make_runner(gguf, max_total_tokens=256)
    assert dequantized_log(caplog.records) == []
    body = mix[:2].lower() + "_k"  # most matrices; the output layer in Q6_K
    # Of the two layers, llama.cpp gives the second's attn_v and ffn_down more bits (Q6_K).
    layers = [
        {"self_attn.qkv_proj": body, "mlp.down_proj": body},
        {"self_attn.qkv_proj": f"{body}+q6_k", "mlp.down_proj": "q6_k"},
    ]
    assert held(served) == {
        "model.embed_tokens": "q6_k" if tied else body,
        **{
            f"model.layers.{i}.{part}": fmt
            for i, layer in enumerate(layers)
            for part, fmt in {**layer, "self_attn.o_proj": body, "mlp.gate_up_proj": body}.items()
        },
        "lm_head": "= model.embed_tokens" if tied else "q6_k",
    }
    # The weights in the file's bytes: a tied embedding held once, the tiles about the blocks.
    memory = gguf_memory(gguf, served.weight_bytes / 2**20)
    assert memory["weights_to_gguf"] <= MEMORY_OVER_FILE

    reference = dequantized_reference(model, expected)
    assert_logits_close(extend_and_decode(served), extend_and_decode(reference), K_LOGITS_RTOL)

    # Greedy tokens agree up to the first step where the reference's lead is within the
    # tolerance (there the two may choose differently).
    chosen = greedy_generate(reference, PROMPTS, GREEDY_TOKENS, banned=set())
    served_tokens = greedy_generate(served, PROMPTS, GREEDY_TOKENS, banned=set())
    logits = teacher_forced_logits(reference, PROMPTS, chosen)
    atol = K_LOGITS_RTOL * float(logits.abs().max())
    clear = [clear_steps(logits[:, i], atol) for i in range(len(PROMPTS))]
    for mine, wanted, steps in zip(served_tokens, chosen, clear, strict=True):
        assert mine[:steps] == wanted[:steps]
    assert sum(clear) >= len(PROMPTS) * GREEDY_TOKENS // 2, clear


def test_decode_steps_of_a_weight_of_parts_run_in_one_rust_call(
    tiny_k_model: Callable[[str], Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gguf, _ = gguf_alone(tiny_k_model("llama"), tmp_path / "gguf", "Q4_K_M")
    runner = make_runner(gguf, max_total_tokens=256)
    assert isinstance(
        runner.model.get_submodule("model.layers.1.self_attn.qkv_proj").quant, QuantizedParts
    )
    executor = runner.layers_executor
    assert executor is not None
    with caplog.at_level(logging.INFO, logger=CPU_DECODE):
        extend_and_decode(runner)
    assert [r.getMessage() for r in caplog.records if r.name == CPU_DECODE] == []
    assert executor._stack is not None


def test_srt_serve_answers_from_the_blocks(
    tiny_k_model: Callable[[str], Path], tmp_path: Path
) -> None:
    model = tiny_k_model("qwen2")  # tied embeddings
    gguf, expected = gguf_alone(model, tmp_path / "gguf", "Q4_K_M", beside=True)
    greedy = {"max_new_tokens": GREEDY_TOKENS, "temperature": 0, "ignore_eos": True}
    body = json.dumps({"input_ids": PROMPTS[0], "sampling_params": greedy}).encode()
    with running_server(gguf, "--dtype", "float32") as server:
        request = urllib.request.Request(
            f"{server.url}/generate", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request) as response:
            tokens = json.load(response)["output_ids"]
        log = server.output()
    assert len(tokens) == GREEDY_TOKENS
    # Served from the blocks: nothing dequantized, the weights in the file's bytes.
    assert "dequantized" not in log
    found = weights(log)
    assert found["quantization"] == "gguf"
    assert gguf_memory(gguf, found["weights_mb"])["weights_to_gguf"] <= MEMORY_OVER_FILE
    # The log says how: each format in its tiles (or blocks, on a CPU without the kernel).
    held_as = re.search(r"weights: .*; held as (.*)", log)
    assert held_as is not None
    forms = {form.rsplit(" ", 2)[0] for form in held_as.group(1).split(", ")}
    assert {f"{fmt} {KEPT}" for fmt in ("q4_k", "q6_k")} <= forms
    assert FALLBACK not in log
    # Each token the dequantized model's choice, up to its first lead within the tolerance.
    reference = dequantized_reference(model, expected)
    logits = teacher_forced_logits(reference, [PROMPTS[0]], [tokens])[:, 0]
    steps = clear_steps(logits, K_LOGITS_RTOL * float(logits.abs().max()))
    assert tokens[:steps] == logits[:steps].argmax(-1).tolist()
    assert steps >= GREEDY_TOKENS // 2
