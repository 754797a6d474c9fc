"""Type stubs of the private Rust extension `srt._rust` (see rust/python/src/lib.rs).

Only the facades in `srt.mem_cache`, `srt.managers` and `srt.ipc` import this module.
"""

__version__: str

class InvariantError(RuntimeError):
    """A data structure of srt's Rust core found one of its invariants broken (a bug in srt)."""

# --- shared-memory rings (rust/python/src/ring.rs) ---

class ShmRing:
    """One end (producer or consumer) of a shared-memory ring of byte frames.

    A gone peer raises `BrokenPipeError` from `wait`/`finish_wait`; a corrupt ring raises
    `InvariantError`; a frame longer than `max_frame_len` raises `ValueError`.
    """

    @staticmethod
    def create(name: str, capacity: int) -> None:
        """Creates the named ring with a data area of `capacity` bytes (a power of two)."""

    @staticmethod
    def unlink(name: str) -> bool:
        """Removes the ring's names; returns whether any existed."""

    @staticmethod
    def attach(name: str, role: str) -> ShmRing:
        """Attaches as `"producer"` or `"consumer"`; the second end to attach unlinks the names."""

    def try_push(self, data: bytes) -> bool:
        """Appends one frame; `False` when the ring has no room for it now."""

    def try_pop(self) -> bytes | None:
        """Removes and returns the oldest frame, or `None` when the ring is empty."""

    def fileno(self) -> int:
        """The descriptor this end sleeps on; readable when the peer rang or went away."""

    def prepare_wait(self, need: int = 0) -> bool:
        """Announces a sleep on `fileno()`; `False` when this end can proceed now."""

    def finish_wait(self) -> None:
        """Ends a sleep on `fileno()`; raises `BrokenPipeError` when the peer is gone."""

    def wait(self, timeout: float | None = None, need: int = 0) -> bool:
        """Blocks (GIL released) until this end may proceed; `False` on timeout."""

    @property
    def name(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def capacity(self) -> int: ...
    @property
    def max_frame_len(self) -> int: ...
    @property
    def peer_pid(self) -> int: ...
