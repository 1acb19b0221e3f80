"""What the memory benchmark sweeps, and the episodes it shows the policies.

An episode is a ``CueScene``: optional look-alike frames (dms's lead-in), one cue frame (class = episode
index % K), N near-identical distractor frames, then a query frame. Episodes are seeded by split and
index (``worlds.scenes.scene_seed``), so a unit of the sweep rebuilds its episode from its name alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...memory import POLICIES
from ...memory.cosine import SIGNATURES
from ...model.checkpoint import Checkpoint
from ...worlds.scenes import MAX_CLASSES, CueScene, scene_seed

PROMPT = tuple(range(1, 9))  # a fixed 8-token instruction; the bench is about frames, not words
MODEL_SEED = 0
FRAME_HW = (64, 64)
AURA_GATES = ("surprise", "every_frame", "random", "periodic")


@dataclass(frozen=True)
class BenchSpec:
    """What to sweep; the defaults keep a run to a few minutes on a 2-core CPU."""

    episodes: int = 32  # two binomial standard errors above chance 1/4 is then 0.40
    distractors: tuple[int, ...] = (4, 16, 64)
    budgets: tuple[int, ...] = (4, 8, 16)
    policies: tuple[str, ...] = POLICIES
    cosine_signatures: tuple[str, ...] = SIGNATURES  # the first is the one the claims judge
    classes: int = 4
    seed: int = 0
    prototypes_per_class: int = 4
    overhead_arena_frames: int = 64
    overhead_frames: int = 200
    dms_targets: tuple[float, ...] = (4.0, 8.0)  # the last is the one the recall claim judges
    dms_window: int = 32
    dms_lead_in: int = 4  # look-alike frames before the cue in dms episodes (see the package doc)
    compression_frames: int = 256

    @property
    def prototype_episodes(self) -> int:
        """Episodes per N that build the aura readout's class prototypes."""
        return self.classes * self.prototypes_per_class

    def validate(self) -> None:
        for name in ("episodes", "prototypes_per_class", "overhead_arena_frames", "overhead_frames", "dms_window",
                     "compression_frames"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dms_lead_in < 0:
            raise ValueError(f"dms_lead_in must be >= 0, got {self.dms_lead_in}")
        for name in ("distractors", "budgets"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise ValueError(f"{name} must be a non-empty list of positive integers, got {list(values)}")
        if not self.cosine_signatures or any(sig not in SIGNATURES for sig in self.cosine_signatures):
            raise ValueError(f"cosine_signatures must be a non-empty subset of {SIGNATURES}, "
                             f"got {list(self.cosine_signatures)}")
        unknown = [p for p in self.policies if p not in POLICIES]
        if not self.policies or unknown:
            raise ValueError(f"policies must be a non-empty subset of {POLICIES}, got {list(self.policies)}")
        if not 2 <= self.classes <= MAX_CLASSES:
            raise ValueError(f"classes must be in [2, {MAX_CLASSES}] (chance must be below 1), got {self.classes}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if not self.dms_targets or min(self.dms_targets) < 1:
            raise ValueError(f"dms_targets must be a non-empty list of ratios >= 1, got {list(self.dms_targets)}")


@dataclass(frozen=True)
class Episode:
    cls: int
    seed: int
    frames: list[np.ndarray]
    cue_index: int = 0  # the cue's frame: after ``lead_in`` look-alike frames


def make_episode(spec: BenchSpec, split: int, index: int, distractors: int, lead_in: int = 0) -> Episode:
    """Episode ``index`` of ``split``, seeded: ``lead_in`` distractor frames, the cue, ``distractors``
    distractors, the query."""
    seed, cls = scene_seed(spec.seed, split, index), index % spec.classes
    scene = CueScene(seed, classes=spec.classes, height=FRAME_HW[0], width=FRAME_HW[1])
    before = [scene.distractor_frame() for _ in range(lead_in)]
    return Episode(cls, seed, before + scene.episode(cls, distractors), lead_in)


def make_episodes(spec: BenchSpec, split: int, count: int, distractors: int, lead_in: int = 0) -> list[Episode]:
    return [make_episode(spec, split, index, distractors, lead_in) for index in range(count)]


def cue_token(spec: BenchSpec, episode: Episode, checkpoint: Checkpoint) -> int:
    """Index of the frame token whose cell of the encoder's grid holds the centre of the cue disc."""
    scene = CueScene(episode.seed, classes=spec.classes, height=FRAME_HW[0], width=FRAME_HW[1])
    cy, cx, _ = scene.cue_region(episode.cls)
    grid = checkpoint.config.vision.pool_grid
    return int(cy * grid / FRAME_HW[0]) * grid + int(cx * grid / FRAME_HW[1])
