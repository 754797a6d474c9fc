"""`srt-serve`: parses the command line into `ServerArgs` and runs the HTTP server.

The server is imported when `main` runs, not with this module: every stage process, started
with `spawn`, imports the launching program's main module (this one, or the `srt-serve` script
that imports it) before its own work, and the HTTP server's imports (aiohttp, every route) cost
each stage 0.3 s of a start on 2 cores, for nothing it runs.
"""

from __future__ import annotations

import sys


def main() -> int:
    from srt.entrypoints.http.server import main as serve

    return serve()


if __name__ == "__main__":
    sys.exit(main())
