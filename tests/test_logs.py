"""`srt.logs`: escaping of user-supplied values and the per-process line prefix."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from srt.logs import configure_logging, escape

PYTHON_DIR = Path(__file__).resolve().parents[1] / "python"


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        ("plain text", "plain text"),
        ("line\nforged INFO line", "line\\nforged INFO line"),
        ("cr\rlf\r\n", "cr\\rlf\\r\\n"),
        ("tab\tnul\x00", "tab\\tnul\\x00"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("del\x7f c1\x85", "del\\x7f c1\\x85"),
        ("sep\u2028par\u2029", "sep\\u2028par\\u2029"),
        ("back\\slash", "back\\\\slash"),
        ("café 東京 🙂 Ünïcødé", "café 東京 🙂 Ünïcødé"),
    ],
)
def test_escape_makes_one_readable_line(value: str, escaped: str) -> None:
    assert escape(value) == escaped
    assert escaped.isprintable()


def test_escaped_values_can_be_read_back() -> None:
    value = "a\\nb\n\\\r\x1b🙂"
    assert escape(value).encode().decode("unicode_escape").encode("latin-1").decode() == value


def _log_from_a_process(process: str, level: str) -> str:
    code = (
        "import logging; from srt.logs import configure_logging; "
        f"configure_logging({process!r}, {level!r}); "
        "log = logging.getLogger('srt.test'); "
        "log.debug('hidden'); log.info('hello'); log.warning('careful')"
    )
    env = {**os.environ, "PYTHONPATH": str(PYTHON_DIR)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return done.stderr


def test_every_line_names_its_process() -> None:
    lines = _log_from_a_process("scheduler", "info").splitlines()
    stamp = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d scheduler\]"
    assert len(lines) == 2, lines
    assert re.fullmatch(stamp + " INFO hello", lines[0]), lines[0]
    assert re.fullmatch(stamp + " WARNING careful", lines[1]), lines[1]


def test_the_level_filters_lines() -> None:
    assert "hidden" in _log_from_a_process("detokenizer", "debug")
    assert "hello" not in _log_from_a_process("detokenizer", "warning")


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        configure_logging("main", "loud")
    with pytest.raises(ValueError, match="plain word"):
        configure_logging("main]\n[fake", "info")
