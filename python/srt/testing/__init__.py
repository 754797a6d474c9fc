"""Test models for srt, built offline: tiny random fixtures and SmolLM2 from a package."""

from __future__ import annotations

from srt.testing.smollm2 import smollm2_path

__all__ = ["smollm2_path"]
