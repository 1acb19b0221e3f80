"""The debug image without ROS: what the drawing shows, the copies it draws from, the hand-off from the reasoning
thread, and that turning it on changes no decision of the gate (virtual clock)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vla_edge_ros.config import GateKnobs, OutputKnobs, parse_settings
from vla_edge_ros.runtime import debug_image
from vla_edge_ros.runtime.admission import BlockKind, Verdict
from vla_edge_ros.runtime.block_costs import parse_cost
from vla_edge_ros.runtime.clock import NS_PER_MS, VirtualClock
from vla_edge_ros.runtime.cycle_view import CycleView
from vla_edge_ros.runtime.debug_image import (ARROW, ARROW_REACH, BAR, MAIN_KEEP, TILES, FrameCopies,
                                              draw_debug_image, layout_for)
from vla_edge_ros.runtime.driver import Driver
from vla_edge_ros.runtime.loader import load_engine
from vla_edge_ros.runtime.reasoner import CycleResult
from vla_edge_ros.runtime.reasoning_health import outcome_of
from vla_edge_ros.worlds.synthetic import SyntheticCamera

BLACK = np.zeros((480, 640, 3), np.uint8)
TWIST = OutputKnobs.of({"command_type": "twist", "twist_dims": [0, 1, -1, -1, -1, 2]})
ARRAY = OutputKnobs.of({"command_type": "float32_multi_array"})


def _view(action=None, strip=(), kind="kept", verdict=Verdict.ADMITTED, frame_id=7, **result) -> CycleView:
    values = None if action is None else np.asarray(action, np.float32)[None]  # a chunk of one action
    ready = None if values is None else 14 * NS_PER_MS
    return CycleView(frame_id, 0, 0, CycleResult(verdict, values, ready, False, **result), "fifo", tuple(strip), kind)


def _draw(view: CycleView, output: OutputKnobs, frame=BLACK, thumbnails=None, width=640) -> np.ndarray:
    layout = layout_for(frame.shape, width, output.command_type)
    image = draw_debug_image(frame, view, thumbnails or [None] * len(view.strip), layout, output, 33.0)
    assert image.shape == (layout.height, width, 3) and image.dtype == np.uint8
    return image


def _where(image: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    """(row, column) of every pixel of exactly ``colour``."""
    return np.argwhere(np.all(image == np.array(colour, np.uint8), axis=-1))


# --- the drawing ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("vx", "vy", "degrees"), [(0.5, 0.0, 90), (-0.5, 0.0, 270), (0.0, 0.8, 180), (0.0, -0.8, 0),
                                                     (0.6, 0.6, 135)])
def test_the_arrow_points_where_the_twist_drives(vx, vy, degrees):
    """REP 103 on the image: linear.x (forward) is up, linear.y (left) is left; the length is the velocity over its
    clip limit (1.0), ARROW_REACH of the way to the nearer edge at full scale."""
    image = _draw(_view([vx, vy, 0.1]), TWIST)
    layout = layout_for(BLACK.shape, 640, "twist")
    centre = np.array([layout.main_top + layout.main_height // 2, 320])
    arrow = _where(image, ARROW) - centre
    tip = arrow[np.argmax(np.hypot(*arrow.T))]
    angle = math.degrees(math.atan2(-tip[0], tip[1])) % 360  # counter-clockwise from the image's right
    assert min(abs(angle - degrees), 360 - abs(angle - degrees)) < 3
    expected = ARROW_REACH * layout.main_height // 2 * math.hypot(vx, vy)
    assert abs(np.hypot(*tip) - expected) < 4  # the line's end, give or take its thickness


def test_a_standing_robot_is_a_dot_and_no_action_draws_no_arrow():
    still = _where(_draw(_view([0.0, 0.0, 0.0]), TWIST), ARROW)
    assert 0 < len(still) and np.ptp(still[:, 0]) < 20 and np.ptp(still[:, 1]) < 20
    assert len(_where(_draw(_view(None, verdict=Verdict.REFUSED, refused_block=BlockKind.DECODE), TWIST), ARROW)) == 0


def test_a_bar_per_dimension_as_high_as_its_value():
    """Limits [-1, 1]: zero is mid-panel, +1.0 reaches the top of the bars' range, -0.5 half-way down, 0 has none."""
    action = [1.0, -0.5, 0.0, 0.25, 2.0]  # the last is clipped to 1.0, as the publisher would command it
    image = _draw(_view(action), ARRAY)
    layout = layout_for(BLACK.shape, 640, "float32_multi_array")
    bars = _where(image[layout.bars_top:layout.bars_top + layout.bars], BAR)
    slot = 640 / len(action)
    spans = {}
    for dim in range(len(action)):
        rows = bars[(bars[:, 1] >= dim * slot) & (bars[:, 1] < (dim + 1) * slot), 0]
        spans[dim] = (rows.min(), rows.max()) if rows.size else None
    assert spans[2] is None
    zero = spans[0][1]  # a positive bar ends on the zero line ...
    assert spans[1][0] == zero and spans[3][1] == zero  # ... where a negative one starts
    height = {dim: span[1] - span[0] for dim, span in spans.items() if span}
    assert height[0] == pytest.approx(2 * height[1], abs=1.5) == pytest.approx(4 * height[3], abs=2)
    assert spans[4] == spans[0]


@pytest.mark.parametrize("kept", [0, 1, 5, TILES, TILES + 9])
def test_the_strip_shows_a_thumbnail_per_kept_frame(kept):
    """Each kept frame's thumbnail once, oldest first; beyond TILES the newest TILES - 1 and a tile counting the rest."""
    colours = [(20 + 5 * i, 200 - 4 * i, 30 + 3 * i) for i in range(kept)]
    thumbnails = [np.full((30, 40, 3), colour, np.uint8) for colour in colours]
    ids = tuple(range(100, 100 + kept))
    image = _draw(_view([0.1, 0.1, 0.0], strip=ids, frame_id=ids[-1] if ids else 7), TWIST, thumbnails=thumbnails)
    layout = layout_for(BLACK.shape, 640, "twist")
    strip = image[layout.strip_top:]
    found = [colour for colour in colours if len(_where(strip, colour))]
    shown = colours if kept <= TILES else colours[kept - (TILES - 1):]
    assert found == shown
    firsts = [_where(strip, colour)[0] for colour in found]  # row-major, oldest first
    assert [tuple(p) for p in firsts] == sorted(tuple(p) for p in firsts)


def test_the_strip_names_what_it_shows_and_marks_missing_copies():
    layout = layout_for(BLACK.shape, 640, "twist")
    written = _draw(_view(None, strip=(3, 9), kind="written", verdict=Verdict.STALE), TWIST,
                    thumbnails=[np.full((8, 8, 3), 90, np.uint8), None])
    assert len(_where(written[layout.strip_top:], debug_image.MISSING)) > 0
    kept = _draw(_view(None, strip=(3, 9), verdict=Verdict.STALE), TWIST, thumbnails=[np.full((8, 8, 3), 90, np.uint8),
                                                                                        None])
    band = slice(layout.strip_top - layout.band, layout.strip_top)
    assert not np.array_equal(written[band], kept[band])  # "written into the fast weights" is not "kept"


def test_the_same_cycle_draws_the_same_pixels():
    camera = SyntheticCamera(48, 64, seed=1)
    frame, thumbnails = camera.frame(), [camera.frame() for _ in range(3)]
    view = _view([0.3, -0.2, 0.5], strip=(1, 2, 7))
    first = _draw(view, ARRAY, frame=frame, thumbnails=thumbnails, width=320)
    assert np.array_equal(first, _draw(view, ARRAY, frame=frame, thumbnails=thumbnails, width=320))
    assert not np.array_equal(first, _draw(_view([0.3, 0.2, 0.5], strip=(1, 2, 7)), ARRAY, frame=frame,
                                           thumbnails=thumbnails, width=320))


@pytest.mark.parametrize("shape", [(1, 200, 3), (400, 10, 3), (8, 8, 3), (1080, 1920, 3)])
@pytest.mark.parametrize("action", [[np.nan, 0.0, 0.0], [np.inf, -np.inf, 1e30], [0.5], [], None])
def test_odd_frames_and_actions_draw_a_picture_never_an_exception(shape, action):
    """A non-finite action, one too short for the twist mapping, an empty one or none; frames of any aspect: the
    picture has the layout's size and no motion is drawn that would not be commanded."""
    frame = np.full(shape, 128, np.uint8)
    for output in (TWIST, ARRAY):
        image = _draw(_view(action, strip=(5,)), output, frame=frame, thumbnails=[frame], width=160)
        if output is TWIST and action is not None:
            assert len(_where(image, ARROW)) == 0  # none of these is a command the publisher would send as motion


# --- the copies it draws from ----------------------------------------------------------------------------


def test_frame_copies_stay_bounded_and_keep_what_the_strip_names():
    layout = layout_for((240, 320, 3), 160, "twist")
    copies = FrameCopies()
    frame = np.zeros((240, 320, 3), np.uint8)
    latest = None
    for frame_id in range(2000):
        frame[:] = frame_id % 256
        copies.add(frame_id, frame, layout, latest)
        latest = CycleView(frame_id, 0, 0, CycleResult(Verdict.ADMITTED, None, None, False), "cosine",
                           (3, frame_id), "kept")  # frame 3 is kept all along
    assert copies.main(1999).shape == (layout.main_height, layout.width, 3) and copies.main(1998) is not None
    assert copies.main(1990) is None and sum(m is not None for m in map(copies.main, range(2000))) <= MAIN_KEEP + 1
    thumbnails = copies.thumbnails(range(2000))
    assert thumbnails[3] is not None and thumbnails[3].shape == (*layout.tile, 3) and thumbnails[3].max() == 3
    assert sum(t is not None for t in thumbnails) <= MAIN_KEEP + 2
    frame[:] = 255
    assert copies.main(1999).max() == 1999 % 256  # a copy: the caller's array may change under it
    small = np.zeros((48, 64, 3), np.uint8)
    copies.add(2000, small, layout, latest)
    assert copies.main(2000).shape == small.shape  # never enlarged at the camera's rate: the drawing does that


# --- the hand-off, and what it does to the gate: nothing ----------------------------------------------------


def _settings(tiny_model, policy: str):
    return parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 128,
                                          "kv.policy": policy, "deadline_ms": 60.0}},
        "action_publisher": {"ros__parameters": {"command_type": "float32_multi_array"}}}, "test.yaml")


def _stream(driver: Driver, settings, frames: int, copies: FrameCopies | None) -> tuple[list[tuple], int]:
    """A 30 Hz camera on the driver's virtual clock, the reasoner taking the newest frame whenever it is free; at
    frame 60 the deadline drops to 33 ms (a live `ros2 param set`). With ``copies``, the ROS layer's part too:
    each frame copied as it arrives, each cycle drawn. Returns what every cycle decided, and the pictures drawn."""
    camera, clock, drawn = SyntheticCamera(48, 64, seed=4), driver.clock, 0
    layout = layout_for((48, 64, 3), 320, "float32_multi_array")
    decided = []
    for index in range(frames):
        if index == 60:
            driver.gate.configure(GateKnobs.of({**settings["reasoning"], "deadline_ms": 33.0}))
        arrival = round(index * 1e9 / 30)
        image = camera.frame()
        [settled] = driver.camera(image, stamp_ns=index, arrival_ns=arrival)
        if copies is not None:
            copies.add(settled.written.seq, image, layout, driver.feed.latest())
        clock.wait_until(arrival)
        while clock() < round((index + 1) * 1e9 / 30):
            cycle = driver.reason()
            if cycle is None:
                break
            result = cycle.result
            decided.append((cycle.frame.seq, outcome_of(result), result.verdict, result.refused_block, result.ready_ns,
                            None if result.action is None else result.action.tobytes()))
            if copies is not None:
                view = driver.feed.latest()
                assert view.frame_id == cycle.frame.seq and view.result is result
                draw_debug_image(copies.main(view.frame_id), view, copies.thumbnails(view.strip), layout,
                                 driver.knobs, 33.0)
                drawn += 1
    return decided, drawn


@pytest.mark.parametrize("policy", ["fifo", "cosine", "aura", "dms"])
def test_the_debug_image_on_or_off_the_gate_decides_the_same(tiny_model, policy):
    """Virtual clock, fixed costs (a 46 ms cycle): the same frames, verdicts, refusals, misses, ready times and
    actions with the debug image on (the reasoning thread's hand-off, copies, a picture per cycle) and off."""
    runs = {}
    for on in (False, True):
        settings = _settings(tiny_model, policy)
        driver = Driver(load_engine(settings).engine, settings, VirtualClock(0), parse_cost("fixed:encode=40ms,decode=1ms"),
                        (48, 64))
        driver.feed.enabled = on
        decided, drawn = _stream(driver, settings, 150, FrameCopies() if on else None)
        stats = driver.gate.snapshot()
        runs[on] = decided, (stats.refused, stats.missed, stats.stale, stats.kinds, stats.latency)
        assert drawn == (len(decided) if on else 0) and (driver.feed.latest() is not None) == on
    assert runs[True] == runs[False]
    outcomes = {outcome for _, outcome, *_ in runs[True][0]}
    assert {"acted", "refused", "missed"} <= outcomes  # the comparison covers every way a cycle can end here
    refused, missed = runs[True][1][:2]
    assert refused > 0 and missed > 0


def _cycle(driver: Driver, camera: SyntheticCamera, t_ms: int) -> CycleView:
    driver.camera(camera.frame(), stamp_ns=t_ms, arrival_ns=t_ms * NS_PER_MS)
    driver.clock.wait_until(t_ms * NS_PER_MS)
    driver.reason()
    return driver.feed.latest()


def test_the_strip_is_what_the_memory_keeps_from_when_it_was_switched_on(tiny_model):
    """fifo: the strip is the kept frames the feed saw stored (frames stored while it was off have no copy, so no
    id); a new episode (the policy reset) starts it afresh."""
    settings = _settings(tiny_model, "fifo")
    engine = load_engine(settings).engine
    driver = Driver(engine, settings, VirtualClock(0), parse_cost("fixed:encode=8ms,decode=1ms"), (48, 64))
    camera = SyntheticCamera(48, 64, seed=5)
    for t_ms in range(0, 100, 20):  # off: five frames stored, none followed
        _cycle(driver, camera, t_ms)
    driver.feed.enabled = True
    views = [_cycle(driver, camera, t_ms) for t_ms in range(100, 400, 20)]
    kept = engine.memory_stats().frames_kept
    assert kept < 5 + len(views)  # the window is full: older frames were evicted
    assert views[-1].strip == tuple(v.frame_id for v in views[-kept:])  # only frames seen stored, oldest first
    assert views[0].strip == (views[0].frame_id,)
    engine.set_prompt(engine.prompt_ids)  # ~/reset_episode
    after = _cycle(driver, camera, 400)
    assert after.strip == (after.frame_id,)
    driver.feed.enabled = False
    assert _cycle(driver, camera, 420) is None  # off: nothing is handed over
    driver.feed.enabled = True
    again = _cycle(driver, camera, 440)
    assert again.strip == (again.frame_id,)  # on again: followed afresh, the frames it missed have no copies


def test_aura_shows_the_frames_written_into_its_fast_weights(tiny_model):
    settings = _settings(tiny_model, "aura")
    engine = load_engine(settings).engine
    driver = Driver(engine, settings, VirtualClock(0), parse_cost("fixed:encode=8ms,decode=1ms"), (48, 64))
    driver.feed.enabled = True
    camera, written = SyntheticCamera(48, 64, seed=6), []
    for t_ms in range(0, 1200, 20):
        before = engine.policy.writes
        view = _cycle(driver, camera, t_ms)
        if engine.policy.writes > before:
            written.append(view.frame_id)
    assert view.strip_kind == "written" and 0 < len(written) < 60  # the gate wrote some frames, not all
    assert view.strip == tuple(written[-32:])
