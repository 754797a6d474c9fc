"""`srt-serve`'s command line, generated from the fields of `ServerArgs` (server_args.py): a
flag per field, grouped as the fields' metadata says, and one-line errors that name the flag."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Sequence
from typing import Any, NoReturn

from srt.server_args import ServerArgs
from srt.server_args_check import ServerArgsError, flag_of


class _OneLineErrorParser(argparse.ArgumentParser):
    """Reports a bad argument in one line that names the flag, without the usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(prog: str = "srt-serve") -> argparse.ArgumentParser:
    """The CLI, generated from the fields of `ServerArgs`."""
    parser = _OneLineErrorParser(
        prog=prog,
        description="Serve a language model over SGLang's native and OpenAI-compatible APIs.",
    )
    hints = typing.get_type_hints(ServerArgs)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in dataclasses.fields(ServerArgs):
        title = f.metadata["group"]
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        _add_field(groups[title], f, hints[f.name])
    return parser


def _add_field(group: argparse._ArgumentGroup, f: dataclasses.Field[Any], hint: Any) -> None:
    flags = [flag_of(f.name), *f.metadata["aliases"]]
    help = f.metadata["help"]
    if f.default not in (None, False, ()):
        help += f" (default: {f.default})"
    kwargs: dict[str, Any] = {"dest": f.name, "help": help, "default": f.default}
    value_type = _value_type(hint)
    if value_type is tuple:
        # One value of a list field is named by its last word, singular: --allowed-hosts HOST.
        item = f.name.rsplit("_", 1)[-1].removesuffix("s").upper()
        kwargs.update(nargs="+", type=str, metavar=item)
        kwargs["default"] = ()
    elif value_type is bool:
        kwargs["action"] = "store_true"
    else:
        kwargs["type"] = value_type
        if f.metadata["choices"]:
            kwargs["choices"] = f.metadata["choices"]
        else:
            kwargs["metavar"] = value_type.__name__.upper()
    group.add_argument(*flags, **kwargs)


def parse_args(argv: Sequence[str] | None = None) -> ServerArgs:
    """Parses a command line into `ServerArgs`; a bad value exits 2 with a one-line message."""
    parser = build_parser()
    namespace = parser.parse_args(argv)
    try:
        values: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in vars(namespace).items()
        }
        return ServerArgs(**values)
    except ServerArgsError as e:
        parser.error(str(e))


def _value_type(hint: Any) -> type:
    if typing.get_origin(hint) is tuple:
        return tuple
    members = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    (value_type,) = members
    assert isinstance(value_type, type)
    return value_type
