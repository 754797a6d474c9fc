"""Decode steps of quantized layers in one Rust call (`srt.model_executor.cpu_decode`), on the
integer kernels' tiles (AVX-512 VNNI, AVX2) and on blocks (the float kernel, as on CPUs without
AVX2): the same logits, bit for bit, as the layers called one by one; the steps it leaves to
them; and the binding's refusals."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from runner_helpers import TinyModelFactory, make_runner, runner_extend_and_decode_logits
from test_quantized_loading import checkpoint, every_matrix

from srt import _rust
from srt.kernels.cpu import cpu_kernels, quant_kernels
from srt.kernels.cpu.quant_kernels import DENSE, KERNEL, ONE_INT8, QuantizedWeight
from srt.kernels.cpu.quant_parts import QuantizedParts
from srt.layers.attention.cpu_backend import CpuAttnBackend
from srt.layers.linear import Linear
from srt.model_executor.cpu_decode import CpuDecodeExecutor
from srt.model_executor.model_runner import ModelRunner

ACTIVE_ISA = cpu_kernels.isa()[0]


@pytest.fixture(params=["tiles", "avx2 tiles", "avx2_vnni tiles", "blocks"])
def form(request: pytest.FixtureRequest) -> Iterator[str]:
    """How quantized weights are held: in tiles for this CPU's best integer kernel, in tiles for
    the AVX2 one (the kernels capped at AVX2, as on a CPU without AVX-512 VNNI; with AVX-VNNI's
    products, as on Alder Lake), or in blocks (capped below AVX2, where the float kernel runs)."""
    caps = {"tiles": ACTIVE_ISA, "avx2 tiles": "avx2", "avx2_vnni tiles": "avx2_vnni"}
    cap = caps.get(request.param, "scalar")
    cpu_kernels.set_isa(cap)
    kernel = cpu_kernels.quant_packed_kernel()
    try:
        if request.param == "tiles" and kernel is None:
            pytest.skip("tiles need an integer kernel (AVX2 or AVX-512 VNNI)")
        if request.param != "tiles" and cap != "scalar" and kernel != cap:
            pytest.skip(f"the CPU has no {cap} integer kernel")
        yield request.param
    finally:
        cpu_kernels.set_isa(ACTIVE_ISA)


def mixed_formats(name: str) -> str | None:
    """Blocks of a different format per projection, as GGUF files mix them (the shards of a
    fused projection share theirs, else it is dequantized)."""
    if name.endswith("proj.weight"):
        for parts, fmt in ((("q_", "k_", "v_"), "q8_0"), (("o_",), "q5_0"), (("down",), "q5_1")):
            if any(f".{part}" in name for part in parts):
                return fmt
    return every_matrix("q4_1")(name)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every `CpuDecodeExecutor.run`'s answer, in order."""
    answers: list[bool] = []
    run = CpuDecodeExecutor.run

    def counting(self: CpuDecodeExecutor, *args: object) -> bool:
        answers.append(run(self, *args))  # type: ignore[arg-type]
        return answers[-1]

    monkeypatch.setattr(CpuDecodeExecutor, "run", counting)
    return answers


def quantized_runner(
    factory: TinyModelFactory,
    arch: str,
    formats: Callable[[str], str | None],
    dtype: str,
    preset: str = "tiny",
) -> ModelRunner:
    path = factory(arch, preset)
    runner = make_runner(path, load_format="dummy", max_total_tokens=256, dtype=dtype)
    runner.model.load_weights(iter(checkpoint(path, formats)))  # type: ignore[operator]
    return runner


def k_quants(name: str) -> str | None:
    """K-quant blocks of one format per fused weight: Q5_K for q, k and v, Q6_K for down, Q4_K
    for the rest, the embedding in Q6_K."""
    if "embed_tokens" in name:
        return "q6_k"
    if not name.endswith("proj.weight"):
        return None
    if any(f".{part}_proj" in name for part in "qkv"):
        return "q5_k"
    return "q6_k" if ".down_proj" in name else "q4_k"


def q4_k_m(name: str) -> str | None:
    """llama.cpp's Q4_K_M mix: Q4_K but v and down in Q6_K, so that qkv is held in parts."""
    if name.endswith(("v_proj.weight", "down_proj.weight")):
        return "q6_k"
    return every_matrix("q4_k")(name)


@pytest.mark.parametrize(
    ("arch", "formats", "dtype", "preset"),
    [
        ("llama", every_matrix("q4_1"), "bfloat16", "tiny"),
        ("qwen2", mixed_formats, "float32", "tiny"),  # q/k/v biases
        ("mistral", every_matrix("q8_0"), "bfloat16", "tiny"),
        ("qwen3", every_matrix("q4_0"), "float32", "tiny"),  # per-head q/k norms
        ("qwen3_moe", every_matrix("q8_0"), "bfloat16", "tiny"),  # experts, a dense MLP
        # The K-quants (super-blocks of 256: the tiny-k models' widths), on their tiles or
        # blocks; a qkv in parts of two formats (with biases: qwen2's), each part's outputs
        # written side by side.
        ("llama", q4_k_m, "bfloat16", "tiny-k"),
        ("qwen3", k_quants, "float32", "tiny-k"),
        ("qwen2", q4_k_m, "float32", "tiny-k"),
    ],
)
def test_a_fused_step_gives_the_layers_bits(
    tiny_model_factory: TinyModelFactory,
    monkeypatch: pytest.MonkeyPatch,
    counted: list[bool],
    form: str,
    arch: str,
    formats: Callable[[str], str | None],
    dtype: str,
    preset: str,
) -> None:
    """Two extends and three decode steps of three sequences: the decode steps run fused,
    their logits equal to those of the layers run one by one (on a second model)."""
    runner = quantized_runner(tiny_model_factory, arch, formats, dtype, preset)
    fused = runner_extend_and_decode_logits(runner)
    projections = [m.quant for m in runner.model.modules() if isinstance(m, Linear)]
    held = [q for q in projections if isinstance(q, QuantizedWeight)]
    held += [part for q in projections if isinstance(q, QuantizedParts) for part in q.parts]
    assert held
    assert all(q.packed == (form != "blocks") for q in held)
    assert counted == [False, False, True, True, True]
    counted.clear()
    monkeypatch.setenv("SRT_FUSED_DECODE", "0")
    layered = runner_extend_and_decode_logits(
        quantized_runner(tiny_model_factory, arch, formats, dtype, preset)
    )
    assert counted == [False] * 5
    for ours, theirs in zip(fused, layered, strict=True):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize(
    ("formats", "preset"),
    [(every_matrix("q4_1"), "tiny"), (q4_k_m, "tiny-k")],  # blocks of 32; K-quants, in parts
)
@pytest.mark.parametrize(
    "offered_plan",
    [
        ((0, KERNEL), (2, ONE_INT8)),
        # The dense path between the two kernels, as measured for SmolLM2's Q5_0 projections
        # of 4 to 15 rows on Zen 4: steps of 2 sequences would take the layers, of 3 the stack.
        ((0, KERNEL), (2, DENSE), (3, ONE_INT8)),
    ],
)
def test_a_fused_step_rounding_activations_to_int8_gives_the_layers_bits(
    tiny_model_factory: TinyModelFactory,
    monkeypatch: pytest.MonkeyPatch,
    counted: list[bool],
    formats: Callable[[str], str | None],
    preset: str,
    offered_plan: quant_kernels.Plan,
) -> None:
    """Where the plans round activations to one int8 from 2 or 3 rows (as if measured; 16 in
    serving), the stack's decode steps of 3 sequences do too, as the layers' do."""
    if cpu_kernels.quant_packed_kernel() is None:
        pytest.skip("one int8 per activation needs the integer kernel (AVX-512 VNNI)")
    monkeypatch.setattr(quant_kernels, "_plans", {})
    monkeypatch.setattr(
        quant_kernels,
        "_measure_plan",
        lambda weight, dtype, offered: offered_plan if offered else ((0, KERNEL), (512, DENSE)),
    )

    def logits(offered: bool) -> list[torch.Tensor]:
        runner = quantized_runner(tiny_model_factory, "llama", formats, "bfloat16", preset)
        runner.offer_int8_activations = offered  # as for a GGUF file
        return runner_extend_and_decode_logits(runner)

    fused, split = logits(True), logits(False)
    assert counted == [False, False, True, True, True] * 2
    counted.clear()
    monkeypatch.setenv("SRT_FUSED_DECODE", "0")
    layered = logits(True)
    assert counted == [False] * 5
    for ours, theirs in zip(fused, layered, strict=True):
        assert torch.equal(ours, theirs)
    assert not any(torch.equal(a, b) for a, b in zip(fused[2:], split[2:], strict=True))


def shared_prefix_logits(runner: ModelRunner) -> list[torch.Tensor]:
    """`runner_extend_and_decode_logits` with the cascade offered wherever it would save a
    token; it is not taken, as the backend reads K/V in place."""
    backend = runner.attn_backend
    assert isinstance(backend, CpuAttnBackend)
    backend.cascade_min_saved = 1
    logits = runner_extend_and_decode_logits(runner)
    assert backend._cascade is None
    return logits


def test_shared_prefixes_decode_through_the_stack(
    tiny_model_factory: TinyModelFactory,
    monkeypatch: pytest.MonkeyPatch,
    counted: list[bool],
) -> None:
    """A step whose sequences share cached prefix slots runs fused, with the layers' bits: both
    read the shared rows in place (the cascade is for gathered K/V only)."""
    runner = quantized_runner(tiny_model_factory, "llama", every_matrix("q4_1"), "float32")
    fused = shared_prefix_logits(runner)
    assert counted == [False, False, True, True, True]
    counted.clear()
    monkeypatch.setenv("SRT_FUSED_DECODE", "0")
    layered = quantized_runner(tiny_model_factory, "llama", every_matrix("q4_1"), "float32")
    in_layers = shared_prefix_logits(layered)
    assert counted == [False] * 5
    for ours, theirs in zip(fused, in_layers, strict=True):
        assert torch.equal(ours, theirs)


def test_batches_at_a_crossover_and_float_weights_take_the_layers(
    tiny_model_factory: TinyModelFactory,
    monkeypatch: pytest.MonkeyPatch,
    counted: list[bool],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # As if measured: products of 3 rows and more go dense, in the layers and so in the stack.
    monkeypatch.setattr(quant_kernels, "_plans", {})
    monkeypatch.setattr(
        quant_kernels, "_measure_plan", lambda weight, dtype, offered: ((0, KERNEL), (3, DENSE))
    )
    runner = quantized_runner(tiny_model_factory, "llama", every_matrix("q4_1"), "float32")
    runner_extend_and_decode_logits(runner)  # decode steps of 3 sequences
    assert counted == [False] * 5
    counted.clear()
    with caplog.at_level(logging.INFO, logger="srt.model_executor.cpu_decode"):
        runner_extend_and_decode_logits(make_runner(tiny_model_factory("llama")))
    assert counted == [False] * 5  # float weights: no quantized projection
    said = [r.getMessage() for r in caplog.records if r.name == "srt.model_executor.cpu_decode"]
    assert said == [
        "decode steps run layer by layer, not in one Rust call: qkv is not a GGUF-quantized weight"
    ]


def stack_args(dtype: torch.dtype) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """One layer's `LayerSpec` fields (hidden 32, 2 heads of 16 sharing one KV head,
    intermediate 32) with q8_0 weights in blocks; its K and V caches of 8 slots."""
    generator = torch.Generator().manual_seed(0)

    def projection(n: int, k: int) -> _rust.ProjectionSpec:
        weight = QuantizedWeight(
            torch.randint(0, 256, (n, k // 32 * 34), dtype=torch.uint8, generator=generator),
            "q8_0",
            k,
        )
        # Scales of ordinary size (half precision 0.01) instead of random bits.
        weight._unpacked_blocks().view(n, -1, 34)[:, :, :2] = torch.tensor(
            [0x1F, 0x21], dtype=torch.uint8
        )
        return _rust.ProjectionSpec(
            format="q8_0",
            packed=False,
            weight=weight.held,
            out_features=n,
            in_features=k,
            bias=None,
            one_int8_from=None,
        )

    k_cache, v_cache = (torch.randn(8, 1, 16, generator=generator).to(dtype) for _ in range(2))
    norm = torch.ones(32, dtype=dtype)
    view = cpu_kernels._view
    layer = {
        "input_norm": view(norm),
        "qkv": projection(64, 32),
        "o": projection(32, 32),
        "post_norm": view(norm.clone()),
        "gate_up": projection(64, 32),
        "down": projection(32, 32),
        "k_cache": view(k_cache),
        "v_cache": view(v_cache),
    }
    return layer, k_cache, v_cache


def step_inputs(dtype: torch.dtype, out_slot: int) -> list[np.ndarray]:
    view = cpu_kernels._view
    hidden, residual = torch.randn(1, 32).to(dtype), torch.zeros(1, 32, dtype=dtype)
    cos, sin = torch.ones(1, 16, dtype=dtype), torch.zeros(1, 16, dtype=dtype)
    slots = np.array([[3, 5, out_slot]], dtype=np.int32)
    return [
        view(hidden),
        view(residual),
        view(cos),
        view(sin),
        np.array([out_slot], dtype=np.int64),
        slots,
        np.array([3], dtype=np.int32),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_binding_refuses_bad_steps_and_changes_nothing(dtype: torch.dtype) -> None:
    layer, k_cache, v_cache = stack_args(dtype)
    stack = _rust.DecoderStack(2, 1, 16, 1e-5, 0.25, [_rust.LayerSpec(**layer)])
    assert len(stack) == 1
    before = v_cache.clone()
    stack.decode(*step_inputs(dtype, 7))
    written = k_cache.clone()
    assert not torch.equal(v_cache[7], before[7])  # the new token's V
    assert torch.equal(v_cache[:7], before[:7])
    bad_slot = step_inputs(dtype, 8)  # the caches hold slots 0..7
    with pytest.raises(ValueError, match="output slot 8 is outside"):
        stack.decode(*bad_slot)
    aliased = step_inputs(dtype, 6)
    aliased[1] = aliased[0]  # the residual is the hidden state
    with pytest.raises(ValueError, match="must not overlap"):
        stack.decode(*aliased)
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
    with pytest.raises(ValueError, match="stack's type"):
        stack.decode(*step_inputs(other, 6))
    assert torch.equal(k_cache, written)


def test_the_binding_refuses_caches_that_overlap() -> None:
    layer, k_cache, _ = stack_args(torch.float32)
    shared = _rust.LayerSpec(**{**layer, "v_cache": cpu_kernels._view(k_cache)})  # V is K
    with pytest.raises(ValueError, match="overlaps"):
        _rust.DecoderStack(2, 1, 16, 1e-5, 0.25, [shared])
    mixed = _rust.LayerSpec(**{**layer, "k_cache": cpu_kernels._view(k_cache.to(torch.bfloat16))})
    with pytest.raises(ValueError, match="all be float32 or all int16"):
        _rust.DecoderStack(2, 1, 16, 1e-5, 0.25, [mixed])
    with pytest.raises(TypeError):
        _rust.LayerSpec(**{**layer, "qkv": layer["input_norm"]})  # not a ProjectionSpec
    with pytest.raises(ValueError, match="q9_9"):
        _rust.ProjectionSpec(
            format="q9_9",
            packed=False,
            weight=np.zeros(34, dtype=np.uint8),
            out_features=1,
            in_features=32,
            bias=None,
            one_int8_from=None,
        )


def test_the_binding_refuses_a_malformed_mixture() -> None:
    layer, _, _ = stack_args(torch.float32)
    router = np.zeros((2, 32), dtype=np.float32)  # two experts' rows
    with pytest.raises(ValueError, match="a gate_up and a down projection per expert, not 2 and 1"):
        _rust.MoeSpec(
            router=router,
            gate_up=[layer["gate_up"]] * 2,
            down=[layer["down"]],
            top_k=1,
            renormalize=True,
        )
    moe = _rust.MoeSpec(
        router=router, gate_up=[layer["gate_up"]], down=[layer["down"]], top_k=1, renormalize=True
    )
    with pytest.raises(ValueError, match="gate_up and down, or moe"):
        _rust.LayerSpec(**{**layer, "moe": moe})  # two feed-forwards
    sparse = _rust.LayerSpec(**{**layer, "gate_up": None, "down": None, "moe": moe})
    stack = _rust.DecoderStack(2, 1, 16, 1e-5, 0.25, [sparse])
    with pytest.raises(ValueError, match="the router has 64 floats, expected 32"):
        stack.decode(*step_inputs(torch.float32, 7))  # one expert
