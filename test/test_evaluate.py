"""Closed-loop evaluation: the runtime drives the simulated robot; deterministic with fixed costs."""

from __future__ import annotations

import pytest

from vla_edge_ros.bags import Bag
from vla_edge_ros.cli import main
from vla_edge_ros.config import parse_settings
from vla_edge_ros.evaluate import EXPERT, evaluate, run_episode, wilson_interval, write_report
from vla_edge_ros.replay import parse_cost
from vla_edge_ros.sim.world import CueReachEnv, TaskSpec

SPEC = TaskSpec(name="cue-reach", time_limit_s=2.5)
FIXED = parse_cost("fixed:encode=8ms,decode=1ms")


def _settings(tiny_model, **reasoning):
    return parse_settings({
        "camera_subscriber": {"ros__parameters": {"frame_height": 96, "frame_width": 96}},
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy", **reasoning}}},
        "test.yaml")


def test_wilson_interval_is_sound_at_the_edges():
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(10, 10)[1] == 1.0 and wilson_interval(10, 10)[0] == pytest.approx(0.7225, abs=1e-4)
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_the_expert_reaches_the_goal_through_the_loop(tiny_model):
    settings = _settings(tiny_model)
    for seed in range(3):
        episode = run_episode(CueReachEnv(TaskSpec(), seed), seed, settings, None, None)
        assert episode.success and episode.time_s < TaskSpec().time_limit_s and episode.path_length > 0


def test_fixed_cost_evaluation_is_deterministic_and_records_bags(tiny_model, tmp_path):
    settings = _settings(tiny_model)
    runs = [evaluate(settings, SPEC, ["fifo", "aura"], [2], episodes=2, seed=5, costs=FIXED,
                     record_dir=tmp_path / "bags") for _ in range(2)]
    for run in runs:
        run.pop("runtime_s")
    assert runs[0] == runs[1]
    cells = {(c["policy"], c["budget_frames"]): c for c in runs[0]["cells"]}
    assert cells[(EXPERT, None)]["episodes"] == 2
    fifo, aura = cells[("fifo", 2)], cells[("aura", 2)]
    assert fifo["actions"] > 0 and aura["actions"] > 0
    assert aura["memory_peak_bytes"] < fifo["memory_peak_bytes"]
    bags = sorted((tmp_path / "bags").iterdir())
    assert [b.name for b in bags] == ["cue-reach_0005.mcap", "cue-reach_0006.mcap"]
    with Bag(bags[0]) as bag:
        assert bag.topics["/camera/image_raw"].count == bag.topics["/vla/command"].count > 0
    path = write_report(runs[0], tmp_path / "out")
    assert path.is_file() and (tmp_path / "out" / "success.png").read_bytes()[:4] == b"\x89PNG"


def test_without_fresh_actions_the_robot_gets_safe_stops_and_never_moves(tiny_model):
    """A 1 ms deadline: after warm-up every cycle is refused, so every tick commands zero velocity."""
    settings = _settings(tiny_model, deadline_ms=1.0, warmup_cycles=1)
    report = evaluate(settings, TaskSpec(name="reach", time_limit_s=1.0), ["fifo"], [2], episodes=1, seed=0,
                      costs=FIXED)
    fifo = next(c for c in report["cells"] if c["policy"] == "fifo")
    assert fifo["success_rate"] == 0.0 and fifo["actions"] == 0 and fifo["safe_stops"] == 30
    assert fifo["path_length"] is None  # no successful episode to average over


def test_cli_refuses_bad_budgets(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--budgets", "0,all"])
    assert "positive frame counts" in capsys.readouterr().err
