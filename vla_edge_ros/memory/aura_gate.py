"""aura's write gate: whether a frame is written into the fast weights, decided once per frame.

The gate is a strategy the aura policy is given. The policy makes the frame's key and value, offers
them (``WriteOffer``) and applies the answer with one ``FastWeights.step``; the gate only decides.
The answer is the pair ``step`` takes, (threshold, force): write iff the surprise ||v - (W k + b)||
exceeds the threshold, or iff ``force`` when the threshold is infinite. A gate that thresholds the
surprise lets the step compute it once, on the device the memory lives on.

One gate ships: ``SurpriseGate``, what a robot runs. Evaluation's baselines (writes at random, on a
schedule, or never: the same budget without a notion of surprise) are gates of the same interface
that live with the tools (``tools/aura_gates.py``), so nothing in the runtime can select them.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from .memory_math import FastWeights


@dataclass(frozen=True)
class WriteOffer:
    """A frame offered to the fast weights, and all a gate may weigh it by."""

    frame: int  # frames offered this episode, this one included (1 for the first)
    key: np.ndarray  # k [d_k], unit length
    value: np.ndarray  # v [d_v]
    scale: float  # ||v||, finite
    memory: FastWeights  # as it is before this frame's write
    threshold: float  # kv.aura.threshold after the write-rate adaptation, relative to ||v||
    learned: tuple[np.ndarray, np.ndarray] | None  # the checkpoint's gate (weight, bias), when it is to decide
    tightening: float  # lambda >= 0 of the write-rate adaptation, subtracted from a learned logit


class WriteGate(ABC):
    """Decides each write of an aura memory; one instance serves one policy."""

    def reset(self) -> None:
        """A new episode begins: a gate with state of its own restarts it."""

    @abstractmethod
    def decide(self, offer: WriteOffer) -> tuple[float, bool]:
        """(threshold on the surprise, forced write) for ``FastWeights.step``."""


class SurpriseGate(WriteGate):
    """Write what the memory did not expect: the checkpoint's learned gate when it decides (write iff
    w . [k, v - (W k + b)] + c - lambda > 0), otherwise the surprise threshold (write iff
    ||v - (W k + b)|| > threshold * ||v||)."""

    def decide(self, offer: WriteOffer) -> tuple[float, bool]:
        if offer.learned is not None:
            weight, bias = offer.learned
            error = offer.value - offer.memory.read(offer.key)
            logit = float(weight[0] @ np.concatenate([offer.key, error]) + bias[0])
            return math.inf, logit - offer.tightening > 0
        return offer.threshold * offer.scale, False
