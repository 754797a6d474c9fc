"""Where a server's tokenizer comes from: `--tokenizer-path`, else `--model-path`, each a model
directory, a hub id, or a GGUF file (whose tokenizer transformers reads with `gguf_file=`).

The main process tokenizes with transformers' tokenizer; the detokenizer's Rust incremental
detokenizer reads a `tokenizer.json`, which is the model directory's own file when there is one
and otherwise the same tokenizer's fast backend written out (GGUF files and hub ids).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from srt.server_args import ServerArgs, split_gguf_path

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def tokenizer_source(server_args: ServerArgs) -> tuple[str, str | None]:
    """(directory or hub id, GGUF file name or None) of the server's tokenizer."""
    path = server_args.tokenizer_path or server_args.model_path
    if path is None:
        raise ValueError("a tokenizer needs --tokenizer-path or --model-path")
    return split_gguf_path(path)


def load_tokenizer(server_args: ServerArgs) -> PreTrainedTokenizerBase:
    """The server's tokenizer, as transformers loads it."""
    from transformers import AutoTokenizer

    path, gguf_file = tokenizer_source(server_args)
    if path != "" and not Path(path).exists() and Path(path).is_absolute():
        raise ValueError(f"no tokenizer at {path}: the directory does not exist")
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
        path, gguf_file=gguf_file, trust_remote_code=server_args.trust_remote_code
    )
    return tokenizer


@contextlib.contextmanager
def tokenizer_json(server_args: ServerArgs) -> Iterator[Path]:
    """A `tokenizer.json` of the server's tokenizer, valid inside the `with` block."""
    path, gguf_file = tokenizer_source(server_args)
    local = Path(path) / "tokenizer.json"
    if gguf_file is None and local.is_file():
        yield local
        return
    tokenizer = load_tokenizer(server_args)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(
            f"the tokenizer of {path} has no fast (tokenizers) backend, which the detokenizer needs"
        )
    with tempfile.TemporaryDirectory(prefix="srt-tokenizer-") as tmp:
        out = Path(tmp) / "tokenizer.json"
        backend.save(str(out))
        yield out
