"""What every benchmark does with its results: print them as JSON, and write them to `--json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(results: dict[str, Any], path: Path | None) -> None:
    text = json.dumps(results, indent=2)
    if path is not None:
        path.write_text(text + "\n")
    print(text)
