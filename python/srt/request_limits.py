"""What one request may ask for: the sizes an operator bounds (`RequestLimits`, from the
`ServerArgs` of the same names), the integer ranges every stage can carry, and `RequestError`,
the refusal that names the offending field.

Sizes are checked on the client's raw values, before anything is converted or built, so that a
refused request costs no more than reading it. The ranges exist because integers cross the rings
as int64 (token ids as int32) and index torch and numpy arrays: a value past them would fail deep
inside a stage instead of at the door.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from srt.server_args import ServerArgs
from srt.server_args_check import flag_of

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
TOKEN_ID_MAX = 2**31 - 1
"""Token ids cross the rings as int32 (and index the tokenizer's u32 vocabulary)."""


class RequestError(ValueError):
    """A request the server refuses because of one field: `param` names it as the client
    spelled it (OpenAI's error `param`), None when no single field is to blame."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def within(self, parent: str) -> RequestError:
        """The same refusal, its field named inside `parent` (`sampling_params.top_k`)."""
        param = parent if self.param is None else f"{parent}.{self.param}"
        return RequestError(str(self), param)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The operator's bounds on what one request may ask for (see the `ServerArgs` fields)."""

    max_n: int
    max_client_batch_size: int
    max_samples_per_request: int
    max_stop_sequences: int
    max_stop_sequence_length: int
    max_logprobs: int
    max_logit_bias_entries: int

    @classmethod
    def of(cls, args: ServerArgs) -> RequestLimits:
        return cls(
            max_n=args.max_n,
            max_client_batch_size=args.max_client_batch_size,
            max_samples_per_request=args.max_samples_per_request,
            max_stop_sequences=args.max_stop_sequences,
            max_stop_sequence_length=args.max_stop_sequence_length,
            max_logprobs=args.max_logprobs,
            max_logit_bias_entries=args.max_logit_bias_entries,
        )

    def check_prompts(self, count: int, param: str) -> None:
        """RequestError unless one request's `count` prompts are allowed."""
        self._at_most("max_client_batch_size", count, param, "prompts")

    def check_samples(self, total: int, param: str) -> None:
        """RequestError unless `total` samples (n times the prompts) are allowed."""
        self._at_most("max_samples_per_request", total, param, "samples (n times the prompts)")

    def check_logprobs(self, value: int, param: str) -> None:
        """RequestError unless `value` top logprobs per token are allowed."""
        if value > self.max_logprobs:
            raise RequestError(
                f"{param} must be at most {self.max_logprobs} (--max-logprobs), got {value}", param
            )

    def check_sampling_size(self, name: str, raw: Any) -> None:
        """RequestError (naming sampling parameter `name`) if the raw JSON value asks for more
        than allowed; values of the wrong type pass here and are refused by their converter."""
        if name == "n" and isinstance(raw, int) and raw > self.max_n:
            raise RequestError(f"n must be at most {self.max_n} (--max-n), got {raw}", name)
        if name == "stop":
            stops = [raw] if isinstance(raw, str) else raw
            if isinstance(stops, list | tuple):
                self._at_most("max_stop_sequences", len(stops), name, "stop strings")
                longest = max((len(s) for s in stops if isinstance(s, str)), default=0)
                if longest > self.max_stop_sequence_length:
                    raise RequestError(
                        f"stop strings must be at most {self.max_stop_sequence_length} characters "
                        f"long (--max-stop-sequence-length), got one of {longest}",
                        name,
                    )
        if name == "stop_token_ids" and isinstance(raw, list | tuple):
            self._at_most("max_stop_sequences", len(raw), name, "stop token ids")
        if name == "logit_bias" and isinstance(raw, Mapping):
            self._at_most("max_logit_bias_entries", len(raw), name, "entries")

    def _at_most(self, limit_name: str, count: int, param: str, what: str) -> None:
        limit = getattr(self, limit_name)
        if count > limit:
            raise RequestError(
                f"{param} holds {count} {what}; at most {limit} are allowed "
                f"({flag_of(limit_name)})",
                param,
            )
