"""The hot-path cost of per-request stage times (`srt.managers.request_times`), measured piece
by piece against the work of a decode step they ride on.

A decode step that finishes no request adds: the scheduler's `time_stats` scan of the step's
output requests (streamed ones), the codec's encoding and decoding of an empty `time_stats` in
`BatchTokenIDOut` and in `BatchStrOut` (4 bytes each), and the main process's loop over it (an
empty tuple). The bench times each piece on its own (best of 7 runs: noise only adds) and sets
their sum beside the work the step's message costs anyway: `make_output`, encoding and
decoding it, for N streamed requests.
It also times, per finished request, what only a finishing request pays: its `ReqTimeStats`,
`RequestTimes.absorb`, the stages, the log fields and the meta_info fields.

    python benches/bench_request_times.py [--json OUT]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_utils import emit

from srt.io_struct import ReqTimeStats, TokenizedGenerateReq
from srt.ipc import codec
from srt.managers.request_times import RequestTimes
from srt.managers.schedule_batch import Req, make_output, time_stats
from srt.sampling_params import SamplingParams

SIZES = (1, 16, 64, 256)
REPEATS = 7


def best_of(fn: Callable[[], Any], loops: int) -> float:
    """The best of `REPEATS` runs of the seconds one call of `fn` takes (`loops` calls a run):
    the machine's noise only ever adds."""
    runs = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        runs.append((time.perf_counter() - start) / loops)
    return min(runs)


def decoding_reqs(n: int) -> list[Req]:
    """`n` streamed requests mid-decode: 8 outputs each, their settings already sent."""
    reqs = []
    for i in range(n):
        recv = TokenizedGenerateReq(f"r{i}", tuple(range(3, 40)), SamplingParams(), stream=True)
        req = Req(recv, frozenset({2}))
        req.output_ids = list(range(100, 108))
        req.sent_len = 7
        req.settings_sent = True
        reqs.append(req)
    return reqs


def empty_field_round_trip() -> Callable[[], Any]:
    """Encoding and decoding an empty `time_stats`, as the codec does inside a message."""
    enc, dec = codec._codec_for(tuple[ReqTimeStats, ...])

    def run() -> Any:
        buf = bytearray()
        enc(buf, ())
        return dec(memoryview(bytes(buf)), 0)

    return run


def per_step(n: int) -> dict[str, float]:
    """Microseconds of a decode step's message for `n` streamed requests, none finishing, and
    what the timing adds to it: the scan, and an empty field through the codec in each of the
    two messages (`BatchTokenIDOut`, `BatchStrOut`)."""
    reqs = decoding_reqs(n)
    out = make_output(reqs)
    loops = max(20, 4000 // n)
    message = best_of(lambda: codec.decode(codec.encode(make_output(reqs))), loops)
    scan = best_of(lambda: time_stats(reqs), loops)
    field = best_of(empty_field_round_trip(), 20000)
    added = scan + 2 * field
    assert not out.time_stats
    return {
        "requests": n,
        "message_us": message * 1e6,
        "added_us": added * 1e6,
        "added_pct": 100 * added / (message - added),
        "time_stats_scan_us": scan * 1e6,
        "empty_field_codec_us": field * 1e6,
    }


def per_finished_request() -> dict[str, float]:
    """What one finishing request adds, in microseconds."""
    stats = ReqTimeStats(0, 1.0, 1.1, 1.2, 1.9)

    def finish() -> None:
        t = RequestTimes(0.9, tokenized=0.95, sent=0.97)
        t.absorb(stats, 1.95)
        t.answered = 2.0
        t.log_fields()
        t.meta_info(8)

    return {"finish_path_us": best_of(finish, 2000) * 1e6}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    emit({"decode_step": [per_step(n) for n in SIZES], **per_finished_request()}, args.json)


if __name__ == "__main__":
    main()
