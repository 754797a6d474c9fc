"""Type stubs of the private Rust extension `srt._rust` (see rust/python/src/lib.rs).

Only the facades in `srt.mem_cache`, `srt.managers` and `srt.ipc` import this module.
"""

__version__: str

class InvariantError(RuntimeError):
    """A data structure of srt's Rust core found one of its invariants broken (a bug in srt)."""
