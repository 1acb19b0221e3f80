"""chase through the tools: ``vla-edge evaluate --task chase`` and ``vla-edge run --sim chase`` take it."""

from __future__ import annotations

import json

import pytest

from vla_edge_ros.cli import main
from vla_edge_ros.cli.commands import build_parser
from vla_edge_ros.tools.evaluate import EXPERT, probes_of, run_episode
from vla_edge_ros.worlds.sim.world import CueReachEnv, TaskSpec


@pytest.fixture(scope="module")
def chunked_model(tmp_path_factory):
    """The tiny preset, 1 layer, with an mlp head giving 16 actions a cycle (random weights)."""
    from vla_edge_ros.model.init_model import preset, write_random_model

    return write_random_model(tmp_path_factory.mktemp("chase") / "m", preset("tiny", layers=1, head="mlp", chunk=16),
                              seed=3)


def test_the_commands_take_chase():
    assert build_parser().parse_args(["run", "--sim", "chase"]).sim == "chase"
    assert build_parser().parse_args(["evaluate", "--task", "chase"]).task == "chase"


def test_the_expert_catches_the_moving_goal_through_the_loop():
    spec = TaskSpec(name="chase")
    for seed in range(3):
        episode = run_episode(CueReachEnv(spec, seed), seed, None)
        assert episode.success and episode.time_s < 2.0 and episode.path_length > 0
    assert probes_of(spec) == ("episode",)  # no cue swap: the ring never goes, and a lead heads past the goal


def test_evaluate_runs_chase_with_the_expert_and_a_random_chunked_model(chunked_model, tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(f"reasoning:\n  ros__parameters:\n    model_dir: {chunked_model}\n    backend: numpy\n"
                      "camera_subscriber:\n  ros__parameters:\n    frame_height: 96\n    frame_width: 96\n")
    code = main(["evaluate", "--task", "chase", "--config", str(config), "--policy", "fifo", "--budgets", "2",
                 "--episodes", "2", "--time-limit-s", "1.5", "--cost", "fixed:encode=100ms,decode=1ms",
                 "--execution", "sync,rtc", "--out", str(tmp_path / "out")])
    assert code == 0
    report = json.loads((tmp_path / "out" / "evaluate.json").read_text())
    assert report["task"]["name"] == "chase" and report["task"]["goal_speed"] == 0.5
    cells = {(c["variant"], c["execution"]): c for c in report["cells"]}
    assert set(cells) == {(EXPERT, None), ("fifo", "sync"), ("fifo", "rtc")}
    assert cells[(EXPERT, None)]["success_rate"] == 1.0
    assert all(c["cue_swap"] is None for c in cells.values())
    rtc = cells[("fifo", "rtc")]
    assert rtc["actions"] > 0 and rtc["refused"] == 0 and rtc["starved_share"] == 0.0
    assert "chase: 2 episodes per cell" in capsys.readouterr().out
