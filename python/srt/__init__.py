"""srt: an LLM serving runtime in the shape of the SGLang Runtime, with a Rust core."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from srt.entrypoints.engine import Engine

try:
    __version__ = version("srt")
except PackageNotFoundError:
    __version__ = "0.0.0+unknown"

__all__ = ["Engine", "__version__"]


def __getattr__(name: str) -> object:
    # The Engine pulls in torch and transformers: only on first use, not on `import srt`.
    if name == "Engine":
        from srt.entrypoints.engine import Engine

        return Engine
    raise AttributeError(f"module 'srt' has no attribute {name!r}")
