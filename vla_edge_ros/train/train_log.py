"""The one log a training run writes: every phase's spec, demonstrations, seconds and a summary of its losses.

``train_log.json`` (schema ``vla_edge_ros.train/2``) is rewritten after each phase, so a run cut short still
says what it finished. A stage's per-step figures (thousands of rows, hundreds of kilobytes) are summarised
as the means of ``SEGMENTS`` runs of consecutive steps: the loss curve at a glance, in a few kilobytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = "vla_edge_ros.train/2"
LOG_NAME = "train_log.json"
SEGMENTS = 20  # means per figure and stage
DIGITS = 6  # significant digits of a summarised mean


@dataclass
class PhaseLog:
    """One phase as it ran. ``spec_schema`` names the layout of ``spec``: ``SCHEMA`` (``TrainSpec``'s nested
    one) for a phase trained now; ``vla_edge_ros.train/1``, the flat one of before phases, for the first
    phases of the shipped models/sim."""

    name: str
    spec: dict[str, Any]
    stages: dict[str, list[dict[str, float]]] = field(default_factory=dict)  # every step's figures, per stage
    seconds: dict[str, float] = field(default_factory=dict)  # per stage, and "demos"
    demos: dict[str, Any] = field(default_factory=dict)
    dagger: list[dict[str, Any]] = field(default_factory=list)  # per collection: episodes, frames, policy's success
    spec_schema: str = SCHEMA

    def summary(self) -> dict[str, Any]:
        """The phase as train_log.json holds it: each stage's figures summarised, the rest as it is."""
        summary = {"name": self.name, "spec_schema": self.spec_schema, "spec": self.spec, "seconds": self.seconds,
                   "demos": self.demos, "losses": {stage: summarise(rows) for stage, rows in self.stages.items()}}
        return summary | ({"dagger": self.dagger} if self.dagger else {})


def summarise(rows: list[dict[str, float]]) -> dict[str, Any]:
    """``{"steps": n, "every": k, "means": {figure: [mean of steps 0 to k-1, k to 2k-1, ...]}}``, a mean over
    the finite values a run of steps has (null where it has none: aura's memory warm-up has no action error)."""
    every = max(1, math.ceil(len(rows) / SEGMENTS))
    names = dict.fromkeys(name for row in rows for name in row)
    means: dict[str, list[float | None]] = {}
    for name in names:
        means[name] = []
        for start in range(0, len(rows), every):
            values = [row[name] for row in rows[start:start + every] if math.isfinite(row.get(name, math.nan))]
            means[name].append(float(f"{np.mean(values):.{DIGITS}g}") if values else None)
    return {"steps": len(rows), "every": every, "means": means}


def write_log(path: Path, phases: list[dict[str, Any]]) -> None:
    """The run's log: each phase's ``PhaseLog.summary``, in order."""
    path.write_text(json.dumps({"schema": SCHEMA, "phases": phases}, indent=1) + "\n")


def read_log(path: Path) -> list[dict[str, Any]]:
    """The phases ``write_log`` wrote to ``path``; ValueError for a file of another kind."""
    try:
        log = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a training log ({error})") from None
    if not isinstance(log, dict) or log.get("schema") != SCHEMA or not isinstance(log.get("phases"), list):
        raise ValueError(f"{path}: not a training log of this version ({SCHEMA})")
    return log["phases"]
