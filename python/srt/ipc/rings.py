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

    def create(self, capacity: int) -> None:
        """Creates all three rings (removing any already created if one fails)."""
        try:
            for name in self.all():
                ShmRing.create(name, capacity)
        except BaseException:
            self.unlink()
            raise

    def unlink(self) -> None:
        """Removes whatever names are left; attached ends keep working. Idempotent."""
        for name in self.all():
            ShmRing.unlink(name)
