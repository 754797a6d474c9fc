"""Type stubs of the private Rust extension `srt._rust` (see rust/python/src/lib.rs).

Only the facades in `srt.mem_cache`, `srt.managers` and `srt.ipc` import this module.
"""

from collections.abc import Sequence

__version__: str

class InvariantError(RuntimeError):
    """A data structure of srt's Rust core found one of its invariants broken (a bug in srt)."""

# --- incremental detokenizer (rust/python/src/detokenizer.rs) ---

class IncrementalDetokenizer:
    """Incremental detokenizer over a `tokenizer.json`, with the decode state of many requests."""

    def __init__(self, tokenizer_json: str) -> None: ...
    def add_request(
        self,
        rid: str,
        *,
        skip_special_tokens: bool,
        stop: Sequence[str],
        include_stop_str_in_output: bool,
        context_ids: Sequence[int],
    ) -> None: ...
    def step(self, rid: str, new_ids: Sequence[int]) -> tuple[str, str | None]: ...
    def step_batch(
        self, rids: Sequence[str], new_ids: Sequence[Sequence[int]]
    ) -> tuple[list[str], list[str | None]]: ...
    def finish(self, rid: str) -> tuple[str, str | None]: ...
    def free(self, rid: str) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, rid: str) -> bool: ...
