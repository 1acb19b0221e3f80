"""The debug image: the frame a cycle acted on, what it commanded, and what the memory holds, in one picture.

``draw_debug_image`` is the one drawing function: the reasoning node publishes its pictures on
``vla/debug_image`` (``nodes/debug_image.py``) and ``vla-edge replay --debug-frames`` writes them to files.
Pure NumPy and OpenCV, RGB, deterministic. From the top (``Layout``; its size depends only on the frame's
aspect, the width and the command type, so a video of them keeps one size):

- a status band: the frame's id, the memory policy, what became of the cycle (acted, refused, stale,
  missed, invalid; the colour says which), the gate's verdict and any refused block, and the latency from
  the frame's arrival to its action against the deadline;
- the frame; for a twist command, an arrow of the commanded planar velocity from its centre (REP 103:
  linear.x forward is up, linear.y left is left; each component scaled by its clip limit, so a full-scale
  command reaches ARROW_REACH of the way to the edge) and the mapped components as text;
- for any other command type, a bar per action dimension, from zero to its value within its clip limits;
- a band naming the strip, and the strip: thumbnails of the frames the memory keeps, oldest first (aura: of
  the latest frames written into its fast weights), the cycle's own frame outlined. When there are more
  than TILES, a tile counting the oldest, then the newest TILES - 1.

The action is drawn as the action publisher would command it (``ActionOutput.decide``: clipped, mapped; a
non-finite action or a mapping that does not fit it is drawn as the reason, not as motion).

``FrameCopies`` keeps the pixels the drawing needs, by frame id. The ROS layer makes them in the camera
callback as frames arrive, replay as it decodes them; the reasoning thread never touches a pixel of it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from ..config import OutputKnobs
from .action_output import TWIST_FIELDS, ActionOutput, Command, Outcome
from .action_slot import TimedAction, frozen_chunk
from .clock import NS_PER_MS
from .cycle_view import CycleView
from .reasoning_health import outcome_of

TILES_PER_ROW = 8
STRIP_ROWS = 4
TILES = TILES_PER_ROW * STRIP_ROWS  # thumbnails the strip shows at most
MAIN_KEEP = 8  # frame-size copies kept of the frames newer than the newest view's: cycles up to ~250 ms at 30 Hz
THUMBS_KEEP = 8 * TILES  # thumbnails kept at most (what the strip may name, and the frames newer than the view)
ARROW_REACH = 0.9  # a full-scale velocity's arrow: this share of the way from the centre to the nearer edge

BACKGROUND = (24, 24, 24)
TEXT = (235, 235, 235)
ARROW = (255, 0, 255)
BAR = (64, 160, 255)
ZERO_LINE = (128, 128, 128)
MISSING = (72, 72, 72)  # a tile whose frame has no copy left
CURRENT = (255, 255, 255)  # the outline of the cycle's own frame in the strip
WARN = (255, 190, 40)
FAIL = (255, 60, 60)
OUTCOME_COLOURS = {"acted": (80, 220, 100), "refused": WARN, "stale": WARN, "missed": FAIL, "invalid": FAIL}
TWIST_NAMES = dict(zip(TWIST_FIELDS, ("vx", "vy", "vz", "wx", "wy", "wz")))
_FONT = cv2.FONT_HERSHEY_SIMPLEX


@dataclass(frozen=True)
class Layout:
    """Where each part of the debug image goes (rows from the top; every part spans the width)."""

    width: int
    band: int  # height of a text band (the status, the strip's name)
    main_height: int  # height of the frame
    bars: int  # height of the bars (0: a twist command, drawn as an arrow on the frame)
    tile: tuple[int, int]  # (height, width) of one thumbnail

    @property
    def main_top(self) -> int:
        return self.band

    @property
    def bars_top(self) -> int:
        return self.main_top + self.main_height

    @property
    def strip_top(self) -> int:
        """The first row of thumbnails (the strip's name is the band above it)."""
        return self.bars_top + self.bars + self.band

    @property
    def height(self) -> int:
        return self.strip_top + STRIP_ROWS * self.tile[0]


def layout_for(frame_shape: Sequence[int], width: int, command_type: str) -> Layout:
    """The layout for frames of ``frame_shape`` (height, width, ...) drawn ``width`` pixels wide; the frame keeps
    its aspect within 1:8 and 2:1 (height to width)."""
    frame_height, frame_width = frame_shape[0], frame_shape[1]
    main = min(2 * width, max(width // 8, round(width * frame_height / frame_width)))
    tile_width = width // TILES_PER_ROW
    return Layout(width, max(14, width // 28), main, 0 if command_type == "twist" else width // 4,
                  (max(4, round(tile_width * main / width)), tile_width))


def draw_debug_image(frame: np.ndarray, view: CycleView, thumbnails: Sequence[np.ndarray | None], layout: Layout,
                     output: OutputKnobs, deadline_ms: float) -> np.ndarray:
    """The debug image of ``view``: RGB uint8, ``layout.height`` x ``layout.width``. ``frame`` is the frame the
    cycle acted on and ``thumbnails`` those of ``view.strip`` (None: no copy left), HxWx3 uint8 of any size."""
    image = np.empty((layout.height, layout.width, 3), np.uint8)
    cv2.rectangle(image, (0, 0), (layout.width - 1, layout.height - 1), BACKGROUND, -1)  # 40x NumPy's 3-tuple fill
    main = image[layout.main_top:layout.bars_top]
    main[:] = _fit(frame, main.shape[:2])
    command = _command(view, output)
    _status(image[:layout.band], view, command, deadline_ms)
    if output.command_type == "twist":
        _arrow(main, command, output)
    else:
        _bars(image[layout.bars_top:layout.bars_top + layout.bars], command, output)
    _strip(image[layout.bars_top + layout.bars:], view, thumbnails, layout)
    return image


class FrameCopies:
    """Small copies of camera frames by id, made as they arrive: what ``draw_debug_image`` draws from.

    Bounded whatever the episode's length: the frame-size copies of the newest view's frame and of the
    MAIN_KEEP newest frames after it (the next cycle takes one of those), and the thumbnails of the frames
    the newest view's strip names and of those newer than its frame (a later cycle may keep them), at most
    THUMBS_KEEP. A frame older than the newest view's that its strip does not name is never shown again: a
    cycle only ever stores its own frame. Callers may be the threads of two nodes, hence the lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mains: dict[int, np.ndarray] = {}
        self._thumbs: dict[int, np.ndarray] = {}

    def add(self, frame_id: int, image: np.ndarray, layout: Layout, latest: CycleView | None) -> None:
        """Keep copies of frame ``frame_id`` (HxWx3 uint8) for ``layout``; ``latest``: the newest view. A frame
        larger than the layout's is shrunk to it; a smaller one is kept as it is (the drawing enlarges it, a few
        times a second, rather than this at the camera's rate)."""
        height, width = layout.main_height, layout.width
        small = image.shape[0] <= height and image.shape[1] <= width
        main = image.copy() if small else _fit(image, (height, width))  # the caller may reuse its array
        thumb = _fit(main, layout.tile)
        with self._lock:
            self._mains[frame_id] = main
            self._thumbs[frame_id] = thumb
            current = -1 if latest is None else latest.frame_id
            newer = sorted(i for i in self._mains if i > current)[-MAIN_KEEP:]
            self._mains = {i: self._mains[i] for i in newer + [current] if i in self._mains}
            named = set() if latest is None else self._thumbs.keys() & set(latest.strip)
            pending = sorted(i for i in self._thumbs if i > current)[-MAIN_KEEP:]
            self._thumbs = {i: self._thumbs[i] for i in sorted(named.union(pending))[-THUMBS_KEEP:]}

    def main(self, frame_id: int) -> np.ndarray | None:
        """The frame-size copy of ``frame_id``; None once it is no longer kept."""
        with self._lock:
            return self._mains.get(frame_id)

    def thumbnails(self, ids: Sequence[int]) -> list[np.ndarray | None]:
        with self._lock:
            return [self._thumbs.get(i) for i in ids]

    def clear(self) -> None:
        with self._lock:
            self._mains, self._thumbs = {}, {}


def _fit(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``image`` resized to ``size`` (height, width); itself when it has that size already."""
    height, width = size
    if image.shape[:2] == (height, width):
        return image
    shrink = image.shape[0] > height or image.shape[1] > width
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


def _command(view: CycleView, output: OutputKnobs) -> Command | None:
    """What the action publisher would command from the view's action (None: the cycle made no action)."""
    chunk = view.result.chunk
    if chunk is None:
        return None
    timed = TimedAction(frozen_chunk(chunk), view.result.ready_ns, 0, view.result.ready_ns)
    return ActionOutput(output).decide(timed, timed.ready_ns, output)  # its first action, as it is ready


def _text(panel: np.ndarray, text: str, origin: tuple[int, int], height: int, colour: tuple[int, int, int]) -> None:
    """``text`` with its baseline at ``origin`` (x, y), about ``height`` pixels tall."""
    cv2.putText(panel, text, origin, _FONT, height / 22.0, colour, 1, cv2.LINE_AA)


def _status(band: np.ndarray, view: CycleView, command: Command | None, deadline_ms: float) -> None:
    result = view.result
    outcome = outcome_of(result)
    detail = result.verdict.value + (f", refused {result.refused_block.value}" if result.refused_block else "")
    latency = "-" if result.ready_ns is None else f"{(result.ready_ns - view.receive_ns) / NS_PER_MS:.1f}"
    said = outcome if detail == outcome else f"{outcome} ({detail})"
    words = f"#{view.frame_id} {view.policy}: {said} {latency} / {deadline_ms:g} ms"
    if command is not None and command.error:
        outcome, words = "invalid", f"{words}: {command.error}"
    height = band.shape[0]
    _text(band, words, (4, height - height // 4), round(height * 0.6), OUTCOME_COLOURS[outcome])


def _limits(output: OutputKnobs, dim: int) -> tuple[float, float]:
    """The clip limits of action dimension ``dim`` (one value applies to every dimension)."""
    low, high = output.action_min, output.action_max
    return low[dim if len(low) > 1 else 0], high[dim if len(high) > 1 else 0]


def _arrow(main: np.ndarray, command: Command | None, output: OutputKnobs) -> None:
    """The planar velocity of a twist command as an arrow from the frame's centre, the components as text."""
    if command is None or command.outcome is not Outcome.FRESH:
        return
    scaled = []  # each mapped component over its clip limit, in [-1, 1]
    for value, dim in zip(command.values, output.twist_dims):
        reach = max(abs(limit) for limit in _limits(output, dim)) if dim >= 0 else 0.0
        scaled.append(value / reach if reach > 0 else 0.0)
    height, width = main.shape[:2]
    centre = (width // 2, height // 2)
    radius = ARROW_REACH * min(centre)
    tip = (round(centre[0] - scaled[1] * radius), round(centre[1] - scaled[0] * radius))
    thickness = max(2, width // 160)
    if tip == centre:
        cv2.circle(main, centre, thickness * 2, ARROW, -1, cv2.LINE_8)
    else:
        cv2.arrowedLine(main, centre, tip, ARROW, thickness, cv2.LINE_8, tipLength=0.25)
    words = "  ".join(f"{TWIST_NAMES[field]} {value:+.2f}" for field, value, dim in
                      zip(TWIST_FIELDS, command.values, output.twist_dims) if dim >= 0)
    size = max(10, width // 40)
    cv2.rectangle(main, (0, height - size - 8), (width - 1, height - 1), BACKGROUND, -1)
    _text(main, words, (4, height - 5), size, TEXT)


def _bars(panel: np.ndarray, command: Command | None, output: OutputKnobs) -> None:
    """A bar per action dimension from zero (or the nearer limit) to its value, within its clip limits."""
    height, width = panel.shape[:2]
    if command is None or command.outcome is not Outcome.FRESH:
        _text(panel, "no action", (4, height // 2), max(10, height // 10), TEXT)
        return
    values = command.values
    slot = width / max(1, len(values))
    size = max(8, min(height // 8, round(slot / 4)))
    top, bottom = size + 6, height - 4  # value text above the bars' range
    for dim, value in enumerate(values):
        low, high = _limits(output, dim)
        span = high - low

        def row(v: float) -> int:
            return round(bottom - (v - low) / span * (bottom - top)) if span > 0 else bottom

        left, right = round(dim * slot + slot * 0.15), round((dim + 1) * slot - slot * 0.15) - 1
        zero = row(min(max(0.0, low), high))
        cv2.line(panel, (round(dim * slot), zero), (round((dim + 1) * slot) - 1, zero), ZERO_LINE, 1, cv2.LINE_8)
        end = row(value)
        if end != zero:
            cv2.rectangle(panel, (left, min(zero, end)), (right, max(zero, end)), BAR, -1, cv2.LINE_8)
        _text(panel, f"{value:+.2f}", (left, size + 2), size, TEXT)


def _strip(panel: np.ndarray, view: CycleView, thumbnails: Sequence[np.ndarray | None], layout: Layout) -> None:
    """The strip's name in its band, then a grid of thumbnails (``panel`` starts at the band)."""
    ids = view.strip
    frames = f"{len(ids)} frame{'s' if len(ids) != 1 else ''}"
    if view.strip_kind == "written":
        name = f"memory ({view.policy}): the latest {frames} written into the fast weights"
    else:
        name = f"memory ({view.policy}): {frames} kept"
    band = layout.band
    _text(panel, name, (4, band - band // 4), round(band * 0.6), TEXT)
    shown: list[tuple[int, np.ndarray | None] | None] = list(zip(ids, thumbnails))
    older = len(shown) - (TILES - 1) if len(shown) > TILES else 0
    if older:  # the first tile counts the oldest ones that do not fit
        shown = [None, *shown[older:]]
    tile_height, tile_width = layout.tile
    for index, entry in enumerate(shown):
        top, left = band + (index // TILES_PER_ROW) * tile_height, (index % TILES_PER_ROW) * tile_width
        bottom, right = top + tile_height - 1, left + tile_width - 1  # cv2 draws on whole rows only, not on tile views
        if entry is None:
            _text(panel, f"+{older}", (left + 4, top + tile_height * 2 // 3), max(8, tile_height // 3), TEXT)
            continue
        frame_id, thumbnail = entry
        if thumbnail is None:
            panel[top:bottom + 1, left:right + 1] = MISSING
            _text(panel, "?", (left + tile_width // 3, top + tile_height * 2 // 3), max(8, tile_height // 2), TEXT)
        else:
            panel[top:bottom + 1, left:right + 1] = _fit(thumbnail, layout.tile)
        if frame_id == view.frame_id:
            cv2.rectangle(panel, (left, top), (right, bottom), CURRENT, 2, cv2.LINE_8)
