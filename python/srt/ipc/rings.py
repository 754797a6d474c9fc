"""The names of one server's three rings, each named after the stage that receives on it."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass

from srt._rust import ShmRing


@dataclass(frozen=True, slots=True)
class RingNames:
    """`srt-<launcher pid>-<random>-<receiver>`: unique per server, traceable to its launcher."""

    scheduler: str
    detokenizer: str
    tokenizer: str

    @classmethod
    def new(cls) -> RingNames:
        prefix = f"srt-{os.getpid()}-{secrets.token_hex(4)}"
        return cls(f"{prefix}-scheduler", f"{prefix}-detokenizer", f"{prefix}-tokenizer")

    def all(self) -> tuple[str, str, str]:
        return (self.scheduler, self.detokenizer, self.tokenizer)

    def create(self, capacity: int, with_tokenizer: bool = True) -> None:
        """Creates the rings (removing any already created if one fails): all three, or without
        ring "tokenizer" for a server with no detokenizer (the main process then reads ring
        "detokenizer")."""
        names = self.all() if with_tokenizer else (self.scheduler, self.detokenizer)
        try:
            for name in names:
                ShmRing.create(name, capacity)
        except BaseException:
            self.unlink()
            raise

    def unlink(self) -> None:
        """Removes whatever names are left; attached ends keep working. Idempotent."""
        for name in self.all():
            ShmRing.unlink(name)
