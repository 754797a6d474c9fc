"""The server's tokenizer, without transformers: a Hugging Face `tokenizer.json` run by the
`tokenizers` library, its special tokens and its chat template (`srt.chat_template`).

It comes from `--tokenizer-path` (which `ServerArgs` defaults to `--model-path`): a model
directory, a hub id, or a GGUF file, the last two written out once as a plain directory
(`srt.model_info.local_files`). The main process tokenizes with it; the detokenizer's Rust
incremental detokenizer reads the same `tokenizer.json`.

Encoding and decoding match transformers 5's for these files: its `TokenizersBackend` runs the
same `tokenizers.Tokenizer` (its post-processor adds the special tokens a model's encoding
starts with) and BPE tokenizers skip `clean_up_tokenization_spaces`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as FastTokenizer

from srt.chat_template import ChatTemplate
from srt.model_info import local_files, read_json
from srt.server_args import ServerArgs

# The special tokens transformers passes to a chat template by name.
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def tokenizer_files(server_args: ServerArgs) -> Path:
    """The local directory holding the server's `tokenizer.json` (and its config files)."""
    path = server_args.tokenizer_path  # ServerArgs defaults it to the model path
    if path is None:
        raise ValueError("a tokenizer needs --tokenizer-path or --model-path")
    return local_files(path, "tokenizer.json", server_args.trust_remote_code)


class Tokenizer:
    """A model's fast tokenizer and chat template."""

    def __init__(self, directory: Path) -> None:
        """Loads `directory`'s `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`
        and `chat_template.jinja` (the last three optional)."""
        self.directory = directory
        self.backend = FastTokenizer.from_file(str(directory / "tokenizer.json"))
        config = read_json(directory / "tokenizer_config.json")
        specials = {**read_json(directory / "special_tokens_map.json"), **config}
        self.special_tokens = {
            name: text
            for name in SPECIAL_TOKEN_NAMES
            if (text := _token_text(specials.get(name))) is not None
        }
        source = _chat_template_source(directory, config)
        self.chat_template = ChatTemplate(source, self.special_tokens) if source else None

    def __len__(self) -> int:
        """Ids the tokenizer knows, added tokens included (transformers' `len(tokenizer)`)."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> list[list[int]]:
        """`encode` of each text (in parallel threads, without the GIL)."""
        encodings = self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [list(e.ids) for e in encodings]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids` (every id must be below `len(self)`)."""
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The prompt text of a chat offered `tools` (`ChatTemplateError` if refused;
        ValueError if the model has no chat template)."""
        if self.chat_template is None:
            raise ValueError("the model has no chat template")
        return self.chat_template.render(messages, add_generation_prompt, tools)


def load_tokenizer(server_args: ServerArgs) -> Tokenizer:
    """The server's tokenizer."""
    return Tokenizer(tokenizer_files(server_args))


def _token_text(value: Any) -> str | None:
    """A special token as a config file gives it: its text, or an object with its `content`."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _chat_template_source(directory: Path, config: Mapping[str, Any]) -> str | None:
    """The default chat template: `chat_template.jinja`, else `tokenizer_config.json`'s (one
    string, or named templates of which `default` is the one)."""
    file = directory / "chat_template.jinja"
    if file.is_file():
        return file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None
