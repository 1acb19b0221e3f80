"""From the episodes of one cell to its row's figures: recall, attention, readout accuracy, writes, bytes.

Rates are means over the cell's episodes; bytes are the most any episode held at its query. The aura
readout is a nearest-prototype classifier: per-class mean reads over the prototype episodes, centred
on their mean, and a test read is classified by its highest cosine to them after the same centring.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

NOT_DMS = {"target_ratio": None, "cue_entries_kept": None, "cue_centre_kept": None, "compression": None,
           "forced_evictions": None}


def summarise(per_episode: list[dict[str, Any]]) -> dict[str, Any]:
    """Episode results -> one row's shared columns (means of rates, max of bytes)."""
    return {
        "episodes": len(per_episode),
        "writes_per_frame": float(np.mean([e["writes"] / e["frames"] for e in per_episode])),
        "evictions": float(np.mean([e["evictions"] for e in per_episode])),
        **{key: max(e[key] for e in per_episode) for key in ("memory_bytes", "kv_bytes", "state_bytes")},
    }


def window_row(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One fifo/cosine cell from its episodes."""
    return {
        "cue_kept": float(np.mean([r["kept"] for r in results])),
        "cue_attention": float(np.mean([r["attention"] for r in results])),
        "uniform_attention": float(np.mean([r["uniform"] for r in results])),
        **summarise(results),
    }


def dms_row(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One dms cell from its episodes."""
    return {
        "cue_kept": float(np.mean([r["kept"] for r in results])),
        "cue_entries_kept": float(np.mean([r["entries"] for r in results])),
        "cue_centre_kept": float(np.mean([r["centre"] for r in results])),
        "cue_attention": float(np.mean([r["attention"] for r in results])),
        "uniform_attention": float(np.mean([r["uniform"] for r in results])),
        "compression": float(np.mean([r["compression"] for r in results])),
        "forced_evictions": float(np.mean([r["forced"] for r in results])),
        **summarise(results),
    }


def aura_row(gate: str, rate: float | None, capacity: int, tests: list[dict[str, Any]],
             prototypes: list[dict[str, Any]], classes: int) -> dict[str, Any]:
    """One aura gate at one N, from its test and prototype episodes."""
    return {"policy": "aura", "gate": gate, **NOT_DMS, "gate_rate": rate, "kv_capacity_tokens": capacity,
            "protect_recent_frames": None, "cue_kept": None, "cue_attention": None, "uniform_attention": None,
            "readout_accuracy": prototype_accuracy(prototypes, tests, classes), **summarise(tests)}


def _unit(x: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(x))
    return (x / norm).astype(np.float32) if norm > 0 else x.astype(np.float32)


def prototype_accuracy(prototype_runs: list[dict[str, Any]], test_runs: list[dict[str, Any]], classes: int) -> float:
    """Fraction of test reads whose nearest centred class prototype (by cosine) is their own class."""
    def read(run: dict[str, Any]) -> np.ndarray:  # fp32, as the memory returned it (a result file holds floats)
        return np.asarray(run["read"], dtype=np.float32)

    prototypes = np.stack([np.mean([read(r) for r in prototype_runs if r["cls"] == c], axis=0)
                           for c in range(classes)])
    centre = prototypes.mean(axis=0)
    centred = np.stack([_unit(p - centre) for p in prototypes])
    hits = [int(np.argmax(centred @ _unit(read(r) - centre))) == r["cls"] for r in test_runs]
    return float(np.mean(hits))


def above_chance(accuracy: float, chance: float, episodes: int) -> bool:
    """More than two binomial standard errors above chance."""
    return accuracy > chance + 2 * math.sqrt(chance * (1 - chance) / episodes)
