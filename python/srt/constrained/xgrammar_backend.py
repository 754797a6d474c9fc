"""`GrammarBackend`: grammars compiled by xgrammar for one model's tokenizer, off the scheduler's
thread, cached by (kind, text).

The scheduler polls `status` while a constrained request waits (it is admitted once its grammar
is ready); compiles run one at a time on a worker thread (xgrammar releases the GIL while it
compiles), so a slow grammar delays no other request. The compiler itself (the tokenizer's
vocabulary, as xgrammar indexes it) is built on that thread too, on the first grammar.

JSON Schemas compile without free whitespace unless `any_whitespace` asks for it
(`--constrained-json-any-whitespace`; SGLang's `--constrained-json-disable-any-whitespace` is
the other way round): between JSON tokens only the separators `", "` and `": "` are allowed, or
a random or weak model pads with whitespace until its tokens run out.

A JSON Schema with strings bounded by `minLength`, `maxLength` or `pattern` compiles through
`schema_grammar` (srt writes those strings' rules: xgrammar's let control characters through and
leave escapes out); one with keywords xgrammar would not enforce is refused (`schema_rewrite`).

The tokenizer the compiler indexes also tokenizes the text a grammar forces, for jump-forward
decoding (`forced_tokenizer`).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

import xgrammar as xgr
from transformers import PreTrainedTokenizerFast

from srt.constrained.jump_forward import ForcedTokenizer
from srt.constrained.schema_grammar import schema_grammar
from srt.model_executor.worker_batch import GRAMMAR_COMPILING, GRAMMAR_READY, GrammarStatus
from srt.model_info import local_files

logger = logging.getLogger(__name__)

GrammarKey = tuple[str, str]  # (kind, text): `SamplingParams.grammar`

# How many compiled grammars (and refusals) are kept; the least recently asked for go first.
CACHE_CAPACITY = 256

# xgrammar's errors start with a timestamp and a C++ source location: not the client's concern.
_CPP_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")


class GrammarBackend:
    """Compiles and caches grammars for the tokenizer at `tokenizer_path` (as `--tokenizer-path`
    takes it), whose model's logits have `vocab_size` columns (which may exceed the tokenizer's
    vocabulary: the extra ids are never allowed); a grammar ends with one of `stop_token_ids`.
    With `any_whitespace`, JSON Schemas allow whitespace between JSON tokens."""

    def __init__(
        self,
        tokenizer_path: str,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        trust_remote_code: bool = False,
        any_whitespace: bool = False,
    ) -> None:
        self.tokenizer_path = tokenizer_path
        self.trust_remote_code = trust_remote_code
        self.any_whitespace = any_whitespace
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="srt-grammar")
        self.cache: OrderedDict[GrammarKey, Future[xgr.CompiledGrammar]] = OrderedDict()
        self._compiler: xgr.GrammarCompiler | None = None  # the worker thread's, once built
        self._forced_tokenizer: ForcedTokenizer | None = None  # built with the compiler
        self._compiler_lock = threading.Lock()

    def status(self, kind: str, text: str) -> GrammarStatus:
        """Where grammar (`kind`, `text`) stands, its compile started if it is new."""
        future = self._future((kind, text))
        if not future.done():
            return GRAMMAR_COMPILING
        error = future.exception()
        if error is not None:
            return GrammarStatus(error=f"sampling parameter {kind} is invalid: {_message(error)}")
        return GRAMMAR_READY

    def wait(self, kind: str, text: str) -> None:
        """Blocks until grammar (`kind`, `text`) has compiled or failed, its compile started
        if it is new."""
        wait_futures([self._future((kind, text))])

    def matcher(self, kind: str, text: str) -> xgr.GrammarMatcher:
        """A new matcher at the start of grammar (`kind`, `text`), which `status` said is
        ready (compiled again, waiting for it, if it left the cache since)."""
        compiled = self._future((kind, text)).result()
        return xgr.GrammarMatcher(compiled)

    def _future(self, key: GrammarKey) -> Future[xgr.CompiledGrammar]:
        future = self.cache.get(key)
        if future is not None:
            self.cache.move_to_end(key)
            return future
        future = self.executor.submit(self._compile, *key)
        self.cache[key] = future
        # Only finished compiles go: a pending one has a request waiting on it.
        while len(self.cache) > CACHE_CAPACITY:
            oldest = next((k for k, f in self.cache.items() if f.done()), None)
            if oldest is None:
                break
            del self.cache[oldest]
        return future

    def _compile(self, kind: str, text: str) -> xgr.CompiledGrammar:
        compiler = self.compiler()
        if kind == "json_schema":
            grammar = schema_grammar(text, self.any_whitespace)
            if grammar is not None:
                return compiler.compile_grammar(grammar)
            return compiler.compile_json_schema(text, any_whitespace=self.any_whitespace)
        if kind == "regex":
            return compiler.compile_regex(text)
        if kind == "ebnf":
            return compiler.compile_grammar(text)
        raise ValueError(f"unknown grammar kind {kind!r}")

    def compiler(self) -> xgr.GrammarCompiler:
        """The compiler, built on first use (on the worker thread, unless a test asks)."""
        with self._compiler_lock:
            if self._compiler is None:
                # The directory the main process tokenizes from (a GGUF file's written out).
                directory = local_files(
                    self.tokenizer_path, "tokenizer.json", self.trust_remote_code
                )
                tokenizer = PreTrainedTokenizerFast(
                    tokenizer_file=str(directory / "tokenizer.json")
                )
                info = xgr.TokenizerInfo.from_huggingface(
                    tokenizer,
                    vocab_size=self.vocab_size,
                    stop_token_ids=self.stop_token_ids or None,  # None: xgrammar finds them
                )
                # This backend keeps the cache; one thread: the scheduler's CPU is the model's.
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
                self._forced_tokenizer = ForcedTokenizer(
                    tokenizer.backend_tokenizer, info.decoded_vocab
                )
                logger.info("grammar compiler ready (vocabulary %d)", self.vocab_size)
            return self._compiler

    def forced_tokenizer(self) -> ForcedTokenizer:
        """The tokenizer of forced text (built with the compiler, before any matcher)."""
        self.compiler()
        assert self._forced_tokenizer is not None, "built with the compiler"
        return self._forced_tokenizer


def _message(error: BaseException) -> str:
    text = str(error).strip()
    return _CPP_PREFIX.sub("", text.splitlines()[0] if text else type(error).__name__)
