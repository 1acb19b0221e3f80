"""Turning the decoder's output into a robot action.

``bins`` (OpenVLA-style): each degree of freedom is one token among the last 256 vocabulary ids,
decoded greedily one after the other; token ``vocab - 256 + b`` means bin ``b`` whose centre is
-1 + (2b + 1) / 256 in [-1, 1]. ``linear``: tanh(W h + b) on the last hidden state, one per dof.
A head input (logits, or the linear head's pre-activation) holding NaN or Inf raises NonFiniteError:
argmax would read NaN logits as the first bin, tanh would read +Inf as full speed. Both then map [-1, 1] to the robot's range [q01, q99] per dimension, except dimensions whose
``normalize_mask`` is false (e.g. a gripper already in [-1, 1]).
"""

from __future__ import annotations

import numpy as np

from ..numerics.finite import require_finite
from .config import NUM_ACTION_BINS, ActionConfig


def bin_centers() -> np.ndarray:
    return (-1.0 + (2.0 * np.arange(NUM_ACTION_BINS) + 1.0) / NUM_ACTION_BINS).astype(np.float32)


class ActionHead:
    def __init__(self, action: ActionConfig, vocab_size: int, weight: np.ndarray | None = None,
                 bias: np.ndarray | None = None) -> None:
        self.config = action
        q01, q99, mask = action.bounds()
        self.q01 = np.asarray(q01, dtype=np.float32)
        self.q99 = np.asarray(q99, dtype=np.float32)
        self.mask = np.asarray(mask, dtype=bool)
        self.bin_rows = slice(vocab_size - NUM_ACTION_BINS, vocab_size)
        self.first_bin_token = vocab_size - NUM_ACTION_BINS
        self.weight = weight
        self.bias = bias
        self.centers = bin_centers()

    def unnormalize(self, normalized: np.ndarray) -> np.ndarray:
        scaled = 0.5 * (normalized + 1.0) * (self.q99 - self.q01) + self.q01
        return require_finite(np.where(self.mask, scaled, normalized).astype(np.float32), "the action")

    def from_bins(self, bins: list[int]) -> np.ndarray:
        """Bins (0..255, one per dof) -> action in robot units."""
        return self.unnormalize(self.centers[np.asarray(bins, dtype=np.int64)])

    def from_hidden(self, hidden: np.ndarray) -> np.ndarray:
        """Continuous head on one final-norm hidden state [H] -> action in robot units."""
        return self.unnormalize(np.tanh(require_finite(self.weight @ hidden + self.bias, "the linear action head's input")))
