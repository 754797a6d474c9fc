"""`ForwardMode`: what one forward pass does, the one name the scheduler, the model runner and
the attention layers share. A ground-floor module (no torch), so that the scheduler can name the
kind of batch it builds and the layers can read it from `ForwardBatch`."""

from __future__ import annotations

import enum


class ForwardMode(enum.Enum):
    EXTEND = enum.auto()  # new tokens of several sequences, each after its cached prefix
    DECODE = enum.auto()  # one new token per sequence
