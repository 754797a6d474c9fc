"""Logging for every srt process (issue item 9): one prefix per process, user text escaped.

Each process calls `configure_logging` once, with its name ("main", "scheduler",
"detokenizer"), so every line of the server's combined stderr says where it came from:

    [2026-11-29 22:40:01 scheduler] INFO Prefill batch. #new-seq: 1, #new-token: 12, ...

Request-scoped lines carry `rid=<id>`. Anything a client sent (request ids, prompt and output
text) goes through `escape` before it reaches a log line, so a request cannot forge lines with
CR/LF or rewrite a terminal with escape sequences.
"""

from __future__ import annotations

import logging
import re
import sys

DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

# C0 controls, DEL, C1 controls, and the Unicode line and paragraph separators (which some
# viewers break lines at); the backslash too, so an escaped value reads back unambiguously.
_UNSAFE = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape(value: str) -> str:
    """`value` safe for one log line: CR, LF, tab, backslash and every other control character
    escaped the way Python writes them (`\\n`, `\\x1b`, `\\u2028`); printable text, non-ASCII
    letters and emoji included, is kept as it is."""
    return _UNSAFE.sub(_escape_char, value)


def log_format(process: str) -> str:
    """The format of every line of process `process`."""
    return f"[%(asctime)s {process}] %(levelname)s %(message)s"


def configure_logging(process: str, level: str) -> None:
    """Sends this process's log records (the root logger's, so libraries' too) to stderr, one
    line each with the prefix `[date time process]`, at `level` ("debug" ... "critical") and
    above. Replaces whatever handlers the root logger had; calling it again reconfigures."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    if not process or any(c in process for c in "\r\n[]"):
        raise ValueError(f"a process name must be a plain word, got {process!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(log_format(process), datefmt=DATE_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(numeric)
