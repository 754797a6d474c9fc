"""The Rust core beside the pure-Python algorithms SGLang and vLLM use, in one run.

    python benches/bench_rust_core.py --json OUT [--seed 0]

Runs the radix-cache and allocator workload (benches/rust_core_radix.py) and the incremental
detokenizer workload (benches/rust_core_detok.py); each measures our Rust structure through its
Python facade beside a Python implementation of the same algorithm on the same inputs, and
checks that both give the same results. Writes `radix_speedup`, `allocator_speedup`,
`detok_speedup` (Python time over Rust time) and the raw timings.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench_utils import emit
from rust_core_detok import bench_detok
from rust_core_radix import bench_allocator, bench_radix


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {
        "radix": bench_radix(args.seed),
        "allocator": bench_allocator(args.seed),
        "detok": bench_detok(args.seed),
    }
    for name in ("radix", "allocator", "detok"):
        results[f"{name}_speedup"] = results[name]["speedup"]
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
