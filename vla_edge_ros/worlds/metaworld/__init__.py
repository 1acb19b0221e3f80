"""Meta-World (50 Sawyer-arm tasks on MuJoCo) as a world nobody here wrote, behind the ``metaworld`` extra.

Importing this package imports neither MuJoCo nor Meta-World: ``MetaWorldEnv`` does, on first use, and a
machine without them (or without OSMesa) gets one ``WorldUnavailable`` line naming what to install.
"""

from .backend import WorldUnavailable
from .env import ACTION, STATE, MetaWorldEnv, StepOutcome, check_goal_marker, clip_action
from .spec import ArmSpec
from .tasks import DESCRIPTIONS, MT10, TASKS, description

__all__ = ["ACTION", "DESCRIPTIONS", "MT10", "STATE", "TASKS", "ArmSpec", "MetaWorldEnv", "StepOutcome",
           "WorldUnavailable", "check_goal_marker", "clip_action", "description"]
