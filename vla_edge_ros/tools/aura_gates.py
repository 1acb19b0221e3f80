"""The aura write gates that only evaluation runs: baselines with no notion of surprise.

A surprise gate is only worth its computation if it writes better frames than a gate that does not
look at them, at the same write budget. These are those gates, plugged into the aura policy where a
robot's ``SurpriseGate`` sits (``memory/aura_gate.py``); the memory benchmark and ``vla-edge
evaluate`` build them, the runtime cannot. They ignore the checkpoint's learned gate too.

- ``random`` writes each frame with probability ``rate``.
- ``periodic`` writes at frame n (from 1) iff floor(phase + n * rate) > floor(phase + (n - 1) * rate),
  so it writes exactly ``rate`` of the frames (within one write), spread as evenly as whole frames
  allow, and is not lined up with the episode's first frame. (A whole period, round(1 / rate), wrote
  at 0.5 when asked for 0.66.)
- ``no-write`` writes nothing: the memory stays empty and reads zero, the ablation of the memory.

The seeded gates restart their draws from the seed with each episode. Each draws the phase first,
the random gate included, so that one seed gives one stream of draws whichever gate reads it.
"""

from __future__ import annotations

import math

import numpy as np

from ..config import AuraKnobs
from ..memory.aura import AuraPolicy
from ..memory.aura_gate import WriteGate, WriteOffer

BASELINE_GATES = ("random", "periodic", "no-write")


class SeededGate(WriteGate):
    """A gate that writes ``rate`` of the frames by a schedule drawn from ``seed``."""

    def __init__(self, rate: float, seed: int) -> None:
        if not 0 < rate <= 1:
            raise ValueError(f"a gate's write rate must be in (0, 1], got {rate}")
        self.rate, self.seed = rate, seed
        self.reset()

    def reset(self) -> None:
        self.draws = np.random.default_rng(self.seed)
        self.phase = float(self.draws.random())


class RandomGate(SeededGate):
    """Writes each frame with probability ``rate``."""

    def decide(self, offer: WriteOffer) -> tuple[float, bool]:
        return math.inf, bool(self.draws.random() < self.rate)


class PeriodicGate(SeededGate):
    """Writes ``rate`` of the frames, evenly spaced from a drawn phase."""

    def decide(self, offer: WriteOffer) -> tuple[float, bool]:
        due = math.floor(self.phase + offer.frame * self.rate)
        return math.inf, due > math.floor(self.phase + (offer.frame - 1) * self.rate)


class NoWriteGate(WriteGate):
    """Writes nothing: the memory ablated."""

    def decide(self, offer: WriteOffer) -> tuple[float, bool]:
        return math.inf, False


def baseline_gate(name: str, rate: float = 1.0, seed: int = 0) -> WriteGate:
    """The baseline ``name`` of ``BASELINE_GATES``; ``rate`` and ``seed`` are the seeded gates'."""
    if name == "random":
        return RandomGate(rate, seed)
    if name == "periodic":
        return PeriodicGate(rate, seed)
    if name == "no-write":
        return NoWriteGate()
    raise ValueError(f"baseline gate must be one of {BASELINE_GATES}, got {name!r}")


def baseline_policy(knobs: AuraKnobs, gate: str, rate: float = 1.0, seed: int = 0) -> AuraPolicy:
    """An aura policy whose writes the baseline ``gate`` decides (its other knobs: ``knobs``)."""
    return AuraPolicy(knobs, baseline_gate(gate, rate, seed))
