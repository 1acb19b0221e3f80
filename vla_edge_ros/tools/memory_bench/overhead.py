"""What each policy costs per frame: its own work, and the whole ``add_frame`` around it, on a full arena.

These are timings, so they run alone after the sweep, never in its units (``runner.run_bench``). The
policy's share is timed by wrapping its own methods on the instance for the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ...memory import MemoryPolicy
from ...model.checkpoint import Checkpoint
from ...worlds.scenes import OVERHEAD, CueScene, scene_seed
from .cells import bench_engine, dms_policy, window_capacity, window_policy
from .spec import FRAME_HW, BenchSpec


@contextmanager
def _timing(policy: MemoryPolicy, names: tuple[str, ...]) -> Iterator[list[float]]:
    """Accumulate the time spent in ``policy``'s named methods into the yielded one-element list."""
    spent = [0.0]
    originals = {name: getattr(policy, name) for name in names}

    def timed(method: Callable) -> Callable:
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start
        return call

    for name, method in originals.items():
        setattr(policy, name, timed(method))
    try:
        yield spent
    finally:
        for name in names:
            delattr(policy, name)  # the instance attribute goes; the class's method shows again


def measure_overhead(checkpoint: Checkpoint, name: str, spec: BenchSpec) -> dict[str, Any]:
    """Median per-frame cost of the policy's own work, and of the whole add_frame, on a full arena."""
    arena_frames = spec.overhead_arena_frames
    policy = dms_policy(spec, spec.dms_targets[0]) if name == "dms" else window_policy(name, arena_frames)
    engine = bench_engine(checkpoint, policy, window_capacity(checkpoint, arena_frames))
    scene = CueScene(scene_seed(spec.seed, OVERHEAD, 0), classes=spec.classes, height=FRAME_HW[0], width=FRAME_HW[1])
    for _ in range(arena_frames):  # fill the window first, so every timed frame evicts (dms: decides and enforces)
        engine.add_frame(scene.distractor_frame())
    methods = ("frame_prefix", "make_room", "add_frame") if name == "aura" else ("make_room", "add_frame")
    policy_ms, total_ms = [], []
    images = [scene.distractor_frame() for _ in range(spec.overhead_frames)]
    with _timing(engine.policy, methods) as spent:
        for image in images:
            spent[0] = 0.0
            start = time.perf_counter()
            engine.add_frame(image)
            total_ms.append((time.perf_counter() - start) * 1e3)
            policy_ms.append(spent[0] * 1e3)
    return {"policy": name, "arena_frames": arena_frames, "frames": len(images),
            "policy_ms": float(np.median(policy_ms)), "add_frame_ms": float(np.median(total_ms))}
