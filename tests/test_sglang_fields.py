"""SGLang's extension fields, as sglang-router sends them on every body: accepted at their
defaults (and dropped), refused with a 400 naming the field at any other value."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from srt.entrypoints.http.errors import ApiError
from srt.entrypoints.http.native_api import generate_input
from srt.entrypoints.http.openai_protocol import parse_chat_request, parse_completion_request
from srt.entrypoints.http.sglang_fields import CHAT_DEFAULTS, GENERATE_DEFAULTS, without_defaults

# What sglang-router 0.3.2 sends for `{"text": ..., "sampling_params": ...}` and for a chat with
# `max_tokens` (captured from its requests to a worker).
ROUTED_GENERATE = {
    "text": "Hello world",
    "model": None,
    "sampling_params": {"temperature": 0.0, "max_new_tokens": 4},
    "return_text_in_logprobs": False,
    "stream": False,
    "log_metrics": True,
    "return_hidden_states": False,
    "background": False,
    "no_logs": False,
    "return_bytes": False,
    "return_entropy": False,
}
ROUTED_COMPLETION = {
    "model": "tiny",
    "prompt": "Hello world",
    "max_tokens": 4,
    "temperature": 0.0,
    "stream": False,
    "echo": False,
    "no_stop_trim": False,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "return_hidden_states": False,
}
ROUTED_CHAT = {
    "messages": [{"role": "user", "content": "Hi"}],
    "model": "tiny",
    "logprobs": False,
    "max_completion_tokens": 4,
    "stream": False,
    "no_stop_trim": False,
    "ignore_eos": False,
    "continue_final_message": False,
    "skip_special_tokens": True,
    "separate_reasoning": True,
    "stream_reasoning": True,
    "return_hidden_states": False,
}


def test_routed_bodies_are_accepted_as_the_plain_ones() -> None:
    routed = generate_input(dict(ROUTED_GENERATE))
    plain = generate_input({"text": "Hello world", "sampling_params": {"max_new_tokens": 4}})
    assert routed.text == plain.text
    assert routed.stream is False
    for request in (
        parse_completion_request(ROUTED_COMPLETION, "tiny"),
        parse_chat_request(ROUTED_CHAT, "tiny"),
    ):
        params = request.obj.sampling_params
        assert isinstance(params, Mapping)
        assert params["max_new_tokens"] == 4


@pytest.mark.parametrize(
    ("body", "field", "value"),
    [
        (ROUTED_GENERATE, "return_hidden_states", True),
        (ROUTED_GENERATE, "background", True),
        (ROUTED_GENERATE, "model", "tiny"),
        (ROUTED_GENERATE, "log_metrics", False),
        (ROUTED_COMPLETION, "return_hidden_states", True),
        (ROUTED_CHAT, "continue_final_message", True),
        (ROUTED_CHAT, "separate_reasoning", 1),
    ],
)
def test_a_field_away_from_its_default_is_a_400_naming_it(
    body: dict[str, Any], field: str, value: Any
) -> None:
    parse: Callable[[dict[str, Any]], object] = (
        generate_input
        if body is ROUTED_GENERATE
        else (lambda b: parse_chat_request(b, "tiny"))
        if body is ROUTED_CHAT
        else (lambda b: parse_completion_request(b, "tiny"))
    )
    with pytest.raises(ApiError) as error:
        parse({**body, field: value})
    assert error.value.status == 400
    assert error.value.param == field


def test_without_defaults_drops_only_the_default_fields() -> None:
    body = {"text": "x", "no_logs": False, "separate_reasoning": True}
    assert without_defaults(body, GENERATE_DEFAULTS) == {"text": "x", "separate_reasoning": True}
    assert without_defaults(body, CHAT_DEFAULTS) == {"text": "x", "no_logs": False}
