"""Type stubs of the private Rust extension `srt._rust` (see rust/python/src/lib.rs)."""

__version__: str
