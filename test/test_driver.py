"""The offline driver: the live pipeline's pieces on a virtual clock, and the commands they would publish."""

from __future__ import annotations

import numpy as np
import pytest

from vla_edge_ros.config import OutputKnobs, parse_settings
from vla_edge_ros.runtime.action_output import ActionOutput, Outcome
from vla_edge_ros.runtime.action_slot import TimedAction
from vla_edge_ros.runtime.block_costs import parse_cost
from vla_edge_ros.runtime.clock import NS_PER_MS, VirtualClock
from vla_edge_ros.runtime.driver import Driver
from vla_edge_ros.runtime.loader import load_engine
from vla_edge_ros.worlds.synthetic import SyntheticCamera

COSTS = parse_cost("fixed:encode=8ms,decode=1ms")


@pytest.fixture
def driver(tiny_model):
    settings = parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 128,
                                          "warmup_cycles": 1}},
        "action_publisher": {"ros__parameters": {"command_type": "float32_multi_array", "action_max": [0.01],
                                                 "action_timeout_ms": 50.0}}}, "test.yaml")
    return Driver(load_engine(settings).engine, settings, VirtualClock(0), COSTS, (48, 64))


def test_an_action_is_the_robots_from_its_ready_time_until_it_is_stale(driver):
    camera = SyntheticCamera(height=48, width=64, seed=1)
    assert driver.reason() is None  # no frame yet: nothing to do, and the clock does not move
    assert driver.clock() == 0 and driver.command(0).outcome is Outcome.NONE
    driver.camera(camera.frame(), stamp_ns=7, arrival_ns=0)
    cycle = driver.reason()
    ready = cycle.result.ready_ns
    assert ready == (8 + 6 * 1) * NS_PER_MS == driver.clock()  # encode + prefill, then 6 decode steps of 7 dims
    assert driver.reason() is None  # the frame was taken: nothing is processed twice

    before = driver.command(ready - 1)
    assert before.outcome is Outcome.NONE and before.safe_stop  # not ready yet: still nothing to command
    fresh = driver.command(ready)
    knobs = driver.knobs
    expected = ActionOutput(knobs).decide(TimedAction(cycle.result.action, ready, 7), ready, knobs)
    assert fresh == expected and fresh.outcome is Outcome.FRESH
    assert max(fresh.values) <= 0.01  # clipped by action_max exactly as the publisher clips
    stale = driver.command(ready + 51 * NS_PER_MS)
    assert stale.outcome is Outcome.STALE and stale.values == (0.0,) * 7


def test_the_previous_action_is_commanded_while_the_next_is_still_being_computed(driver):
    camera = SyntheticCamera(height=48, width=64, seed=2)
    driver.camera(camera.frame(), 1, 0)
    first = driver.reason().result
    start = driver.clock()
    driver.camera(camera.frame(), 2, start)
    second = driver.reason().result
    assert second.ready_ns > start
    between = driver.command(second.ready_ns - 1)
    assert between.outcome is Outcome.FRESH and between.age_ms == (second.ready_ns - 1 - first.ready_ns) / NS_PER_MS
    assert driver.command(second.ready_ns).age_ms == 0.0


def test_a_new_episode_forgets_frames_and_actions_but_not_the_learned_costs(driver):
    camera = SyntheticCamera(height=48, width=64, seed=3)
    driver.camera(camera.frame(), 1, 0)
    driver.reason()
    driver.camera(camera.frame(), 2, driver.clock())
    driver.new_episode()
    assert driver.reason() is None and driver.command(driver.clock()).outcome is Outcome.NONE
    assert driver.gate.snapshot().kinds["cycle"].completed == 1


def test_the_command_is_checked_like_the_publishers(driver):
    knobs = OutputKnobs.of({"command_type": "twist", "twist_dims": [0, 1, 2, 3, 4, 9]})
    out = ActionOutput(knobs).decide(TimedAction(np.zeros(7), 0, 0), 0, knobs)
    assert out.outcome is Outcome.CONFIG_ERROR and out.values == (0.0,) * 6  # never a guess on the robot
