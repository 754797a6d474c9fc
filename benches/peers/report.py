"""The side-by-side benchmark's figures: which result field each table row reads
(`ROWS`), their medians over rounds, and the markdown table of them."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peers.engines import Engine


@dataclass(frozen=True)
class Row:
    label: str
    workload: str
    key: str
    """The figure in `bench_serving.py`'s result."""
    scale: float
    digits: int


ROWS = (
    Row("random 32 x (256 in, 32 out), c16: output tok/s", "random", "output_throughput", 1, 1),
    Row(
        "shared prefix 4 groups x 8 (1024 system + 32 question, 16 out), c16: output tok/s",
        "shared-prefix",
        "output_throughput",
        1,
        1,
    ),
    Row("long 8 x (2048 in, 16 out), c4: TTFT p50 (s)", "long", "median_ttft_ms", 1e-3, 2),
    Row("single stream 4 x (256 in, 64 out), c1: TPOT (ms)", "single", "median_tpot_ms", 1, 1),
    Row(
        "server CPU seconds per 1,000 output tokens (random)",
        "random",
        "server_cpu_s_per_1k_output_tokens",
        1,
        1,
    ),
)


def medians(runs: Sequence[Mapping[str, Any]], engines: Sequence[Engine]) -> dict[str, Any]:
    """Per engine and row: the median over rounds of the successful runs' figure, and how many
    rounds it stands on."""
    table: dict[str, Any] = {}
    for engine in engines:
        row_values: dict[str, Any] = {}
        for row in ROWS:
            values = [
                run["result"][row.key] * row.scale
                for run in runs
                if run["engine"] == engine.name
                and run["workload"] == row.workload
                and run.get("result") is not None
                and run["result"].get("is_result")
                and run["result"].get(row.key) is not None
            ]
            row_values[row.label] = {
                "median": statistics.median(values) if values else None,
                "rounds": len(values),
            }
        table[engine.name] = row_values
    return table


def markdown_table(table: Mapping[str, Any], engines: Sequence[Engine], rounds: int) -> str:
    """The medians as the issue's table: a row per figure, a column per engine; a cell standing
    on fewer rounds than were run says on how many."""
    lines = [
        "| workload | " + " | ".join(e.label for e in engines) + " |",
        "|---|" + "---|" * len(engines),
    ]
    for row in ROWS:
        cells = []
        for engine in engines:
            cell = table[engine.name][row.label]
            if cell["median"] is None:
                cells.append("n/a")
                continue
            text = f"{cell['median']:.{row.digits}f}"
            cells.append(
                text if cell["rounds"] == rounds else f"{text} ({cell['rounds']}/{rounds})"
            )
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
