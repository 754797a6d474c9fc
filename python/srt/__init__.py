"""srt: an LLM serving runtime in the shape of the SGLang Runtime, with a Rust core."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("srt")
except PackageNotFoundError:
    __version__ = "0.0.0+unknown"
