"""What one Meta-World episode is: the task, the camera that sees it, the frame size and the step limit.

Checked without importing MuJoCo, so a configuration is refused (with the field that is wrong) before the
slow import, and on a machine without the extra too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .camera import CAMERAS
from .tasks import TASKS, description

MAX_PATH_LENGTH = 500   # Meta-World's own limit: its environments refuse a step beyond it
MAX_IMAGE_SIDE = 2048   # pixels: far beyond what a policy is fed, and an OSMesa buffer that still fits in memory


@dataclass(frozen=True)
class ArmSpec:
    """One task seen by one camera; the defaults are LeRobot's Meta-World protocol (``corner2``) at the
    96 x 96 frames the package's own world renders."""

    task: str = "push-v3"
    camera: str = "corner2"
    width: int = 96
    height: int = 96
    max_steps: int = MAX_PATH_LENGTH  # the episode ends here unless it succeeded first
    goal_shown_s: float | None = None  # the goal marker drawn for this long from reset only (a memory test); None: always

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        description(self.task)  # names the known tasks for an unknown one
        if self.camera not in CAMERAS:
            raise ValueError(f"camera: unknown camera {self.camera!r}, expected one of {CAMERAS}")
        for field in ("width", "height"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or not 8 <= value <= MAX_IMAGE_SIDE:
                raise ValueError(f"{field}: need an int in [8, {MAX_IMAGE_SIDE}] (pixels), got {value!r}")
        if not isinstance(self.max_steps, int) or isinstance(self.max_steps, bool) or \
                not 1 <= self.max_steps <= MAX_PATH_LENGTH:
            raise ValueError(f"max_steps: need an int in [1, {MAX_PATH_LENGTH}] (Meta-World's limit), "
                             f"got {self.max_steps!r}")
        shown = self.goal_shown_s
        if shown is not None and (not isinstance(shown, (int, float)) or isinstance(shown, bool)
                                  or not math.isfinite(shown) or shown < 0):
            raise ValueError(f"goal_shown_s: need seconds >= 0 (or None: the goal always drawn), got {shown!r}")

    @property
    def description(self) -> str:
        """The instruction a policy is given for this task."""
        return description(self.task)
