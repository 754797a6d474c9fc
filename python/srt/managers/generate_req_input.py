"""`GenerateReqInput`: a generate request as a client gives it (SGLang's native `/generate`
schema, and the arguments of `Engine.generate`), before tokenization.

One input holds one prompt or a batch (text or token ids), or one chat (`messages`, which the
tokenizer manager renders with the model's chat template), each sampled `n` times. `expand`
checks it and turns it into one `ReqInput` per output, prompt-major (every sample of the first
prompt, then of the next). Each has its own request id (`<rid>-<j>` for the `j`-th of `n`
samples; a seeded request's `j`-th sample is seeded `seed + j`) and its sampling parameters as
keyword arguments for `SamplingParams`, with `max_new_tokens` None meaning "up to the context
length" (SGLang's meaning).

Every refusal is a `RequestError` naming its field, raised before any output is built: the
operator's `RequestLimits` bound the prompts, samples, stop strings, top logprobs and logit bias
entries of one input, and every integer is range-checked as it is read."""

from __future__ import annotations

import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from srt.managers.grammar_input import GRAMMAR_CONVERTERS
from srt.request_limits import INT64_MAX, INT64_MIN, TOKEN_ID_MAX, RequestError, RequestLimits
from srt.sampling_params import SamplingParams


@dataclass
class GenerateReqInput:
    """Exactly one of `text`, `input_ids` and `messages`: a prompt (a string, or a list of ids),
    a batch (a list of strings, or a list of id lists), or one chat. The per-prompt fields take
    one value for every prompt or a list with one per prompt."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    messages: list[Mapping[str, Any]] | None = None
    """A chat's messages as a chat template takes them (`role`, `content`, ...): one prompt,
    rendered and tokenized by the tokenizer manager. Not part of SGLang's `/generate` schema:
    the OpenAI chat API and the Engine give it."""
    tools: list[Mapping[str, Any]] | None = None
    """With `messages`: the tools the chat template renders into the prompt (OpenAI's
    `{"type": "function", "function": {...}}` objects, as transformers' templates take them)."""
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
        return (
            isinstance(self.text, str)
            or self.messages is not None
            or (self.input_ids is not None and all(isinstance(t, int) for t in self.input_ids))
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
    messages: list[Mapping[str, Any]] | None = None
    """A chat to render into the prompt (then `text` and `input_ids` are None)."""
    tools: list[Mapping[str, Any]] | None = None
    """The tools the chat's template renders."""


def expand(obj: GenerateReqInput, limits: RequestLimits) -> list[ReqInput]:
    """The outputs `obj` asks for, in order; RequestError on anything malformed or beyond
    `limits`, before any output is built."""
    if [obj.text, obj.input_ids, obj.messages].count(None) != 2:
        raise RequestError("give exactly one of text and input_ids")
    if not isinstance(obj.stream, bool):
        raise RequestError(f"stream must be a boolean, got {obj.stream!r}", "stream")
    texts, ids = _prompts(obj, limits)
    if obj.messages is not None:
        _check_messages(obj.messages)
    size = len(texts) if texts is not None else len(ids or ()) if ids is not None else 1
    if size == 0:
        raise RequestError("the batch holds no prompt", "input_ids" if texts is None else "text")
    if isinstance(obj.rid, str) and not obj.is_single:
        raise RequestError("a batch needs a list of rids, one per prompt", "rid")
    params = _per_prompt(obj.sampling_params, size, "sampling_params", _is_mapping, "a mapping")
    rids = _per_prompt(obj.rid, size, "rid", _is_rid, "a non-empty string")
    logprob = _per_prompt(obj.return_logprob, size, "return_logprob", _is_bool, "a boolean")
    top = _per_prompt(obj.top_logprobs_num, size, "top_logprobs_num", _is_count, "an int >= 0")
    starts = _per_prompt(
        obj.logprob_start_len, size, "logprob_start_len", _is_start, "an int >= -1"
    )
    for value in top:
        limits.check_logprobs(value or 0, "top_logprobs_num")
    kwargs = []
    converted: dict[int, dict[str, Any]] = {}  # one mapping given for every prompt: read once
    for raw in params:
        if id(raw) not in converted:
            try:
                converted[id(raw)] = sampling_kwargs(raw, limits)
            except RequestError as e:
                raise e.within("sampling_params") from e
        kwargs.append(dict(converted[id(raw)]))
    samples = [k.pop("n", 1) for k in kwargs]
    for n in samples:
        if n < 1:
            raise RequestError(f"sampling parameter n must be >= 1, got {n}", "sampling_params.n")
    limits.check_samples(sum(samples), "sampling_params.n")
    out: list[ReqInput] = []
    for i in range(size):
        n = samples[i]
        rid = rids[i] if rids[i] is not None else uuid.uuid4().hex
        for j in range(n):
            out.append(
                ReqInput(
                    index=len(out),
                    rid=sample_rids(rid, n)[j],
                    text=texts[i] if texts is not None else None,
                    input_ids=ids[i] if ids is not None else None,
                    sampling_kwargs=_sample_j(kwargs[i], j),
                    return_logprob=bool(logprob[i]),
                    top_logprobs_num=top[i] or 0,
                    stream=obj.stream,
                    logprob_start_len=starts[i] if logprob[i] and starts[i] is not None else -1,
                    messages=obj.messages,
                    tools=obj.tools,
                )
            )
    return out


def sample_rids(rid: str, n: int) -> list[str]:
    """The request ids of the `n` samples of a prompt whose id is `rid`."""
    return [rid] if n == 1 else [f"{rid}-{j}" for j in range(n)]


def _sample_j(kwargs: dict[str, Any], j: int) -> dict[str, Any]:
    """The `j`-th sample's parameters: a seeded request's samples differ (seeds `seed + j`,
    wrapping within [0, 2**63) like the seeds themselves)."""
    out = dict(kwargs)
    if out.get("seed") is not None:
        out["seed"] = (out["seed"] + j) % (INT64_MAX + 1)
    return out


def _check_messages(messages: Any) -> None:
    ok = isinstance(messages, list) and messages and all(_is_mapping(m) for m in messages)
    if not ok:
        raise RequestError("messages must be a non-empty list of messages", "messages")


def _prompts(
    obj: GenerateReqInput, limits: RequestLimits
) -> tuple[list[str] | None, list[list[int]] | None]:
    if obj.messages is not None:
        return None, None
    if obj.text is not None:
        texts = [obj.text] if isinstance(obj.text, str) else obj.text
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise RequestError("text must be a string or a list of strings", "text")
        limits.check_prompts(len(texts), "text")
        return texts, None
    raw = obj.input_ids
    if not isinstance(raw, list):
        raise RequestError(
            "input_ids must be a list of token ids or a list of such lists", "input_ids"
        )
    batch: list[Any] = raw if raw and not obj.is_single else [raw]
    limits.check_prompts(len(batch), "input_ids")
    for ids in batch:
        if not isinstance(ids, list) or not all(_is_token_id(t) for t in ids):
            raise RequestError(
                f"input_ids must hold integer token ids in [0, {TOKEN_ID_MAX}]", "input_ids"
            )
    return None, batch


def _per_prompt(
    value: Any, size: int, name: str, ok: Callable[[Any], bool], wanted: str
) -> list[Any]:
    """`value` once per prompt: a list of `size` values, or one value for all (None: unset)."""
    if isinstance(value, list):
        if len(value) != size:
            raise RequestError(f"{name} has {len(value)} entries for {size} prompts", name)
        items = value
    else:
        items = [value] * size
    for item in items:
        if item is not None and not ok(item):
            raise RequestError(f"{name} must be {wanted} or a list of them, got {item!r}", name)
    return items


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return _is_int(value) and 0 <= value <= INT64_MAX


def _is_start(value: Any) -> bool:
    return _is_int(value) and -1 <= value <= INT64_MAX


def _is_token_id(value: Any) -> bool:
    return _is_int(value) and 0 <= value <= TOKEN_ID_MAX


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_rid(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _is_mapping(value: Any) -> bool:
    return isinstance(value, Mapping)


# ---- sampling parameters from JSON-like values -------------------------------------------


def sampling_kwargs(raw: Mapping[str, Any] | None, limits: RequestLimits) -> dict[str, Any]:
    """Keyword arguments for `SamplingParams` from a JSON-like dict: unknown names, values of
    the wrong type or range and sizes beyond `limits` are refused (RequestError naming the
    parameter); a stop string may be one string; `logit_bias` maps token ids (as strings or
    ints) to biases; `max_new_tokens` may be None (filled in later)."""
    out: dict[str, Any] = {}
    for name, value in (raw or {}).items():
        convert = _CONVERTERS.get(name)
        if convert is None:
            known = ", ".join(sorted(_CONVERTERS))
            raise RequestError(f"unknown sampling parameter {name!r} (known: {known})", name)
        if value is None and name in ("max_new_tokens", "seed", *GRAMMAR_CONVERTERS):
            out[name] = None
            continue
        limits.check_sampling_size(name, value)
        out[name] = convert(name, value)
    return out


def _fail(name: str, wanted: str, value: Any) -> typing.NoReturn:
    raise RequestError(f"sampling parameter {name} must be {wanted}, got {value!r}", name)


def _to_int(name: str, value: Any) -> int:
    # int64: what the rings carry and torch indexes with.
    if not _is_int(value) or not INT64_MIN <= value <= INT64_MAX:
        _fail(name, "an integer in [-2**63, 2**63)", value)
    return int(value)


def _to_seed(name: str, value: Any) -> int:
    # Sample j of n is seeded seed + j (mod 2**63): a seed must be a valid one itself.
    if not _is_int(value) or not 0 <= value <= INT64_MAX:
        _fail(name, "an integer in [0, 2**63)", value)
    return int(value)


def _to_float(name: str, value: Any) -> float:
    if not (_is_int(value) or isinstance(value, float)):
        _fail(name, "a number", value)
    try:
        return float(value)
    except OverflowError:  # an integer past float's range (possible from Python, not JSON)
        _fail(name, "a number within float range", value)


def _to_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        _fail(name, "true or false", value)
    return value


def _to_strs(name: str, value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(s, str) for s in items):
        _fail(name, "a string or a list of strings", value)
    return tuple(items)


def _to_token_ids(name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not all(_is_token_id(t) for t in value):
        _fail(name, f"a list of token ids in [0, {TOKEN_ID_MAX}]", value)
    return tuple(value)


def _to_logit_bias(name: str, value: Any) -> tuple[tuple[int, float], ...]:
    if not isinstance(value, Mapping):
        _fail(name, "a mapping of token ids to biases", value)
    pairs = []
    for key, bias in value.items():
        token = key if _is_int(key) else None
        # ASCII digits only: `int` takes other scripts' digits and refuses very long numbers.
        if isinstance(key, str) and key.strip().isascii() and key.strip().isdigit():
            token = int(key) if len(key.strip()) <= len(str(TOKEN_ID_MAX)) else None
        if token is None or not 0 <= token <= TOKEN_ID_MAX:
            _fail(name, f"keyed by token ids in [0, {TOKEN_ID_MAX}]", key)
        pairs.append((token, _to_float(name, bias)))
    return tuple(pairs)


_BY_TYPE: dict[Any, Callable[[str, Any], Any]] = {
    int: _to_int,
    float: _to_float,
    bool: _to_bool,
    tuple[str, ...]: _to_strs,
    tuple[int, ...]: _to_token_ids,
    int | None: _to_int,
    tuple[tuple[int, float], ...]: _to_logit_bias,
}
_CONVERTERS = {
    name: GRAMMAR_CONVERTERS.get(name) or _BY_TYPE[hint]
    for name, hint in typing.get_type_hints(SamplingParams).items()
}
_CONVERTERS["seed"] = _to_seed
