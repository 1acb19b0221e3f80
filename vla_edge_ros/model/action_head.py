"""Turning the decoder's output into a chunk of robot actions: [H, dof], H = ``vla.action.chunk``.

``bins`` (OpenVLA-style): each degree of freedom is one token among the last 256 vocabulary ids; token
``vocab - 256 + b`` means bin ``b`` whose centre is -1 + (2b + 1) / 256 in [-1, 1]. With H = 1 the dof
tokens are decoded greedily one after the other, each fed back (OpenVLA). With H > 1 all H x dof are
decoded in one forward pass, after OpenVLA-OFT's parallel decoding: H x dof placeholder inputs (zero
embeddings) at the positions after the observation, each position's bin the argmax of its logits over
the bins, token i * dof + d being action i's dimension d (``VlaEngine.decode_action``). OFT lets the action
positions attend to each other both ways; here attention stays causal (the backends' one masking rule:
a token reads every token not after it), so a placeholder reads the ones before it only, and the
checkpoint must have been trained that way. ``linear``: tanh(W h + b) on the last hidden state, one per
dof (H = 1).

``mlp`` (OpenVLA-OFT's continuous chunk head, L1-trained there): the last hidden state h through one
hidden layer, tanh(fc2 GELU(fc1 h + b1) + b2), H x dof values at once: row i * dof + d of fc2 is action
i's dimension d, action i meant for one control period after action i - 1. GELU is the exact (erf) form,
torch's ``nn.GELU()``: the same activation as the VL towers' patch merger, so the cuda backend runs the
head on kernels it already has (``Backend.action_mlp``). OFT's MLPResNet has more layers and
LayerNorms; one hidden layer is what the tests hold against torch and what a small trained model needs.

A head input (logits, or a continuous head's pre-activation) holding NaN or Inf raises NonFiniteError:
argmax would read NaN logits as the first bin, tanh would read +Inf as full speed. Every head then maps
[-1, 1] to the robot's range [q01, q99] per dimension (``unnormalize``, the one mapping), except
dimensions whose ``normalize_mask`` is false (e.g. a gripper already in [-1, 1]).
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
        """Actions [..., dof] in [-1, 1] -> robot units, per dimension (masked dimensions stay as they are)."""
        scaled = 0.5 * (normalized + 1.0) * (self.q99 - self.q01) + self.q01
        return require_finite(np.where(self.mask, scaled, normalized).astype(np.float32), "the action")

    def from_bins(self, bins: list[int] | np.ndarray) -> np.ndarray:
        """Bins (0..255, H x dof of them, action by action) -> the chunk [H, dof] in robot units."""
        return self.unnormalize(self.centers[np.asarray(bins, dtype=np.int64)].reshape(-1, self.config.dof))

    def from_hidden(self, hidden: np.ndarray) -> np.ndarray:
        """Linear head on one final-norm hidden state [H] -> a chunk of one action [1, dof] in robot units."""
        return self.from_preactivation(self.weight @ hidden + self.bias, "the linear action head's input")

    def from_preactivation(self, values: np.ndarray, what: str = "the mlp action head's output") -> np.ndarray:
        """A continuous head's pre-tanh outputs [chunk * dof] -> the chunk [chunk, dof] in robot units."""
        normalized = np.tanh(require_finite(np.asarray(values, dtype=np.float32), what))
        return self.unnormalize(normalized.reshape(-1, self.config.dof))
