"""Generation on emulated CPUs that lack instructions this machine has: QEMU's user-mode
emulator (`qemu-x86_64`, Debian's qemu-user) runs a Python process on a CPU model whose CPUID
reports fewer features, and executing an instruction the model lacks is SIGILL there, as on a
real CPU. `-cpu max` has AVX2, FMA and F16C but no AVX-512 (the kernels' `avx2` tier); `-cpu
Nehalem` has no AVX at all (`scalar`; PyTorch's wheel runs there, on its default kernels).
scripts/emulated_cpus.sh runs the Rust tests on both.

The run (`generate`, this file run as a script) loads a tiny llama from a GGUF file holding Q4_0,
Q4_1, Q5_0, Q5_1 and Q8_0 blocks, or llama.cpp's Q4_K_M mix (Q4_K and Q6_K), and decodes greedily
in-process through every path the server takes on such a CPU, in float32 (what `--dtype auto` picks
without AVX-512 BF16): the weights packed into tiles where the CPU has an integer kernel, a prefill
rounding activations to int8, one that takes the dense path (the weight dequantized for PyTorch's
matmul), and decode steps of 1 and of 16 sequences in the fused decode stack (its one-int8 products
from 16 rows; the Q4_K_M file's qkv projection is in parts of Q4_K and Q6_K). The plans are set, not
measured (timings under emulation mean nothing), to reach each path. Its tokens must equal those of
the same run on this machine with the kernels capped at the emulated CPU's tier (`SRT_CPU_ISA`):
below AVX2 the products run on blocks in float32, not on tiles, and that changed one of the 17
sequences' tokens at a near tie, measured.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

# The tiny llama's tensors in the five formats of blocks of 32 (fused shards share theirs, so that
# every projection stays in blocks), under GGUF's names.
BLOCK_FORMATS = {
    "embed_tokens": "q4_0",
    "lm_head": "q8_0",
    "self_attn.q_proj": "q8_0",
    "self_attn.k_proj": "q8_0",
    "self_attn.v_proj": "q8_0",
    "self_attn.o_proj": "q5_0",
    "mlp.gate_proj": "q4_1",
    "mlp.up_proj": "q4_1",
    "mlp.down_proj": "q5_1",
}
# From how many rows a product takes the dense path (prefill of the 16 prompts: more rows; of
# the one prompt: fewer, so the one-int8 kernel).
DENSE_FROM = 64
PROMPT_LENGTHS = (20,) + (5,) * 16
NEW_TOKENS = 4
# QEMU's CPU model -> the kernels' tier it has (`cpu_kernels.isa()`).
EMULATED_TIERS = {"max": "avx2", "Nehalem": "scalar"}
# An emulated run took 30 to 50 s on a busy 2-core machine.
EMULATED_TIMEOUT_S = 900


def block_format(name: str) -> str | None:
    module = name.removesuffix(".weight").removeprefix("model.")
    if module.startswith("layers."):
        module = module.split(".", 2)[2]
    return BLOCK_FORMATS.get(module)


@pytest.fixture(scope="module", params=["blocks of 32", "Q4_K_M"])
def tiny_gguf(
    request: pytest.FixtureRequest,
    tiny_model_factory: Callable[[str], Path],
    tiny_k_model: Callable[[str], Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The tiny llama as a GGUF file of blocks of 32 (`BLOCK_FORMATS`), or the `tiny-k` llama
    in llama.cpp's Q4_K_M mix, beside its config and tokenizer (a directory marked as prepared,
    as the default model's is, so that they are read from there)."""
    from test_quantized_loading import gguf_name, write_gguf

    from srt.model_info import _DONE_MARKER
    from srt.testing.tiny_gguf import write_tiny_gguf

    k_quants = request.param == "Q4_K_M"
    source = tiny_k_model("llama") if k_quants else tiny_model_factory("llama")
    directory = tmp_path_factory.mktemp("tiny-gguf")
    for file in source.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, directory)
    gguf = directory / f"tiny.{request.param.replace(' ', '-')}.gguf"
    if k_quants:
        write_tiny_gguf(source, gguf, "Q4_K_M")
    else:
        write_gguf(source, gguf, lambda name: (gguf_name(name)[0], block_format(name)))
    (directory / _DONE_MARKER).write_text("the tiny llama, written by test_emulated_cpus\n")
    return gguf


def run_generate(gguf: Path, emulator: list[str], isa: str | None) -> dict[str, Any]:
    """`generate`'s answer from a child process, under `emulator` (a command prefix) and with
    `SRT_CPU_ISA=isa` when given."""
    env = {name: value for name, value in os.environ.items() if name != "SRT_CPU_ISA"}
    if isa is not None:
        env["SRT_CPU_ISA"] = isa
    # The interpreter itself, not a wrapper script (QEMU runs ELF files); on SIGILL, the
    # faulthandler prints the Python stack that reached the instruction.
    python = os.path.realpath(sys.executable)
    started = time.monotonic()
    done = subprocess.run(
        [*emulator, python, "-X", "faulthandler", __file__, str(gguf)],
        env=env,
        capture_output=True,
        text=True,
        timeout=EMULATED_TIMEOUT_S,
        check=False,
    )
    print(f"{' '.join(emulator) or 'native'}: {time.monotonic() - started:.0f} s")
    status = done.returncode
    ended = f"killed by {signal.Signals(-status).name}" if status < 0 else f"exit status {status}"
    assert status == 0, f"{ended}:\n{done.stderr[-4000:]}"
    answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return answer


def qemu() -> str:
    """qemu-x86_64's path; where it is missing, a failure in CI (scripts/test.sh installs it)
    and a skip elsewhere."""
    found = shutil.which("qemu-x86_64")
    if found is None:
        reason = "needs qemu-x86_64 (Debian's qemu-user; scripts/test.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return found


@pytest.mark.slow
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="emulates x86-64 CPUs")
@pytest.mark.parametrize("cpu", list(EMULATED_TIERS))
def test_an_emulated_cpu_generates_the_native_tokens(tiny_gguf: Path, cpu: str) -> None:
    emulator = [qemu(), "-cpu", cpu]
    tier = EMULATED_TIERS[cpu]
    emulated = run_generate(tiny_gguf, emulator, None)
    assert emulated["isa"] == [tier, tier]
    native = run_generate(tiny_gguf, [], tier)
    assert native["isa"][0] == tier
    assert emulated["tokens"] == native["tokens"]
    assert emulated == {**native, "isa": emulated["isa"]}
    # Every path was reached: on tiles (AVX2) the one-int8 kernel too, the K-quants' included;
    # a decode step of 1 and one of 16 sequences ran fused (the Q4_K_M file's qkv in parts).
    tiles = tier != "scalar"
    one_int8 = {"_one_int8"} if tiles else set()
    assert emulated["packed"] == tiles
    assert set(emulated["paths"]) == {"_kernel", "_dense"} | one_int8
    assert emulated["fused"] == {"1": NEW_TOKENS - 1, "16": NEW_TOKENS - 1}


def generate(gguf: Path) -> dict[str, Any]:
    """Greedy tokens of one prompt, then of 16, and which paths the products took."""
    from runner_helpers import greedy_generate, make_runner

    from srt.kernels.cpu import cpu_kernels, quant_kernels
    from srt.kernels.cpu.quant_kernels import DENSE, INT8_ACTIVATION_MIN_ROWS, KERNEL, ONE_INT8
    from srt.kernels.cpu.quant_kernels import QuantizedWeight as Weight
    from srt.model_executor.cpu_decode import CpuDecodeExecutor

    def plan(weight: Weight, dtype: torch.dtype, offered: bool) -> quant_kernels.Plan:
        one_int8 = ((INT8_ACTIVATION_MIN_ROWS, ONE_INT8),) if offered else ()
        return ((0, KERNEL), *one_int8, (DENSE_FROM, DENSE))

    paths: Counter[str] = Counter()
    fused: Counter[str] = Counter()

    def counted_path(name: str) -> Callable[..., torch.Tensor]:
        method = getattr(Weight, name)

        def path(self: Weight, rows: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            paths[name] += 1
            return method(self, rows, bias)

        return path

    run = CpuDecodeExecutor.run

    def counted_run(self: CpuDecodeExecutor, *args: Any) -> bool:
        ran = run(self, *args)
        fused[str(args[-1].batch_size)] += ran
        return ran

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quant_kernels, "_measure_plan", plan)
        for name in (KERNEL, ONE_INT8, DENSE):
            patch.setattr(Weight, name, counted_path(name))
        patch.setattr(CpuDecodeExecutor, "run", counted_run)
        runner = make_runner(gguf, max_total_tokens=256, max_running_requests=16)
        vocab = runner.model_config.vocab_size
        prompts = [
            [(7 + 31 * i + 13 * j) % vocab for j in range(n)] for i, n in enumerate(PROMPT_LENGTHS)
        ]
        tokens = [greedy_generate(runner, prompts[:1], NEW_TOKENS, banned=set())]
        tokens.append(greedy_generate(runner, prompts[1:], NEW_TOKENS, banned=set()))
    o_proj = runner.model.get_submodule("model.layers.0.self_attn.o_proj").quant
    return {
        "isa": list(cpu_kernels.isa()),
        "packed": isinstance(o_proj, Weight) and o_proj.packed,
        "paths": sorted(paths),
        "fused": dict(fused),
        "tokens": tokens,
    }


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    print(json.dumps(generate(Path(sys.argv[1]))))
