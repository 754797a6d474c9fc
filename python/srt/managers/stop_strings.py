"""Stop strings, decided in one place (docs/design.md §1): the scheduler ends a request when its
output text completes one of its stop strings, once `min_new_tokens` are out, and its finish
reason carries the string and where it starts in the output text; the detokenizer cuts the text
there and never looks for a match itself. It only holds back text that could still begin a stop
string (`held_back`), so that a stream never shows what the cut would remove.

Stop strings are literal. Of the matches that complete with the same token, the one that ends
first wins (ties: the one that starts first), which is the one a stream notices first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from srt.io_struct import FinishReason
from srt.managers.incremental_detokenizer import IncrementalDetokenizer

if TYPE_CHECKING:  # the detokenizer imports this module: it must not load the scheduler's
    from srt.managers.schedule_batch import Req


def find_stop(text: str, stops: Sequence[str], after: int) -> tuple[str, int] | None:
    """The stop string of `stops` whose first occurrence in `text` ending past `after`
    characters ends first, and where it starts; None if no occurrence ends past `after`."""
    best: tuple[int, int, str] | None = None
    for stop in stops:
        start = text.find(stop, max(0, after - len(stop) + 1))
        if start >= 0 and (best is None or (start + len(stop), start) < best[:2]):
            best = (start + len(stop), start, stop)
    return None if best is None else (best[2], best[1])


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of `text` could still begin a stop string (the longest
    suffix that is a proper prefix of one)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


@dataclass
class _Watch:
    """The output text a request has decoded so far, as much as a match can still use."""

    stops: tuple[str, ...]
    tail: str = ""  # the last (longest stop - 1) characters: where a match may start
    length: int = 0  # characters of output text, tail included


class StopStringChecker:
    """Decodes the output of requests with stop strings incrementally (the Rust detokenizer,
    loaded at the first such request) and finishes them on a match."""

    def __init__(self, tokenizer_path: str | None) -> None:
        self.tokenizer_path = tokenizer_path
        self.detokenizer: IncrementalDetokenizer | None = None
        self.watched: dict[str, _Watch] = {}

    def add(self, req: Req) -> str | None:
        """Starts watching `req`; returns why it cannot be (no tokenizer.json), else None."""
        if self.detokenizer is None:
            if (
                self.tokenizer_path is None
                or not (Path(self.tokenizer_path) / "tokenizer.json").exists()
            ):
                return "stop strings need the model's tokenizer.json"
            self.detokenizer = IncrementalDetokenizer(self.tokenizer_path)
        params = req.sampling_params
        # The detokenizer decodes the same ids with the same settings and context: its text is
        # this text, so an offset into one is an offset into the other.
        self.detokenizer.add_request(
            req.rid, prompt_ids=req.origin_input_ids, skip_special_tokens=params.skip_special_tokens
        )
        self.watched[req.rid] = _Watch(stops=tuple(params.stop))
        return None

    def check(self, req: Req) -> None:
        """Decodes the newest output token of `req`; on a match that this token completes (once
        `min_new_tokens` are out) sets its finish reason."""
        assert self.detokenizer is not None, "check follows add"
        watch = self.watched[req.rid]
        window = watch.tail + self.detokenizer.step(req.rid, req.output_ids[-1:])
        start_of_window = watch.length - len(watch.tail)
        if len(req.output_ids) >= req.sampling_params.min_new_tokens:
            match = find_stop(window, watch.stops, after=len(watch.tail))
            if match is not None:
                stop, start = match
                req.finished_reason = FinishReason(
                    "stop", matched_str=stop, matched_offset=start_of_window + start
                )
        keep = max(map(len, watch.stops)) - 1
        watch.tail = window[-keep:] if keep else ""
        watch.length = start_of_window + len(window)

    def forget(self, req: Req) -> None:
        """Stops watching `req` (nothing happens if it was not watched)."""
        if self.watched.pop(req.rid, None) is not None:
            assert self.detokenizer is not None
            self.detokenizer.free(req.rid)
