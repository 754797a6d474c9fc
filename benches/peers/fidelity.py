"""Next-token fidelity of the Q4_K_M file srt and llama-server serve (`llama-quantize`'s, from
the peers' f16 GGUF), for srt and for llama.cpp, against the same file dequantized to float32
(srt with `--quantization none`): teacher-forced top-1 agreement and mean KL on the chat prompts
of the Q4_1 test, each step fed the reference's greedy token, as the K-quant fidelity test
measures srt on its own Q4_K_M.

    python benches/peers/fidelity.py [--weights q4_k_m|f16] [--cache-dir DIR] [--json OUT]

srt runs in this process (bf16 activations where the CPU has AVX-512 BF16, and float32);
llama.cpp in a process of its own (`peers/llama_logits.py`) on each prompt followed by the
reference's tokens, its logits read at the same positions. `--weights f16` measures the same on
the f16 file the Q4_K_M one is quantized from: what the engines' arithmetic alone costs (srt's
bf16 activations, llama.cpp's f16 KV cache), the floor under the Q4_K_M figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCHES = HERE.parent
TESTS = BENCHES.parent / "tests"


def main(argv: list[str] | None = None) -> int:
    # This bench reads its helpers from benches/ and the fidelity test's prompts from tests/.
    sys.path[:0] = [str(BENCHES), str(TESTS)]
    import numpy as np
    import torch
    from bench_utils import emit
    from runner_helpers import (
        greedy_generate,
        make_runner,
        next_token_fidelity,
        teacher_forced_logits,
    )
    from test_gguf_kquant_fidelity import FIDELITY_TOKENS, KL_AT_MOST, TOP_1_AT_LEAST
    from test_quantized_model import chat_prompts

    from peers.install import Installer, default_cache_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="build jobs")
    parser.add_argument("--weights", choices=("q4_k_m", "f16"), default="q4_k_m")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    installer = Installer(args.cache_dir, args.jobs)
    models = installer.models(need_f16=args.weights == "f16", need_q4_k_m=True)
    gguf = models.gguf(args.weights)
    prompts = chat_prompts(models.hf_dir)
    reference = make_runner(gguf, quantization="none", max_total_tokens=4096)
    tokens = greedy_generate(reference, prompts, FIDELITY_TOKENS, banned=set())
    theirs = teacher_forced_logits(reference, prompts, tokens).log_softmax(-1)
    del reference

    engines: dict[str, torch.Tensor] = {}
    for dtype in ("auto", "float32"):
        served = make_runner(gguf, dtype=dtype, max_total_tokens=4096)
        name = f"srt, {served.model_config.dtype} activations".replace("torch.", "")
        engines[name] = teacher_forced_logits(served, prompts, tokens)
        del served

    bindings = installer.llama_bindings()
    with tempfile.TemporaryDirectory() as scratch:
        # Each prompt, then the reference's tokens but the last: the logits at its last prompt
        # position and after each fed token are the teacher-forced steps.
        sequences = Path(scratch) / "sequences.json"
        sequences.write_text(json.dumps([p + t[:-1] for p, t in zip(prompts, tokens, strict=True)]))
        out = Path(scratch) / "logits.npz"
        subprocess.run(
            [bindings.python, HERE / "llama_logits.py", gguf, sequences, out],
            env={**os.environ, **bindings.env},
            check=True,
        )
        with np.load(out) as saved:
            steps = [
                torch.from_numpy(saved[f"arr_{i}"][len(p) - 1 :]) for i, p in enumerate(prompts)
            ]
    engines["llama.cpp"] = torch.stack(steps, dim=1)

    results: dict[str, Any] = {
        "model": str(gguf),
        "prompts": len(prompts),
        "steps": FIDELITY_TOKENS,
        "targets": {"top_1_at_least": TOP_1_AT_LEAST, "mean_kl_at_most": KL_AT_MOST},
        "engines": {},
    }
    for name, logits in engines.items():
        same_top, kl = next_token_fidelity(logits.log_softmax(-1), theirs)
        results["engines"][name] = {"top_1_agreement": same_top, "mean_kl": kl}
        print(f"{name}: top-1 agreement {same_top:.3f}, mean KL {kl:.2e}", file=sys.stderr)
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
