"""OpenAI request bodies in, `GenerateReqInput` out: the checks and name mapping of
`/v1/completions` and `/v1/chat/completions` (the responses are built in `openai_responses`).

Every field is checked before anything reaches the tokenizer manager, and a bad one is a 400
whose `param` names it. OpenAI's names map onto SGLang's sampling names (`max_tokens` →
`max_new_tokens`, `min_tokens` → `min_new_tokens`); SGLang's extra sampling fields pass through.
OpenAI fields srt does not implement are ignored when ignoring them cannot change the answer
(`user`, `store`, `metadata`, ...) and refused otherwise (`tools`, `suffix`, audio, ...); any
other unknown field is refused, as OpenAI does. Sizes are bounded by the server's
`RequestLimits` (`n`, prompts, stop strings, logprobs, logit_bias entries) and integers by the
ranges the stages carry; a prompt's token ids are checked against the vocabulary before `echo`
decodes them.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from srt.entrypoints.http.errors import ApiError, bad_request
from srt.managers.generate_req_input import GenerateReqInput, sampling_kwargs
from srt.request_limits import TOKEN_ID_MAX, RequestError, RequestLimits
from srt.sampling_params import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MAX_LOGIT_BIAS = 100.0
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

# OpenAI name → SGLang sampling name, for the fields both endpoints take.
SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "stop": "stop",
    "logit_bias": "logit_bias",
    # SGLang's extra sampling fields
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_new_tokens",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "no_stop_trim": "no_stop_trim",
}
COMMON_FIELDS = {"model", "n", "stream", "stream_options", "logprobs", "max_tokens", "user"}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "echo", "best_of", "suffix"}
# Chat fields that cannot change a plain text answer: accepted with any value, unused.
HARMLESS_CHAT_FIELDS = {
    "parallel_tool_calls",
    "store",
    "metadata",
    "service_tier",
    "reasoning_effort",
    "verbosity",
    "prediction",
}
# Chat fields accepted only with values that ask for a plain text answer (`check_chat_extras`).
TEXT_ONLY_CHAT_FIELDS = {
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "response_format",
    "modalities",
    "audio",
    "web_search_options",
}
CHAT_FIELDS = (
    COMMON_FIELDS
    | {"messages", "top_logprobs", "max_completion_tokens"}
    | HARMLESS_CHAT_FIELDS
    | TEXT_ONLY_CHAT_FIELDS
)


@dataclass
class OpenAIRequest:
    """A checked OpenAI request: what to generate, and how to answer."""

    chat: bool
    response_id: str
    obj: GenerateReqInput
    n: int
    include_usage: bool
    top_logprobs: int | None
    """Top logprobs per token when logprobs were asked for, else None."""
    echo_texts: list[str] | None
    """Completions with `echo`: each prompt's text, which its choices start with (and with
    `logprobs`, whose tokens' logprobs their logprobs start with)."""
    max_tokens_field: str = "max_tokens"
    """The body's name for the output length (chat may say `max_completion_tokens`)."""

    @property
    def stream(self) -> bool:
        return self.obj.stream

    def param_of(self, native: str | None) -> str | None:
        """The body field behind a native field name (an error's `param` from the tokenizer
        manager, which speaks the native schema), e.g. `sampling_params.min_new_tokens` →
        `min_tokens`; None for fields the body has no name for (`rid`)."""
        if native in ("text", "input_ids"):
            return "messages" if self.chat else "prompt"
        if native == "top_logprobs_num":
            return "top_logprobs" if self.chat else "logprobs"
        if native is None or not native.startswith("sampling_params."):
            return None
        name = native.removeprefix("sampling_params.")
        if name == "max_new_tokens":
            return self.max_tokens_field
        return next((field for field, n in SAMPLING_FIELDS.items() if n == name), name)


def parse_completion_request(
    body: Mapping[str, Any],
    model_name: str,
    tokenizer: PreTrainedTokenizerBase,
    limits: RequestLimits,
) -> OpenAIRequest:
    """The request of a `/v1/completions` body; ApiError 400 (or 404 for the model) if bad."""
    check_fields(body, COMPLETION_FIELDS)
    check_model(body, model_name)
    texts, ids = parse_prompt(body.get("prompt"), limits)
    n = parse_n(body, limits)
    with limit_errors():
        limits.check_samples(n * len(texts or ids or ()), "n")
    best_of = body.get("best_of")
    if best_of is not None and best_of not in (1, n):
        raise bad_request(f"best_of must equal n ({n}): srt does not rank samples", "best_of")
    if body.get("suffix") not in (None, ""):
        raise bad_request("suffix (insertion) is not supported", "suffix")
    logprobs = optional(body, "logprobs", is_count, "an integer >= 0")
    with limit_errors():
        limits.check_logprobs(logprobs or 0, "logprobs")
    echo = optional(body, "echo", is_bool, "true or false") or False
    params = sampling_params(body, "max_tokens", n, limits)
    echo_texts = None
    if echo:
        echo_texts = texts if texts is not None else decode_prompts(ids or [], tokenizer)
    rid = f"cmpl-{uuid.uuid4().hex}"
    obj = make_input(body, rid, texts, ids, params, logprobs)
    if echo and logprobs is not None:  # the echoed prompt's tokens come with their logprobs
        obj.logprob_start_len = 0
    return OpenAIRequest(False, rid, obj, n, include_usage(body), logprobs, echo_texts)


def parse_chat_request(
    body: Mapping[str, Any],
    model_name: str,
    tokenizer: PreTrainedTokenizerBase,
    limits: RequestLimits,
) -> OpenAIRequest:
    """The request of a `/v1/chat/completions` body, its messages rendered with the model's chat
    template; ApiError 400 (or 404 for the model) if bad."""
    check_fields(body, CHAT_FIELDS)
    check_model(body, model_name)
    check_chat_extras(body)
    n = parse_n(body, limits)
    logprobs = optional(body, "logprobs", is_bool, "true or false") or False
    top = optional(body, "top_logprobs", is_count, "an integer >= 0")
    with limit_errors():
        limits.check_logprobs(top or 0, "top_logprobs")
    if top is not None and not logprobs:
        raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
    tokens = "max_tokens"
    if body.get("max_completion_tokens") is not None:
        if body.get("max_tokens") is not None:
            raise bad_request("give max_completion_tokens or max_tokens, not both", "max_tokens")
        tokens = "max_completion_tokens"
    top_logprobs = (top or 0) if logprobs else None
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    params = sampling_params(body, tokens, n, limits)
    ids = render_chat(parse_messages(body.get("messages")), tokenizer)
    obj = make_input(body, rid, None, [ids], params, top_logprobs)
    return OpenAIRequest(True, rid, obj, n, include_usage(body), top_logprobs, None, tokens)


# ---- the parts of a request ----------------------------------------------------------------


def check_fields(body: Mapping[str, Any], known: set[str]) -> None:
    for name in body:
        if name not in known and name not in SAMPLING_FIELDS:
            raise bad_request(f"unknown field {name!r}", name)


def check_model(body: Mapping[str, Any], model_name: str) -> None:
    model = body.get("model")
    if not isinstance(model, str):
        raise bad_request("model must be a string naming the served model", "model")
    if model != model_name:
        raise ApiError(
            404,
            f"the model {model!r} does not exist; this server serves {model_name!r}",
            param="model",
            code="model_not_found",
        )


def parse_prompt(
    prompt: Any, limits: RequestLimits
) -> tuple[list[str] | None, list[list[int]] | None]:
    """(texts, None) or (None, token id lists): one or more prompts."""
    wanted = "a string, a list of strings, a list of token ids or a list of such lists"
    if isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise bad_request(f"prompt must be a non-empty {wanted}", "prompt")
    if all(is_int(t) for t in prompt):
        prompt = [prompt]
    with limit_errors():
        limits.check_prompts(len(prompt), "prompt")
    if all(isinstance(p, str) for p in prompt):
        if not all(prompt):
            raise bad_request("prompt must not contain an empty string", "prompt")
        return prompt, None
    for ids in prompt:
        if not isinstance(ids, list) or not all(is_token_id(t) for t in ids):
            raise bad_request(f"prompt must be {wanted} (ids in [0, {TOKEN_ID_MAX}])", "prompt")
        if not ids:
            raise bad_request("prompt must not contain an empty list of token ids", "prompt")
    return None, prompt


def decode_prompts(prompts: list[list[int]], tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The text of each prompt, for `echo`; its ids are checked against the vocabulary first
    (the tokenizer's decoder takes u32 ids and fails on others)."""
    vocab = len(tokenizer)
    for ids in prompts:
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(
                f"prompt holds token id {bad}, outside the vocabulary [0, {vocab})", "prompt"
            )
    return [str(tokenizer.decode(ids)) for ids in prompts]


def parse_messages(messages: Any) -> list[dict[str, str]]:
    """The messages as a chat template takes them: role and text content."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list of messages", "messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise bad_request(f"{where} must be an object with role and content", where)
        for key, value in message.items():
            if key not in ("role", "content", "name", "refusal") and value is not None:
                raise bad_request(f"{where}.{key} is not supported", f"{where}.{key}")
        role = message.get("role")
        if role not in CHAT_ROLES:
            known = ", ".join(CHAT_ROLES)
            raise bad_request(f"{where}.role must be one of {known}, got {role!r}", f"{where}.role")
        out.append({"role": CHAT_ROLES[role], "content": message_text(message, where)})
    return out


def message_text(message: Mapping[str, Any], where: str) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    wanted = "a string or a list of text parts"
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be {wanted}", f"{where}.content")
    texts = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") != "text":
            raise bad_request(
                f"{where}.content must be {wanted}: srt serves text models only",
                f"{where}.content",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise bad_request(f"{where}.content text parts need a string text", f"{where}.content")
        texts.append(text)
    return "".join(texts)


def render_chat(messages: list[dict[str, str]], tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The prompt ids of a chat. The template's text is tokenized without adding special
    tokens: a template that writes the BOS itself must not get a second one."""
    if not getattr(tokenizer, "chat_template", None):
        raise bad_request(
            "the model has no chat template: use /v1/completions with a prompt", "messages"
        )
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # jinja raises for conversations its template refuses
        raise bad_request(f"the chat template refused the messages: {e}", "messages") from e
    if not isinstance(text, str):
        raise TypeError(f"the chat template rendered {type(text).__name__}, not text")
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


def check_chat_extras(body: Mapping[str, Any]) -> None:
    """Refuses what asks for more than plain text out; accepts what asks for exactly that."""
    for name in ("tools", "functions"):
        if body.get(name):
            raise bad_request(f"{name} (tool calling) is not supported", name)
    for name in ("tool_choice", "function_call"):
        if body.get(name) not in (None, "none", "auto"):
            raise bad_request(f"{name} must be none or auto: srt has no tool calling", name)
    for name in ("audio", "web_search_options"):
        if body.get(name) is not None:
            raise bad_request(f"{name} is not supported", name)
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad_request('modalities must be ["text"]', "modalities")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise bad_request('response_format must be {"type": "text"}', "response_format")


def parse_n(body: Mapping[str, Any], limits: RequestLimits) -> int:
    n = optional(body, "n", is_int, "an integer")
    n = 1 if n is None else n
    if not 1 <= n <= limits.max_n:
        raise bad_request(f"n must be in [1, {limits.max_n}] (--max-n), got {n}", "n")
    return int(n)


def include_usage(body: Mapping[str, Any]) -> bool:
    stream = optional(body, "stream", is_bool, "true or false") or False
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise bad_request("stream_options is only allowed with stream true", "stream_options")
    if not isinstance(options, Mapping) or set(options) - {"include_usage"}:
        raise bad_request("stream_options must be an object with include_usage", "stream_options")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise bad_request("stream_options.include_usage must be true or false", "stream_options")
    return usage


def sampling_params(
    body: Mapping[str, Any], max_tokens_field: str, n: int, limits: RequestLimits
) -> dict[str, Any]:
    """SGLang's sampling parameters, each checked on its own so that an error names its field;
    unset fields and nulls keep SGLang's defaults, and no max tokens means up to the context."""
    fields = {**SAMPLING_FIELDS, max_tokens_field: "max_new_tokens"}
    params: dict[str, Any] = {"max_new_tokens": None, "n": n}
    for field, name in fields.items():
        value = body.get(field)
        if value is not None:
            check_sampling_value(field, name, value, limits)
            params[name] = value
    min_tokens, max_tokens = params.get("min_new_tokens"), params["max_new_tokens"]
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise bad_request(f"min_tokens must be at most {max_tokens_field}", "min_tokens")
    return params


def check_sampling_value(field: str, name: str, value: Any, limits: RequestLimits) -> None:
    """Type, range and size of one sampling value, with SamplingParams' own rules."""
    try:
        converted = sampling_kwargs({name: value}, limits)[name]
        probe = {name: converted}
        if name == "min_new_tokens":  # its range depends on max_new_tokens
            probe["max_new_tokens"] = max(converted, 0)
        SamplingParams(**probe)
    except ValueError as e:
        raise bad_request(str(e).replace(f"sampling parameter {name}", field), field) from e
    if name == "logit_bias" and not all(abs(b) <= MAX_LOGIT_BIAS for _, b in converted):
        raise bad_request(f"logit_bias values must be in [-100, 100], got {value!r}", field)
    if isinstance(converted, float) and not math.isfinite(converted):
        raise bad_request(f"{field} must be a finite number, got {value!r}", field)


def make_input(
    body: Mapping[str, Any],
    rid: str,
    texts: list[str] | None,
    ids: list[list[int]] | None,
    params: dict[str, Any],
    top_logprobs: int | None,
) -> GenerateReqInput:
    optional(body, "user", lambda v: isinstance(v, str), "a string")
    stream = optional(body, "stream", is_bool, "true or false") or False
    size = len(texts if texts is not None else ids or ())
    return GenerateReqInput(
        text=texts,
        input_ids=ids,
        sampling_params=params,
        rid=[f"{rid}-{i}" for i in range(size)] if size > 1 else [rid],
        return_logprob=top_logprobs is not None,
        top_logprobs_num=top_logprobs or 0,
        stream=stream,
    )


@contextlib.contextmanager
def limit_errors() -> Iterator[None]:
    """Raises the ApiError 400 of a `RequestError` raised inside (its param kept)."""
    try:
        yield
    except RequestError as e:
        raise bad_request(str(e), e.param) from e


def optional(body: Mapping[str, Any], name: str, ok: Callable[[Any], bool], wanted: str) -> Any:
    """`body[name]`, None when absent or null; ApiError 400 unless `ok`."""
    value = body.get(name)
    if value is not None and not ok(value):
        raise bad_request(f"{name} must be {wanted}, got {value!r}", name)
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_token_id(value: Any) -> bool:
    return is_int(value) and 0 <= value <= TOKEN_ID_MAX


def is_count(value: Any) -> bool:
    return is_int(value) and value >= 0


def is_bool(value: Any) -> bool:
    return isinstance(value, bool)
