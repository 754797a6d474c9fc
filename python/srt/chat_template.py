"""A model's chat template rendered as transformers' `apply_chat_template(..., tokenize=False)`
renders it, without transformers.

Templates come from the hub and are untrusted code: they run in jinja2's immutable sandbox, with
the environment transformers gives them (`trim_blocks`, `lstrip_blocks`, loop controls, a
`tojson` that does not escape HTML, `raise_exception`, `strftime_now`, and a `{% generation %}`
block that renders its body) and the variables it passes (`messages`, `add_generation_prompt`,
`tools`, `documents`, and the special tokens: `bos_token`, `eos_token`, ...).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template refused the conversation (its `raise_exception`) or failed to render."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`, which transformers' templates may use to mark
    assistant text for training masks: rendered as its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja's Extension API declares it so)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """One compiled chat template and the special tokens it may refer to."""

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        """ChatTemplateError if `source` is not a valid template."""
        try:
            self.template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the model's chat template does not compile: {e}") from e
        self.source = source
        self.special_tokens = dict(special_tokens)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The prompt text of `messages`, offered `tools` (JSON Schemas of functions, as
        transformers takes them; None: none); ChatTemplateError if the template refuses
        them."""
        try:
            return self.template.render(
                **self.special_tokens,
                messages=[dict(m) for m in messages],
                tools=[dict(t) for t in tools] if tools is not None else None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
            )
        except Exception as e:  # template code may fail any way (a TypeError, say)
            raise ChatTemplateError(str(e)) from e
