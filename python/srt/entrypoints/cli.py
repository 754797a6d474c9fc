"""`srt-serve`: parses the command line into `ServerArgs` and runs the HTTP server."""

from __future__ import annotations

import sys

from srt.entrypoints.http.server import main

if __name__ == "__main__":
    sys.exit(main())
