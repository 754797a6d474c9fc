"""Stop strings on the scheduler's side: a request ends as soon as its text holds one of its stop
strings, so no token is generated past it (the detokenizer trims the text itself)."""

from __future__ import annotations

from pathlib import Path

from srt.io_struct import FinishReason
from srt.managers.incremental_detokenizer import IncrementalDetokenizer
from srt.managers.schedule_batch import Req


class StopStringChecker:
    """Decodes the output of requests with stop strings incrementally (the Rust detokenizer,
    loaded at the first such request) and finishes them on a match."""

    def __init__(self, tokenizer_path: str | None) -> None:
        self.tokenizer_path = tokenizer_path
        self.detokenizer: IncrementalDetokenizer | None = None

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
        self.detokenizer.add_request(
            req.rid,
            prompt_ids=req.origin_input_ids,
            skip_special_tokens=params.skip_special_tokens,
            stop=params.stop,
        )
        return None

    def check(self, req: Req) -> None:
        """Decodes the newest output token of `req`; sets its finish reason on a match (once
        `min_new_tokens` are out)."""
        assert self.detokenizer is not None, "check follows add"
        result = self.detokenizer.step(req.rid, req.output_ids[-1:])
        if (
            result.matched_stop is not None
            and len(req.output_ids) >= req.sampling_params.min_new_tokens
        ):
            req.finished_reason = FinishReason("stop", matched_str=result.matched_stop)

    def forget(self, req: Req) -> None:
        """Stops watching `req` (nothing happens if it was not watched)."""
        if self.detokenizer is not None and req.rid in self.detokenizer:
            self.detokenizer.free(req.rid)
