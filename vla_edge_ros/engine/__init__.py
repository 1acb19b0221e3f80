"""The VLA engine: the model and a memory policy over one KV arena."""

from .vla_engine import EncodedFrame, FramePrefill, StepResult, VlaEngine

__all__ = ["EncodedFrame", "FramePrefill", "StepResult", "VlaEngine"]
