"""One named camera of a Meta-World scene, rendered headless into uint8 RGB frames the right way up.

Two things make the difference between a usable world and an unusable one on a CPU:

- Speed. MuJoCo's default scene draws shadows and reflections, which under OSMesa (software OpenGL) cost
  about 90-105 ms a frame whatever its size (issue 26, a loaded 2-core machine). With ``mjRND_SHADOW`` and
  ``mjRND_REFLECTION`` off a 96 x 96 frame costs about 17-18 ms there. A policy sees no less: the objects,
  the arm and the goal marker are drawn the same.
- Orientation. Meta-World's four ``corner`` cameras are defined rolled by 180 degrees about their view axis,
  so under MuJoCo 3 their frames come out upside down (the floor above the table). Rotating the frame by
  180 degrees (reversing rows and columns) gives the picture an upright camera at the same pose takes.
  Reversing the rows alone would mirror the scene: left and right would swap, and a policy trained on
  such frames would learn a world that does not exist.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .backend import load, renderer_error

CAMERAS = ("corner2", "corner", "corner3", "corner4", "topview", "behindGripper", "gripperPOV")  # the scene's
ROLLED = frozenset({"corner", "corner2", "corner3", "corner4"})  # defined upside down: rotated back by 180 degrees


class Camera:
    """Renders ``name`` of ``model`` at ``height`` x ``width``; ``frame(data)`` is a fresh HxWx3 uint8 array."""

    def __init__(self, model: Any, name: str, height: int, width: int) -> None:
        if name not in CAMERAS:
            raise ValueError(f"camera: unknown camera {name!r}, expected one of {CAMERAS}")
        mujoco = load().mujoco
        self.name, self.height, self.width = name, height, width
        # the off-screen buffer must hold the frame; the scene's default is 640 x 480
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, width)
        model.vis.global_.offheight = max(model.vis.global_.offheight, height)
        try:
            self._renderer = mujoco.Renderer(model, height=height, width=width)
        except (RuntimeError, ImportError, OSError, AttributeError) as exc:  # no GL context could be made
            raise renderer_error(exc) from None
        flags = self._renderer.scene.flags
        flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0

    def raw(self, data: Any) -> np.ndarray:
        """The frame as MuJoCo renders it, not turned (a test compares it with ``frame``)."""
        self._renderer.update_scene(data, camera=self.name)
        return self._renderer.render()

    def frame(self, data: Any) -> np.ndarray:
        """The camera's view of ``data`` now, upright: HxWx3 uint8, C-contiguous, owned by the caller."""
        image = self.raw(data)
        if self.name in ROLLED:
            image = image[::-1, ::-1]
        return np.ascontiguousarray(image)

    def close(self) -> None:
        """Frees the GL context (an OSMesa buffer); the camera renders nothing after."""
        renderer, self._renderer = getattr(self, "_renderer", None), None
        if renderer is not None:
            renderer.close()
