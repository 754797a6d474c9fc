"""A byte-level BPE tokenizer trained, offline and in about a second, on text every machine has.

The corpus is the source of a fixed list of Python standard-library modules, so the tokenizer
is deterministic on one Python version. Being byte-level, it encodes any text; since the corpus
is ASCII-heavy, emoji and CJK characters split into several byte tokens, which is what
incremental-detokenizer tests need.
"""

from __future__ import annotations

import functools
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 1024

SPECIAL_TOKENS = {
    "bos": "<s>",
    "eos": "</s>",
    "pad": "<pad>",
    "im_start": "<|im_start|>",
    "im_end": "<|im_end|>",
    # Never produced by byte-level BPE; present because transformers' Qwen tokenizer classes add
    # it as their unknown token when a vocabulary lacks it, which would grow the vocabulary.
    "unk": "<|endoftext|>",
}

# ChatML, as SmolLM2 and Qwen use it, with tools the Hermes way (as Qwen 2.5's template offers
# them: a system block listing them, calls in <tool_call> tags); without tools, plain ChatML.
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\n<tools>' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    '{{ \'\n</tools>\nCall one with <tool_call>{"name": ..., "arguments": ...}</tool_call>'
    "<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% set f = call['function'] %}"
    "{{ '<tool_call>' + ({'name': f['name'], 'arguments': f['arguments']} | tojson) }}"
    "{{ '</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS_MODULES = (
    "argparse.py",
    "textwrap.py",
    "difflib.py",
    "json/decoder.py",
    "json/encoder.py",
    "string.py",
    "shlex.py",
    "fractions.py",
)


def _corpus() -> Iterator[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in _CORPUS_MODULES:
        yield from (stdlib / name).read_text(encoding="utf-8").splitlines(keepends=True)


@functools.lru_cache(maxsize=1)
def _trained_json() -> str:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    return tokenizer.to_str()


def train_byte_level_bpe(add_bos: bool) -> Tokenizer:
    """A fresh copy of the trained tokenizer; with `add_bos`, encoding prepends `<s>`."""
    tokenizer = Tokenizer.from_str(_trained_json())
    bos = SPECIAL_TOKENS["bos"]
    if add_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tokenizer.token_to_id(bos))],
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer
