"""`SamplingParams`: how one request samples, with SGLang's field names and defaults.

A frozen record: the tokenizer manager builds it from the request JSON, it crosses to the
scheduler inside `TokenizedGenerateReq`, and the sampler reads it. Collections are tuples so that
the record stays immutable; `logit_bias` maps token ids to biases as `(token_id, bias)` pairs
(SGLang takes a dict with string keys; the tokenizer manager converts).

At most one of `json_schema` (a JSON Schema as JSON text), `regex` and `ebnf` (an EBNF grammar
whose start rule is `root`) constrains the output (SGLang's names): `grammar` gives it as a
(kind, text) pair, the key the runner compiles it under.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from srt.request_limits import RequestError


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None

    def __post_init__(self) -> None:
        """Rejects values no sampler can honour, with SGLang's ranges."""
        _check(self.max_new_tokens >= 0, "max_new_tokens", "must be >= 0")
        _check(
            0 <= self.min_new_tokens <= self.max_new_tokens,
            "min_new_tokens",
            "must be in [0, max_new_tokens]",
        )
        _check(_finite(self.temperature) and self.temperature >= 0, "temperature", "must be >= 0")
        _check(_finite(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        _check(self.top_k == -1 or self.top_k >= 1, "top_k", "must be -1 (off) or >= 1")
        _check(_finite(self.min_p) and 0 <= self.min_p <= 1, "min_p", "must be in [0, 1]")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            _check(_finite(value) and -2 <= value <= 2, name, "must be in [-2, 2]")
        rp = self.repetition_penalty
        _check(_finite(rp) and 0 < rp <= 2, "repetition_penalty", "must be in (0, 2]")
        _check(self.n >= 1, "n", "must be >= 1")
        _check(all(t >= 0 for t in self.stop_token_ids), "stop_token_ids", "must be >= 0")
        _check(all(s for s in self.stop), "stop", "must not contain empty strings")
        _check(
            all(t >= 0 and _finite(b) for t, b in self.logit_bias),
            "logit_bias",
            "needs token ids >= 0 and finite biases",
        )

        grammars = [name for name in GRAMMAR_KINDS if getattr(self, name) is not None]
        if len(grammars) > 1:
            raise RequestError(
                f"give at most one of json_schema, regex and ebnf, got {' and '.join(grammars)}",
                grammars[1],
            )
        _check(
            not grammars or self.min_new_tokens == 0,
            "min_new_tokens",
            "must be 0 with json_schema, regex or ebnf: the grammar decides where the output ends",
        )

    @property
    def grammar(self) -> tuple[str, str] | None:
        """The (kind, text) of the grammar constraining the output, if any."""
        for kind in GRAMMAR_KINDS:
            text = getattr(self, kind)
            if text is not None:
                return kind, text
        return None

    @property
    def is_greedy(self) -> bool:
        """Whether sampling reduces to argmax (temperature 0 or top-k 1)."""
        return self.temperature == 0 or self.top_k == 1


GRAMMAR_KINDS = ("json_schema", "regex", "ebnf")


def _finite(value: float) -> bool:
    return math.isfinite(value)


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise RequestError(f"sampling parameter {name} {message}", name)
