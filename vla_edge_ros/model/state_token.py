"""The robot's state as one input token: normalise, then project to the decoder's width.

As OpenVLA-OFT and GR00T feed proprioception: the state vector x (joint positions, or odometry; what the
ROS layer reads is in docs/robot.md) is normalised per dimension with the checkpoint's statistics,
z = (x - mean) / std (``vla.state`` in config.json), and projected, token = W z + b with
``state_proj.weight`` [hidden, dim] and ``state_proj.bias`` [hidden]. The token follows the observation's
camera tokens, so the action is decoded from the hidden state of the token that read the state.

A state is never made up: one of the wrong length or holding NaN or Inf is refused here with a StateError,
and so is one whose normalised values overflow, whatever checked it before.
"""

from __future__ import annotations

import numpy as np

from .checkpoint import STATE_PROJ, Checkpoint
from .config import StateConfig


class StateError(ValueError):
    """A robot state the model cannot take (wrong length, not finite)."""


def check_state(state: np.ndarray | None, dim: int) -> np.ndarray:
    """``state`` as a float32 vector of ``dim`` finite values, or StateError saying what is wrong with it."""
    if state is None:
        raise StateError(f"the model reads a robot state of {dim} values, and none was given")
    values = np.asarray(state, dtype=np.float32)
    if values.shape != (dim,):
        raise StateError(f"a robot state must be {dim} values, got shape {list(values.shape)}")
    if not np.isfinite(values).all():
        raise StateError(f"a robot state holds NaN or Inf: {np.array2string(values, precision=4, threshold=8)}")
    return values


class StateProjection:
    """x -> one [1, hidden] token, with the checkpoint's statistics and projection."""

    def __init__(self, config: StateConfig, weight: np.ndarray, bias: np.ndarray) -> None:
        self.dim = config.dim
        self.mean = np.asarray(config.mean or (0.0,) * config.dim, dtype=np.float32)
        self.std = np.asarray(config.std or (1.0,) * config.dim, dtype=np.float32)
        self.weight = weight
        self.bias = bias

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> StateProjection | None:
        """The checkpoint's projection; None when it reads no state."""
        state = checkpoint.config.state
        if state is None:
            return None
        return cls(state, *(checkpoint.float32(name) for name in STATE_PROJ))

    def token(self, state: np.ndarray | None) -> np.ndarray:
        """[1, hidden] fp32: the projected, normalised ``state``; StateError if it cannot be one."""
        with np.errstate(over="ignore", invalid="ignore"):
            z = (check_state(state, self.dim) - self.mean) / self.std
        if not np.isfinite(z).all():
            raise StateError(f"a robot state overflows once normalised by the checkpoint's mean and std: "
                             f"{np.array2string(z, precision=4, threshold=8)}")
        return (self.weight @ z + self.bias)[None, :].astype(np.float32, copy=False)
