"""Incremental detokenization for the DetokenizerManager: token ids in, complete text out.

A thin facade over `srt._rust.IncrementalDetokenizer` (this module is its only importer). One
object holds the decode state of every in-flight request, keyed by request id:

- `step`/`step_batch` take each request's new token ids and return the text they complete. No
  piece ends inside a UTF-8 character; bytes that can no longer become one (a run of lead bytes
  a `logit_bias` forces, say) come out as U+FFFD a few tokens later, as `decode` gives them,
  never held to the end of the request. For every id sequence the pieces of a request
  (including `finish`'s) concatenate to what Hugging Face transformers 5 returns for
  `tokenizer.decode(ids, skip_special_tokens=..., spaces_between_special_tokens=...)`.
  transformers 5 decodes `tokenizer.json` tokenizers (`TokenizersBackend`) with
  `tokenizers.Tokenizer.decode(ids, skip_special_tokens)` and ignores
  `spaces_between_special_tokens`, a setting of its slow sentencepiece tokenizers (so it has
  no effect here either and is not taken). transformers' BPE tokenizers also
  skip `clean_up_tokenization_spaces` (every LLM tokenizer srt serves is BPE); it is not applied.
- With `prompt_ids`, the last `PROMPT_CONTEXT_TOKENS` of them are decoded ahead of the output,
  as SGLang and vLLM do, so the first output token keeps the leading space that sentencepiece
  style decoders strip at the start of a sequence; the output text is then
  `decode(context + ids)` minus `decode(context)`. Byte-level tokenizers give the same text
  either way.
- Stop strings are not this module's business: the scheduler finds them and the
  DetokenizerManager cuts the text where it is told (`srt.managers.stop_strings`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from srt import _rust

# How many prompt tokens to decode ahead of the output: SGLang's and vLLM's value (their
# INIT[IAL]_INCREMENTAL_DETOKENIZATION_OFFSET); LLM tokenizers' decoders look back one token.
PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """The incremental detokenizer of one model, for many requests at once."""

    def __init__(self, tokenizer_path: str | os.PathLike[str]) -> None:
        """Loads `tokenizer.json`, given as the file or the model directory that holds it."""
        path = Path(tokenizer_path)
        if path.is_dir():
            path = path / "tokenizer.json"
        self._rust = _rust.IncrementalDetokenizer(str(path))

    def add_request(
        self, rid: str, *, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True
    ) -> None:
        """Starts request `rid` (ValueError if it is already held)."""
        context = prompt_ids[-PROMPT_CONTEXT_TOKENS:] if prompt_ids else ()
        self._rust.add_request(rid, skip_special_tokens=skip_special_tokens, context_ids=context)

    def step(self, rid: str, new_ids: Sequence[int]) -> str:
        """Feeds `rid`'s next token ids; returns the text they complete."""
        return self._rust.step(rid, new_ids)

    def step_batch(self, rids: Sequence[str], new_ids: Sequence[Sequence[int]]) -> list[str]:
        """`step` for many requests in one call (the GIL is released meanwhile); a request may
        appear more than once, its steps then run in order. Every rid is checked first: an
        unknown one raises ValueError and changes nothing."""
        return self._rust.step_batch(rids, new_ids)

    def finish(self, rid: str) -> str:
        """Ends `rid` and returns the text held back until now (an incomplete character comes
        out as U+FFFD, as `decode` gives it). The request stays held until `free`."""
        return self._rust.finish(rid)

    def free(self, rid: str) -> None:
        """Forgets `rid` (ValueError if it is not held)."""
        self._rust.free(rid)

    def __len__(self) -> int:
        return len(self._rust)

    def __contains__(self, rid: object) -> bool:
        return isinstance(rid, str) and rid in self._rust
