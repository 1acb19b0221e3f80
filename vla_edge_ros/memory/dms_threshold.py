"""The threshold dms compares keep scores with: fixed, or driven by a target compression ratio.

With ``target_ratio`` r = 0 the threshold is the configured one. With r >= 1 it is, for each new
batch of tokens (a frame, or one decoded token), the (1 - 1/r) quantile of the keep scores of the
``HISTORY_TOKENS`` tokens before it, every layer and KV head pooled (the first batch of an episode,
which has no history, uses its own): about one (token, head) decision in r is then a keep, so the
heads together keep about 1/r of what they see and the measured compression (tokens seen / tokens
kept) approaches r as the window's share of the cache shrinks. The batch itself stays out of its
quantile because its tokens are alike (one frame): counting them would lift the threshold exactly
when a frame scores high. One threshold for all heads, as DMS trains one compression target for the
whole model: a head whose scores run high keeps more than one whose scores run low, so per-head
lengths differ. r = 1 keeps everything.
"""

from __future__ import annotations

import math

import numpy as np

from .base import _array

HISTORY_TOKENS = 256  # recent tokens whose scores set the quantile (16 frames of 16 tokens)


def _quantile(values: np.ndarray, q: float) -> float:
    """np.quantile(values, q) (linear interpolation) by one partial sort: at these sizes np.quantile spends
    most of its time around the sort, and this runs once per frame and per decoded token."""
    index = q * (values.size - 1)
    lo = int(index)
    hi = min(lo + 1, values.size - 1)
    part = np.partition(values, (lo, hi))
    return float(part[lo] + (part[hi] - part[lo]) * (index - lo))


class KeepThreshold:
    """A fixed threshold, or the quantile of recent scores that a target ratio asks for."""

    def __init__(self, layers: int, kv_heads: int, *, threshold: float = 0.0, target_ratio: float = 0.0) -> None:
        self.history = np.zeros((HISTORY_TOKENS, layers, kv_heads), dtype=np.float32)
        self.count = 0  # tokens ever scored this episode; the ring holds the newest min(count, HISTORY_TOKENS)
        self.configure(threshold, target_ratio)
        self.current = float(threshold)

    def configure(self, threshold: float, target_ratio: float) -> None:
        """Set the knobs (``DmsKnobs`` checked them: target_ratio is 0 or >= 1)."""
        self.threshold, self.target_ratio = float(threshold), float(target_ratio)

    def reset(self) -> None:
        self.count = 0
        self.current = self.threshold

    def update(self, scores: np.ndarray) -> float:
        """The threshold that decides a batch's scores [T, layers, kv_heads]; then the batch joins the history."""
        size = self.history.shape[0]
        if self.target_ratio == 0:
            self.current = self.threshold
        elif self.target_ratio == 1:
            self.current = -math.inf  # compress nothing: every score is above
        else:
            recent = self.history[:min(self.count, size)] if self.count else scores
            self.current = _quantile(recent.ravel(), 1.0 - 1.0 / self.target_ratio)
        skipped = max(0, scores.shape[0] - size)
        rows = (self.count + skipped + np.arange(scores.shape[0] - skipped)) % size
        self.history[rows] = scores[skipped:]
        self.count += scores.shape[0]
        return self.current

    def snapshot(self) -> dict[str, np.ndarray]:
        return {"score_history": self.history.copy(),
                "threshold_state": np.array([self.count, self.current], dtype=np.float64)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.history = _array(state, "score_history", np.float32, self.history.shape).copy()
        count, current = _array(state, "threshold_state", np.float64, (2,))
        self.count, self.current = int(count), float(current)
