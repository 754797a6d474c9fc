"""OpenAI request bodies in, `GenerateReqInput` out: the name mapping of `/v1/completions` and
`/v1/chat/completions` (the responses are built in `openai_responses`).

This module only maps: OpenAI's names onto SGLang's (`max_tokens` → `max_new_tokens`,
`min_tokens` → `min_new_tokens`, `logprobs` → `top_logprobs_num`, a chat's `messages` onto
template messages, `response_format` onto `json_schema`, `tools` onto the template's tools and
a `ToolPlan`: `openai_tools`), with SGLang's extra sampling fields
(`json_schema`, `regex` and `ebnf` among them) passed through. It refuses only what has
no SGLang counterpart to check it: unknown fields (as OpenAI does), OpenAI fields srt does not
implement (`functions`, `suffix`, audio, ...; those that cannot change the answer, `user`, `store`,
`metadata`, ..., are ignored), the served model's name, the shape of `prompt` and `messages`,
and OpenAI's own ranges (`logit_bias` within ±100). Everything it maps is checked once, by the
tokenizer manager (`generate_req_input.expand`, `RequestTokenizer`), whose errors name the
native field; `OpenAIRequest.param_of` names them back as the body does.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from srt.entrypoints.http.errors import ApiError, bad_request
from srt.entrypoints.http.openai_messages import parse_messages
from srt.entrypoints.http.openai_tools import ToolPlan, parse_tools
from srt.entrypoints.http.sglang_fields import CHAT_DEFAULTS, COMPLETION_DEFAULTS, without_defaults
from srt.managers.generate_req_input import GenerateReqInput

MAX_LOGIT_BIAS = 100.0
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
    "json_schema": "json_schema",
    "regex": "regex",
    "ebnf": "ebnf",
}
COMMON_FIELDS = {
    "model",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "max_tokens",
    "user",
    "response_format",
}
# `response_format: {"type": "json_object"}`: any JSON object.
JSON_OBJECT_SCHEMA = '{"type": "object"}'
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "echo", "best_of", "suffix"}
# Chat fields that cannot change a plain text answer: accepted with any value, unused.
HARMLESS_CHAT_FIELDS = {
    "store",
    "metadata",
    "service_tier",
    "reasoning_effort",
    "verbosity",
    "prediction",
}
# Chat fields accepted only with values that ask for a plain text answer (`check_chat_extras`).
TEXT_ONLY_CHAT_FIELDS = {
    "functions",
    "function_call",
    "modalities",
    "audio",
    "web_search_options",
}
CHAT_FIELDS = (
    COMMON_FIELDS
    | {"messages", "top_logprobs", "max_completion_tokens"}
    | HARMLESS_CHAT_FIELDS
    | TEXT_ONLY_CHAT_FIELDS
    | {"tools", "tool_choice", "parallel_tool_calls"}
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
    echo: bool
    """Completions with `echo`: each choice starts with its prompt's text (and with `logprobs`,
    its logprobs with those of the prompt's tokens)."""
    max_tokens_field: str = "max_tokens"
    """The body's name for the output length (chat may say `max_completion_tokens`)."""
    json_schema_field: str = "json_schema"
    """The body's name for the JSON Schema (`response_format` when it gave one, `tools` when
    a `tool_choice` forces a call)."""
    tools: ToolPlan | None = None
    """How the output may call tools (chat with tools, `tool_choice` not none)."""

    @property
    def stream(self) -> bool:
        return self.obj.stream

    def param_of(self, native: str | None) -> str | None:
        """The body field behind a native field name (an error's `param` from the tokenizer
        manager, which speaks the native schema), e.g. `sampling_params.min_new_tokens` →
        `min_tokens`; None for fields the body has no name for (`rid`)."""
        if native in ("text", "input_ids", "messages"):
            return "messages" if self.chat else "prompt"
        if native == "sampling_params.n":
            return "n"
        if native == "top_logprobs_num":
            return "top_logprobs" if self.chat else "logprobs"
        if native is None or not native.startswith("sampling_params."):
            return None
        name = native.removeprefix("sampling_params.")
        if name == "max_new_tokens":
            return self.max_tokens_field
        if name == "json_schema":
            return self.json_schema_field
        return next((field for field, n in SAMPLING_FIELDS.items() if n == name), name)


def parse_completion_request(body: Mapping[str, Any], model_name: str) -> OpenAIRequest:
    """The request of a `/v1/completions` body; ApiError 400 (or 404 for the model) for what
    only OpenAI's schema refuses."""
    body = without_defaults(body, COMPLETION_DEFAULTS)
    check_fields(body, COMPLETION_FIELDS)
    check_model(body, model_name)
    texts, ids = parse_prompt(body.get("prompt"))
    n = sample_count(body)
    best_of = body.get("best_of")
    if best_of is not None and best_of not in (1, n):
        raise bad_request(f"best_of must equal n ({n}): srt does not rank samples", "best_of")
    if body.get("suffix") not in (None, ""):
        raise bad_request("suffix (insertion) is not supported", "suffix")
    logprobs = body.get("logprobs")
    echo = optional(body, "echo", is_bool, "true or false") or False
    params = sampling_params(body, "max_tokens")
    rid = f"cmpl-{uuid.uuid4().hex}"
    obj = make_input(body, rid, texts, ids, params, logprobs)
    if echo and logprobs is not None:  # the echoed prompt's tokens come with their logprobs
        obj.logprob_start_len = 0
    schema_field = schema_field_of(body)
    return OpenAIRequest(
        False, rid, obj, n, include_usage(body), logprobs, echo, json_schema_field=schema_field
    )


def parse_chat_request(
    body: Mapping[str, Any], model_name: str, tool_call_parser: str | None = None
) -> OpenAIRequest:
    """The request of a `/v1/chat/completions` body (its messages rendered later, by the
    tokenizer manager) on a server whose `--tool-call-parser` is `tool_call_parser`; ApiError
    400 (or 404 for the model) for what only OpenAI's schema refuses."""
    body = without_defaults(body, CHAT_DEFAULTS)
    check_fields(body, CHAT_FIELDS)
    check_model(body, model_name)
    check_chat_extras(body)
    template_tools, plan = parse_tools(body, tool_call_parser)
    n = sample_count(body)
    logprobs = optional(body, "logprobs", is_bool, "true or false") or False
    top = body.get("top_logprobs")
    if top is not None and not logprobs:
        raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
    tokens = "max_tokens"
    if body.get("max_completion_tokens") is not None:
        if body.get("max_tokens") is not None:
            raise bad_request("give max_completion_tokens or max_tokens, not both", "max_tokens")
        tokens = "max_completion_tokens"
    top_logprobs = (top if top is not None else 0) if logprobs else None
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    params = sampling_params(body, tokens)
    schema_field = schema_field_of(body)
    forced = plan.json_schema() if plan is not None else None
    if forced is not None:
        if any(params.get(name) for name in ("json_schema", "regex", "ebnf")):
            raise bad_request(
                "a required or named tool_choice forces a grammar of its own: give no "
                "response_format, json_schema, regex or ebnf with it",
                "tool_choice",
            )
        params["json_schema"], schema_field = forced, "tools"
    obj = make_input(body, rid, None, None, params, top_logprobs)
    obj.messages = parse_messages(body.get("messages"))
    obj.tools = template_tools
    return OpenAIRequest(
        True,
        rid,
        obj,
        n,
        include_usage(body),
        top_logprobs,
        False,
        tokens,
        json_schema_field=schema_field,
        tools=plan,
    )


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


def parse_prompt(prompt: Any) -> tuple[list[str] | None, list[list[Any]] | None]:
    """(texts, None) or (None, token id lists): which of OpenAI's four prompt forms `prompt`
    has (its strings and ids are checked by the tokenizer manager)."""
    wanted = "a string, a list of strings, a list of token ids or a list of such lists"
    if isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise bad_request(f"prompt must be a non-empty {wanted}", "prompt")
    if all(is_int(t) for t in prompt):
        return None, [prompt]
    if all(isinstance(p, str) for p in prompt):
        return prompt, None
    if not all(isinstance(ids, list) for ids in prompt):
        raise bad_request(f"prompt must be {wanted}", "prompt")
    return None, prompt


def sample_count(body: Mapping[str, Any]) -> int:
    """`n`, or 1 for any value but an integer (which the tokenizer manager then refuses)."""
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) else 1


def check_chat_extras(body: Mapping[str, Any]) -> None:
    """Refuses what asks for more than text or tool calls out (the deprecated `functions`
    among them); accepts what asks for exactly that."""
    if body.get("functions"):
        raise bad_request("functions is not supported: use tools", "functions")
    if body.get("function_call") not in (None, "none", "auto"):
        raise bad_request("function_call must be none or auto: use tool_choice", "function_call")
    for name in ("audio", "web_search_options"):
        if body.get(name) is not None:
            raise bad_request(f"{name} is not supported", name)
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad_request('modalities must be ["text"]', "modalities")


def response_format_schema(body: Mapping[str, Any]) -> str | None:
    """The JSON Schema (JSON text) `response_format` asks the output to follow, None for plain
    text: `{"type": "json_object"}` is any object, `{"type": "json_schema", "json_schema":
    {"name": ..., "schema": {...}}}` that schema (any object without one)."""
    response_format = body.get("response_format")
    if response_format is None:
        return None
    wanted = 'an object whose type is "text", "json_object" or "json_schema"'
    if not isinstance(response_format, Mapping):
        raise bad_request(f"response_format must be {wanted}", "response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT_SCHEMA
    if kind != "json_schema":
        raise bad_request(f"response_format must be {wanted}, got type {kind!r}", "response_format")
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
        raise bad_request(
            "response_format.json_schema must be an object with a name and a schema",
            "response_format",
        )
    schema = spec.get("schema")
    if schema is None:
        return JSON_OBJECT_SCHEMA
    if not isinstance(schema, Mapping | bool):
        raise bad_request("response_format.json_schema.schema must be an object", "response_format")
    return json.dumps(schema)


def schema_field_of(body: Mapping[str, Any]) -> str:
    """The body field the request's JSON Schema comes from, for error messages."""
    return "response_format" if body.get("response_format") is not None else "json_schema"


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


def sampling_params(body: Mapping[str, Any], max_tokens_field: str) -> dict[str, Any]:
    """SGLang's sampling parameters under their SGLang names, values as given (unset fields and
    nulls keep SGLang's defaults; no max tokens means up to the context)."""
    fields = {**SAMPLING_FIELDS, max_tokens_field: "max_new_tokens", "n": "n"}
    params: dict[str, Any] = {"max_new_tokens": None}
    for field, name in fields.items():
        value = body.get(field)
        if value is not None:
            params[name] = value
    schema = response_format_schema(body)
    if schema is not None:
        if params.get("json_schema") is not None:
            raise bad_request("give response_format or json_schema, not both", "response_format")
        params["json_schema"] = schema
    bias = params.get("logit_bias")
    if isinstance(bias, Mapping) and any(
        is_number(b) and not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS for b in bias.values()
    ):
        raise bad_request(f"logit_bias values must be in [-100, 100], got {bias!r}", "logit_bias")
    return params


def make_input(
    body: Mapping[str, Any],
    rid: str,
    texts: list[str] | None,
    ids: list[list[int]] | None,
    params: dict[str, Any],
    top_logprobs: Any,
) -> GenerateReqInput:
    optional(body, "user", lambda v: isinstance(v, str), "a string")
    stream = optional(body, "stream", is_bool, "true or false") or False
    size = len(texts if texts is not None else ids or [[]])
    return GenerateReqInput(
        text=texts,
        input_ids=ids,
        sampling_params=params,
        rid=[f"{rid}-{i}" for i in range(size)] if size > 1 else [rid],
        return_logprob=top_logprobs is not None,
        top_logprobs_num=0 if top_logprobs is None else top_logprobs,
        stream=stream,
    )


def optional(body: Mapping[str, Any], name: str, ok: Callable[[Any], bool], wanted: str) -> Any:
    """`body[name]`, None when absent or null; ApiError 400 unless `ok`."""
    value = body.get(name)
    if value is not None and not ok(value):
        raise bad_request(f"{name} must be {wanted}, got {value!r}", name)
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_bool(value: Any) -> bool:
    return isinstance(value, bool)
