"""Importing Meta-World and MuJoCo for headless rendering, or one line saying what to install.

MuJoCo picks its OpenGL back end once, when it is first imported, from ``MUJOCO_GL``; without it, it
tries GLFW, which needs a display. So ``MUJOCO_GL=osmesa`` (software rendering, no display, no GPU) is set
before the import, unless the user chose a back end already (``egl`` on a GPU machine). Under OSMesa the
import loads ``libOSMesa`` through PyOpenGL; where that library is absent the failure surfaces deep inside
PyOpenGL's platform loader. Here every such failure becomes one ``WorldUnavailable`` (a ValueError, so the
command line prints it as one line and exits 2) that names what to install: the ``metaworld`` extra for a
missing Python module, Debian's ``libosmesa6`` for a missing library.

Nothing is downloaded: the wheel of ``metaworld`` carries every task's MuJoCo model, meshes and scripted
expert policy.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from types import ModuleType

from ...dependencies import missing

EXTRA = "metaworld"
GL_BACKEND = "osmesa"
OSMESA_PACKAGE = "libosmesa6"  # Debian's and Ubuntu's package of libOSMesa.so.8, the only system package needed


class WorldUnavailable(ValueError):
    """Meta-World cannot run on this machine; the message is one line naming what to install."""


@dataclass(frozen=True)
class Backend:
    """What the environment uses of the two libraries, imported once per process."""

    mujoco: ModuleType
    environments: dict[str, type]  # task name -> its SawyerXYZEnv subclass
    experts: dict[str, type]       # task name -> its scripted expert policy class
    task: type                     # metaworld.types.Task: what ``set_task`` takes (name, pickled parameters)


_loaded: Backend | None = None


def load() -> Backend:
    """MuJoCo (headless) and Meta-World's environments and experts, imported on first use (not when this
    package is: a harness that never makes an environment pays nothing); ``WorldUnavailable`` if they cannot
    load."""
    global _loaded
    if _loaded is None:
        _loaded = _import()
    return _loaded


def _import() -> Backend:
    if "mujoco" not in sys.modules:  # once MuJoCo is imported its back end is fixed; setting it later changes nothing
        os.environ.setdefault("MUJOCO_GL", GL_BACKEND)
    try:
        import OpenGL  # noqa: F401  PyOpenGL: MuJoCo's OSMesa and EGL contexts are built on it
    except ImportError:
        raise _missing_extra() from None
    try:
        import mujoco
    except ModuleNotFoundError as exc:
        if exc.name == "mujoco":
            raise _missing_extra() from None
        raise WorldUnavailable(gl_advice(exc)) from None
    except (ImportError, OSError, RuntimeError, AttributeError) as exc:
        # PyOpenGL's or MuJoCo's GL loading. Without libOSMesa, PyOpenGL's loader returns None for the library
        # and the import fails with "'NoneType' object has no attribute 'glGetError'"
        raise WorldUnavailable(gl_advice(exc)) from None
    try:
        import metaworld.env_dict
        import metaworld.policies
        import metaworld.types
    except ImportError:  # metaworld itself, or one of its own dependencies (gymnasium, scipy)
        raise _missing_extra() from None
    return Backend(mujoco=mujoco, environments=dict(metaworld.env_dict.ALL_V3_ENVIRONMENTS),
                   experts=dict(metaworld.policies.ENV_POLICY_MAP), task=metaworld.types.Task)


def _missing_extra() -> WorldUnavailable:
    """The extra's line, as every optional feature words it; a module of the extra's own dependencies
    (gymnasium, scipy) missing is mended by the same install."""
    return WorldUnavailable(str(missing(EXTRA, "Meta-World")))


def gl_advice(exc: BaseException) -> str:
    """The one line for a MuJoCo that imports but cannot render: which back end failed, why, what to do."""
    chosen = os.environ.get("MUJOCO_GL", "")
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line, whatever the library wrote
    if chosen.lower() == GL_BACKEND:
        return (f"Meta-World renders headless through OSMesa (MUJOCO_GL=osmesa), which could not be loaded "
                f"({reason}): install it with 'apt-get install {OSMESA_PACKAGE}' (Debian, Ubuntu)")
    return (f"MuJoCo could not start its MUJOCO_GL={chosen!r} renderer ({reason}): unset MUJOCO_GL to render "
            f"headless through OSMesa ('apt-get install {OSMESA_PACKAGE}' on Debian, Ubuntu)")


def renderer_error(exc: BaseException) -> WorldUnavailable:
    """A GL context that could not be created when a camera opened: the same advice as at import."""
    return WorldUnavailable(gl_advice(exc))
