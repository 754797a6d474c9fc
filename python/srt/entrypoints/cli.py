"""`srt-serve`: parses the command line into `ServerArgs` and starts the server."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from srt.server_args import parse_args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"srt-serve: serving is not built yet; arguments are valid "
        f"(model {args.model_path or 'default'}, {args.host}:{args.port}).",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
