"""The VLA engine: the model and a memory policy over one KV arena."""

from .vla_engine import FramePrefill, StepResult, VlaEngine

__all__ = ["FramePrefill", "StepResult", "VlaEngine"]
