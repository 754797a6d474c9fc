"""llama.cpp's logits at every position of token sequences, through its Python bindings: run in
the environment `Installer.llama_bindings` gives (`peers/fidelity.py` does).

    python llama_logits.py MODEL.gguf SEQUENCES.json OUT.npz

SEQUENCES.json is a list of token-id lists; OUT.npz holds `arr_<i>` (float32, `[len, vocab]`) for
sequence i, each evaluated from an empty context as it is given (no BOS added).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from llama_cpp import Llama  # type: ignore[import-not-found]


def main() -> int:
    model, sequences_file, out = sys.argv[1:]
    with open(sequences_file) as f:
        sequences: list[list[int]] = json.load(f)
    context = max(len(s) for s in sequences)
    llm = Llama(
        model_path=model,
        n_ctx=context,
        n_batch=context,
        n_threads=len(os.sched_getaffinity(0)),
        logits_all=True,
        verbose=False,
    )
    logits = []
    for tokens in sequences:
        llm.reset()
        llm.eval(tokens)
        logits.append(np.array(llm.scores[: len(tokens)], dtype=np.float32))
    np.savez(out, *logits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
