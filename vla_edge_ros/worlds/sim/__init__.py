"""A tiny simulated world for closed-loop evaluation: ``cue-reach`` needs memory, ``reach`` does not,
``lang-reach`` needs the instruction, ``chase`` (a moving goal) punishes acting late."""

from .world import TASKS, CueReachEnv, StepOutcome, TaskSpec

__all__ = ["TASKS", "CueReachEnv", "StepOutcome", "TaskSpec"]
