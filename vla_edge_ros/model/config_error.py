"""The one error type of config.json parsing, below both ``config`` and ``vl_config`` (which it imports)."""

from __future__ import annotations


class ModelConfigError(ValueError):
    """A model directory or config.json that the engine cannot run faithfully."""
