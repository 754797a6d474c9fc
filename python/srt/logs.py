"""Logging for every srt process: one prefix naming the process, and escaping of user text."""

from __future__ import annotations

import logging


def configure_logging(process: str, level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format=f"[%(asctime)s {process}] %(levelname)s %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )


def escape(value: str) -> str:
    """`value` with control characters escaped, so user text cannot forge log lines."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)
