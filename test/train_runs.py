"""What the training tests share: a run of ``vla-edge train`` resumed over the files an earlier run left."""

from __future__ import annotations

from pathlib import Path

from vla_edge_ros.cli import main


def assert_resume_keeps(recipe: Path, out: Path, kept: list[Path]) -> None:
    """``--resume`` of the run that wrote ``out`` from ``recipe`` on two workers rewrites none of ``kept`` (its
    collected episodes) and gives the same weights."""
    weights = (out / "model.safetensors").read_bytes()
    stamps = {path: path.stat().st_mtime_ns for path in kept}
    assert main(["train", "--recipe", str(recipe), "--out", str(out), "--workers", "2", "--quiet", "--resume"]) == 0
    assert {path: path.stat().st_mtime_ns for path in kept} == stamps
    assert (out / "model.safetensors").read_bytes() == weights
