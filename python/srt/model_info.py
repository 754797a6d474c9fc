"""What the main and detokenizer processes need to know about a model, read from plain files.

Those two processes never import torch or transformers' model code (docs/design.md §7), so they
read the model the cheap way: `config.json` and `generation_config.json` for the context length,
the vocabulary size and the EOS ids; `tokenizer.json`, `tokenizer_config.json` and
`chat_template.jinja` for the tokenizer (`managers/hf_tokenizer.py`).

A local Hugging Face directory holding a `tokenizer.json` is read in place, and so is a GGUF file
inside a directory srt prepared from it (marked `.srt-prepared`, as the default model's is).
Anything else (a GGUF file, a hub id, a directory with only a slow tokenizer) is first written
out as such a directory, once, by transformers in a child process (`python -m srt.model_info`),
into the srt cache directory: the child imports torch, this process does not. Its key is the
source's path and, for local files, their sizes and modification times, so a changed file is
prepared again; a hub id is prepared once (remove the cache directory to refresh it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srt import envs
from srt.server_args_check import split_gguf_path

_DONE_MARKER = ".srt-prepared"


def local_files(path: str, need: str, trust_remote_code: bool = False) -> Path:
    """A local directory with the config and fast-tokenizer files of model or tokenizer `path`
    (a directory, a GGUF file or a hub id): `path` itself when it is a directory holding file
    `need` (the directory of a GGUF file that srt prepared it into), else prepared in a child
    process on first use. ValueError if `path` names a local path that does not exist."""
    if path.startswith(("/", ".", "~")) and not Path(path).expanduser().exists():
        what = "tokenizer" if need == "tokenizer.json" else "model"
        raise ValueError(f"no {what} at {path}: the path does not exist")
    directory, gguf_file = split_gguf_path(path)
    local = Path(directory).expanduser()
    if (local / need).is_file() and (gguf_file is None or beside_hf_files(path)):
        return local
    target = envs.cache_dir() / "model-files" / _key(path)
    if (target / _DONE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # The main and detokenizer processes start at once: one prepares, the other waits for it.
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / _DONE_MARKER).is_file():
            _prepare_in_child(path, target, trust_remote_code)
    return target


def beside_hf_files(path: str) -> bool:
    """Whether `path` is a GGUF file in a directory srt prepared from it (`.srt-prepared`, as
    the default model's is), whose Hugging Face files then stand for it: reading them is
    quicker than the GGUF file's metadata (a vocabulary of tens of thousands of strings)."""
    directory, gguf_file = split_gguf_path(path)
    local = Path(directory).expanduser()
    return gguf_file is not None and (local / _DONE_MARKER).is_file()


def _prepare_in_child(path: str, target: Path, trust_remote_code: bool) -> None:
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        command = [sys.executable, "-m", "srt.model_info", path, str(staging)]
        if trust_remote_code:
            command.append("--trust-remote-code")
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            why = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
            raise ValueError(f"cannot read the tokenizer and config of {path}: {why[0]}")
        (staging / _DONE_MARKER).write_text(f"prepared from {path}\n")
        shutil.rmtree(target, ignore_errors=True)  # an unfinished earlier attempt
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _key(path: str) -> str:
    source = Path(path).expanduser()
    parts = [str(source.resolve()) if source.exists() else path]
    files = sorted(source.iterdir()) if source.is_dir() else [source] if source.exists() else []
    for file in files:
        if file.is_file():
            stat = file.stat()
            parts.append(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, or {} when the file does not exist."""
    if not path.is_file():
        return {}
    value = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return value


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """The model facts the main and detokenizer processes use."""

    context_length: int
    """Longest prompt + output: `--context-length`, else the model's positions."""
    vocab_size: int
    """Rows of the model's embedding (the tokenizer may know fewer or more ids)."""
    eos_token_ids: frozenset[int]

    @classmethod
    def read(
        cls, model_path: str, context_length: int | None = None, trust_remote_code: bool = False
    ) -> ModelInfo:
        """The facts of `model_path`; ValueError when `context_length` exceeds the model's."""
        directory = local_files(model_path, "config.json", trust_remote_code)
        config = read_json(directory / "config.json")
        # Multimodal configs nest the language model's fields.
        config = config.get("text_config") or config
        model_max = max_context(config)
        if context_length is not None and context_length > model_max:
            raise ValueError(
                f"--context-length {context_length} exceeds the model's {model_max} positions"
            )
        eos = _ids(config.get("eos_token_id"))
        eos |= _ids(read_json(directory / "generation_config.json").get("eos_token_id"))
        return cls(
            context_length=context_length or model_max,
            vocab_size=int(config["vocab_size"]),
            eos_token_ids=frozenset(eos),
        )


def max_context(config: dict[str, Any]) -> int:
    """The longest sequence the model serves: its positions, and no more than a Mistral-style
    sliding window (not implemented: serve only lengths where full attention is the same)."""
    limit = int(config["max_position_embeddings"])
    window = config.get("sliding_window")
    if window and config.get("use_sliding_window", True):
        limit = min(limit, int(window))
    return limit


def _ids(value: Any) -> set[int]:
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value} if value else set()


def _prepare(path: str, out: Path, trust_remote_code: bool) -> None:
    """Writes the config and fast tokenizer of `path` into `out` with transformers (in the
    child process: this is where torch may be imported)."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    directory, gguf_file = split_gguf_path(path)
    config = AutoConfig.from_pretrained(
        directory, gguf_file=gguf_file, trust_remote_code=trust_remote_code
    )
    config.save_pretrained(out)
    with contextlib.suppress(OSError):  # the model has none
        GenerationConfig.from_pretrained(directory, gguf_file=gguf_file).save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(
        directory, gguf_file=gguf_file, trust_remote_code=trust_remote_code
    )
    tokenizer.save_pretrained(out)
    if not (out / "tokenizer.json").is_file():
        raise ValueError(f"the tokenizer of {path} has no fast (tokenizers) backend")


if __name__ == "__main__":
    _prepare(sys.argv[1], Path(sys.argv[2]), "--trust-remote-code" in sys.argv[3:])
    os._exit(0)  # skip tearing torch down
