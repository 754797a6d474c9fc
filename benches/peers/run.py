"""Entry point: `python benches/peers/run.py --help` (see `peers.bench`)."""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    # The benchmark imports its package and `bench_serving`'s modules from benches/.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from peers.bench import main as bench_main

    return bench_main()


if __name__ == "__main__":
    sys.exit(main())
