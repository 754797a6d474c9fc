"""`GenerateReqInput`: a generate request as a client gives it (SGLang's native `/generate`
schema, and the arguments of `Engine.generate`), before tokenization.

One input holds one prompt or a batch (text or token ids), each sampled `n` times. `expand`
checks it and turns it into one `ReqInput` per output, prompt-major (every sample of the first
prompt, then of the next). Each has its own request id (`<rid>-<j>` for the `j`-th of `n`
samples; a seeded request's `j`-th sample is seeded `seed + j`) and its sampling parameters as
keyword arguments for `SamplingParams`, with `max_new_tokens` None meaning "up to the context
length" (SGLang's meaning)."""

from __future__ import annotations

import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from srt.sampling_params import SamplingParams


@dataclass
class GenerateReqInput:
    """Exactly one of `text` and `input_ids`: a prompt (a string, or a list of ids) or a batch
    (a list of strings, or a list of id lists). The per-prompt fields take one value for every
    prompt or a list with one per prompt."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: Mapping[str, Any] | list[Mapping[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] = False
    top_logprobs_num: int | list[int] = 0
    stream: bool = False
    logprob_start_len: int | list[int] = -1
    """With `return_logprob`, also the logprobs of the prompt tokens from this position on
    (SGLang's meaning; -1: none)."""

    @property
    def is_single(self) -> bool:
        """Whether this is one prompt (not a batch, even of one)."""
        return isinstance(self.text, str) or (
            self.input_ids is not None and all(isinstance(t, int) for t in self.input_ids)
        )


@dataclass
class ReqInput:
    """One output of a `GenerateReqInput`: one prompt, sampled once."""

    index: int
    rid: str
    text: str | None
    input_ids: list[int] | None
    sampling_kwargs: dict[str, Any]
    return_logprob: bool
    top_logprobs_num: int
    stream: bool
    logprob_start_len: int = -1


def expand(obj: GenerateReqInput) -> list[ReqInput]:
    """The outputs `obj` asks for, in order; ValueError on anything malformed."""
    if (obj.text is None) == (obj.input_ids is None):
        raise ValueError("give exactly one of text and input_ids")
    if not isinstance(obj.stream, bool):
        raise ValueError(f"stream must be a boolean, got {obj.stream!r}")
    texts, ids = _prompts(obj)
    size = len(texts) if texts is not None else len(ids or ())
    if size == 0:
        raise ValueError("the batch holds no prompt")
    if isinstance(obj.rid, str) and not obj.is_single:
        raise ValueError("a batch needs a list of rids, one per prompt")
    params = _per_prompt(obj.sampling_params, size, "sampling_params", _is_mapping, "a mapping")
    rids = _per_prompt(obj.rid, size, "rid", _is_rid, "a non-empty string")
    logprob = _per_prompt(obj.return_logprob, size, "return_logprob", _is_bool, "a boolean")
    top = _per_prompt(obj.top_logprobs_num, size, "top_logprobs_num", _is_count, "an int >= 0")
    starts = _per_prompt(
        obj.logprob_start_len, size, "logprob_start_len", _is_start, "an int >= -1"
    )
    out: list[ReqInput] = []
    for i in range(size):
        kwargs = sampling_kwargs(params[i])
        n = kwargs.pop("n", 1)
        if n < 1:
            raise ValueError(f"sampling parameter n must be >= 1, got {n}")
        rid = rids[i] if rids[i] is not None else uuid.uuid4().hex
        for j in range(n):
            out.append(
                ReqInput(
                    index=len(out),
                    rid=rid if n == 1 else f"{rid}-{j}",
                    text=texts[i] if texts is not None else None,
                    input_ids=ids[i] if ids is not None else None,
                    sampling_kwargs=_sample_j(kwargs, j),
                    return_logprob=bool(logprob[i]),
                    top_logprobs_num=top[i] or 0,
                    stream=obj.stream,
                    logprob_start_len=starts[i] if logprob[i] and starts[i] is not None else -1,
                )
            )
    return out


def _sample_j(kwargs: dict[str, Any], j: int) -> dict[str, Any]:
    """The `j`-th sample's parameters: a seeded request's samples differ (seeds `seed + j`)."""
    out = dict(kwargs)
    if out.get("seed") is not None:
        out["seed"] += j
    return out


def _prompts(obj: GenerateReqInput) -> tuple[list[str] | None, list[list[int]] | None]:
    if obj.text is not None:
        texts = [obj.text] if isinstance(obj.text, str) else obj.text
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValueError("text must be a string or a list of strings")
        return texts, None
    raw = obj.input_ids
    if not isinstance(raw, list):
        raise ValueError("input_ids must be a list of token ids or a list of such lists")
    batch: list[Any] = raw if raw and not obj.is_single else [raw]
    for ids in batch:
        if not isinstance(ids, list) or not all(_is_int(t) and t >= 0 for t in ids):
            raise ValueError("input_ids must hold non-negative integer token ids")
    return None, batch


def _per_prompt(
    value: Any, size: int, name: str, ok: Callable[[Any], bool], wanted: str
) -> list[Any]:
    """`value` once per prompt: a list of `size` values, or one value for all (None: unset)."""
    if isinstance(value, list):
        if len(value) != size:
            raise ValueError(f"{name} has {len(value)} entries for {size} prompts")
        items = value
    else:
        items = [value] * size
    for item in items:
        if item is not None and not ok(item):
            raise ValueError(f"{name} must be {wanted} or a list of them, got {item!r}")
    return items


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return _is_int(value) and value >= 0


def _is_start(value: Any) -> bool:
    return _is_int(value) and value >= -1


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_rid(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _is_mapping(value: Any) -> bool:
    return isinstance(value, Mapping)


# ---- sampling parameters from JSON-like values -------------------------------------------


def sampling_kwargs(raw: Mapping[str, Any] | None) -> dict[str, Any]:
    """Keyword arguments for `SamplingParams` from a JSON-like dict: unknown names and values of
    the wrong type are rejected; a stop string may be one string; `logit_bias` maps token ids
    (as strings or ints) to biases; `max_new_tokens` may be None (filled in later)."""
    out: dict[str, Any] = {}
    for name, value in (raw or {}).items():
        convert = _CONVERTERS.get(name)
        if convert is None:
            known = ", ".join(sorted(_CONVERTERS))
            raise ValueError(f"unknown sampling parameter {name!r} (known: {known})")
        if value is None and name in ("max_new_tokens", "seed"):
            out[name] = None
            continue
        out[name] = convert(name, value)
    return out


def _fail(name: str, wanted: str, value: Any) -> typing.NoReturn:
    raise ValueError(f"sampling parameter {name} must be {wanted}, got {value!r}")


def _to_int(name: str, value: Any) -> int:
    if not _is_int(value):
        _fail(name, "an integer", value)
    return int(value)


def _to_float(name: str, value: Any) -> float:
    if not (_is_int(value) or isinstance(value, float)):
        _fail(name, "a number", value)
    return float(value)


def _to_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        _fail(name, "true or false", value)
    return value


def _to_strs(name: str, value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(s, str) for s in items):
        _fail(name, "a string or a list of strings", value)
    return tuple(items)


def _to_ints(name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not all(_is_int(t) for t in value):
        _fail(name, "a list of integers", value)
    return tuple(value)


def _to_logit_bias(name: str, value: Any) -> tuple[tuple[int, float], ...]:
    if not isinstance(value, Mapping):
        _fail(name, "a mapping of token ids to biases", value)
    pairs = []
    for key, bias in value.items():
        token = key if _is_int(key) else None
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            token = int(key)
        if token is None:
            _fail(name, "keyed by token ids", key)
        pairs.append((token, _to_float(name, bias)))
    return tuple(pairs)


_BY_TYPE: dict[Any, Callable[[str, Any], Any]] = {
    int: _to_int,
    float: _to_float,
    bool: _to_bool,
    tuple[str, ...]: _to_strs,
    tuple[int, ...]: _to_ints,
    int | None: _to_int,
    tuple[tuple[int, float], ...]: _to_logit_bias,
}
_CONVERTERS = {name: _BY_TYPE[hint] for name, hint in typing.get_type_hints(SamplingParams).items()}
