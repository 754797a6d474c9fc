"""The scheduler's stop-string check: a request ends as soon as its output holds one of its stop
strings (the detokenizer trims them from the text). The match runs on the text the Rust
incremental detokenizer produces, so it agrees with the text the client gets."""

from __future__ import annotations

from pathlib import Path

from srt.io_struct import FinishReason
from srt.managers.incremental_detokenizer import IncrementalDetokenizer
from srt.managers.schedule_batch import Req


class StopStrings:
    """Decodes the requests that have stop strings, token by token, to find them."""

    def __init__(self, tokenizer_path: str | None) -> None:
        self.tokenizer_path = tokenizer_path
        self.checker: IncrementalDetokenizer | None = None  # loaded on first use

    def register(self, req: Req) -> str | None:
        """Starts watching `req`; says why it cannot be (no tokenizer), else None."""
        if self.checker is None:
            if (
                self.tokenizer_path is None
                or not (Path(self.tokenizer_path) / "tokenizer.json").exists()
            ):
                return "stop strings need the model's tokenizer.json"
            self.checker = IncrementalDetokenizer(self.tokenizer_path)
        params = req.sampling_params
        self.checker.add_request(
            req.rid,
            prompt_ids=req.origin_input_ids,
            skip_special_tokens=params.skip_special_tokens,
            stop=params.stop,
        )
        return None

    def check(self, req: Req) -> None:
        """Sets `req`'s finish reason if its newest output token completed a stop string."""
        assert self.checker is not None, "check before register"
        result = self.checker.step(req.rid, req.output_ids[-1:])
        if (
            result.matched_stop is not None
            and len(req.output_ids) >= req.sampling_params.min_new_tokens
        ):
            req.finished_reason = FinishReason("stop", matched_str=result.matched_stop)

    def forget(self, req: Req) -> None:
        """Stops watching `req` (no-op if it was not watched)."""
        if self.checker is not None and req.rid in self.checker:
            self.checker.free(req.rid)
