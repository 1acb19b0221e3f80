"""Painting the cue-reach world into camera frames (numpy only, float32 RGB in 0..255).

The world is the unit square seen from above; pixel ``(row, col)`` covers world
``x in [col/S, (col+1)/S)``, ``y in [row/S, (row+1)/S)``, so world x runs along columns and world y
down the rows. Sizes are given in world units and scale with the frame.

What makes the task need memory is decided here: every target is the same filled square in the same
colour, painted from one stencil at whole-pixel centres, so once the cue ring is gone the targets'
pixels are identical and nothing in the frame says which one was cued.
"""

from __future__ import annotations

import numpy as np

TARGET_HALF = 0.04      # half the side of a target square
RING_RADIUS = 0.08      # centre line of the cue ring around the goal (outside the square's corners)
RING_WIDTH = 0.025
ROBOT_RADIUS = 0.07     # white disc (a 16-px patch of a 64-px view must see it: at 0.035 a
                        # learned encoder needed >1,000 steps to find it at all, at 0.07 ~300) ...
ROBOT_RIM = 0.012       # ... with a dark rim: the same from every side
CLUTTER_BLOBS = 4

TARGET_COLOURS = np.array([(200, 50, 40), (40, 150, 60), (50, 90, 210), (180, 60, 170)], dtype=np.float32)
COLOUR_NAMES = ("red", "green", "blue", "purple")  # what an instruction calls each of TARGET_COLOURS
CUE_COLOUR = np.array((255, 235, 0), dtype=np.float32)
ROBOT_FILL = np.array((245, 245, 245), dtype=np.float32)
ROBOT_RIM_COLOUR = np.array((20, 20, 20), dtype=np.float32)


def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    """World (x, y) of every pixel centre, each [S, S]."""
    centres = (np.arange(size, dtype=np.float32) + 0.5) / size
    return np.meshgrid(centres, centres)


def floor(rng: np.random.Generator, size: int) -> np.ndarray:
    """A floor that is not flat colour (a few low-frequency waves plus fixed grain) with muted
    elliptic clutter blobs on it: structure a policy must learn to ignore, fixed for the episode."""
    xx, yy = _grid(size)
    image = np.broadcast_to(rng.uniform(90, 150, size=3).astype(np.float32), (size, size, 3)).copy()
    for _ in range(3):
        fx, fy = rng.uniform(0.5, 2.0, size=2)
        wave = np.sin(2 * np.pi * (fx * xx + fy * yy) + rng.uniform(0, 2 * np.pi))
        image += wave[..., None] * rng.uniform(5, 20, size=3).astype(np.float32)
    image += rng.normal(0.0, 4.0, size=(size, size, 1)).astype(np.float32)
    mean = image.mean(axis=(0, 1))
    for _ in range(CLUTTER_BLOBS):
        cx, cy = rng.uniform(0, 1, size=2)
        ax, ay = rng.uniform(0.04, 0.12, size=2)
        blob = ((xx - cx) / ax) ** 2 + ((yy - cy) / ay) ** 2 <= 1
        image[blob] = mean + rng.uniform(-45, 45, size=3).astype(np.float32)
    return image


def snap(points: np.ndarray, size: int) -> np.ndarray:
    """Points moved to the nearest pixel centre, so one stencil paints every target identically."""
    return (np.clip(np.floor(points * size), 0, size - 1) + 0.5) / size


def paint_targets(image: np.ndarray, targets: np.ndarray, colours: np.ndarray) -> None:
    """Filled squares at pixel-snapped ``targets`` [K, 2] (x, y), all the same stencil; ``colours`` is one
    colour [3] for all, or one per target [K, 3]."""
    size = image.shape[0]
    half = max(1, round(TARGET_HALF * size))
    colours = np.broadcast_to(np.asarray(colours, dtype=np.float32), (len(targets), 3))
    for (col, row), colour in zip(np.floor(targets * size).astype(int), colours):
        image[max(row - half, 0):row + half + 1, max(col - half, 0):col + half + 1] = colour


def paint_ring(image: np.ndarray, centre: np.ndarray) -> None:
    """The cue: a bright ring around ``centre`` (x, y), outside the target square."""
    xx, yy = _grid(image.shape[0])
    distance = np.hypot(xx - centre[0], yy - centre[1])
    image[np.abs(distance - RING_RADIUS) <= RING_WIDTH / 2] = CUE_COLOUR


def paint_robot(image: np.ndarray, centre: np.ndarray) -> None:
    """The robot at ``centre`` (x, y): white disc, dark rim, painted over everything else."""
    xx, yy = _grid(image.shape[0])
    distance = np.hypot(xx - centre[0], yy - centre[1])
    image[distance <= ROBOT_RADIUS + ROBOT_RIM] = ROBOT_RIM_COLOUR
    image[distance <= ROBOT_RADIUS] = ROBOT_FILL

