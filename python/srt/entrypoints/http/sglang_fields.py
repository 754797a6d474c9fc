"""SGLang request fields that srt accepts only at their defaults.

sglang-router (docs/scale-out.md) parses every body into its own typed schema and sends it on
re-serialized, so a request that reaches srt through it carries SGLang's extension fields at
their defaults (`"return_hidden_states": false`, `"separate_reasoning": true`, ...) although the
client never sent them. At its default each field asks for nothing srt does not already do (srt
has no hidden-state output, no reasoning parser, no background requests), so it is accepted and
dropped; any other value asks for a feature srt does not have, and is a 400 naming the field, as
an unknown field is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from srt.entrypoints.http.errors import bad_request

# `is` comparisons below: every default is None, True or False, which JSON parses to singletons.
GENERATE_DEFAULTS: Mapping[str, bool | None] = {
    "model": None,
    "return_text_in_logprobs": False,
    "log_metrics": True,
    "return_hidden_states": False,
    "background": False,
    "no_logs": False,
    "return_bytes": False,
    "return_entropy": False,
}
COMPLETION_DEFAULTS: Mapping[str, bool | None] = {"return_hidden_states": False}
CHAT_DEFAULTS: Mapping[str, bool | None] = {
    **COMPLETION_DEFAULTS,
    "continue_final_message": False,
    "separate_reasoning": True,
    "stream_reasoning": True,
}


def without_defaults(
    body: Mapping[str, Any], defaults: Mapping[str, bool | None]
) -> dict[str, Any]:
    """`body` without the fields of `defaults` it holds at their default value; a 400 naming
    the first such field set to anything else."""
    for name, default in defaults.items():
        if name in body and body[name] is not default:
            raise bad_request(
                f"{name} is not supported: srt accepts it only as {json.dumps(default)}", name
            )
    return {name: value for name, value in body.items() if name not in defaults}


def default_schemas(defaults: Mapping[str, bool | None]) -> dict[str, dict[str, Any]]:
    """The OpenAPI properties of `defaults`: each field, only at its default."""
    return {name: {"const": default} for name, default in defaults.items()}
