"""``vla-edge init-model --preset qwen2-vl-tiny``, then ``replay``, ``evaluate`` and ``run`` on it."""

from __future__ import annotations

import json

import pytest

from vla_edge_ros.cli import main

VL_COSTS = "fixed:encode=8ms,vision=12ms,decode=1ms"


@pytest.fixture(scope="module")
def vl_setup(tmp_path_factory):
    """A 1-layer qwen2-vl-tiny written by the command line, and a config that runs it on 112 x 112 frames."""
    root = tmp_path_factory.mktemp("vl_cli")
    assert main(["init-model", "--preset", "qwen2-vl-tiny", "--layers", "1", "--out", str(root / "model")]) == 0
    config = root / "vl.yaml"
    config.write_text(f"reasoning:\n  ros__parameters:\n    model_dir: {root / 'model'}\n    backend: numpy\n"
                      "    vision_max_pixels: 12544\n    kv_capacity_tokens: 128\n    deadline_ms: 200.0\n"
                      "camera_subscriber:\n  ros__parameters:\n    frame_height: 48\n    frame_width: 64\n")
    return root, config


@pytest.mark.slow  # ~30 s on a loaded 2-core machine; evaluate below closes the loop in the default tier
def test_replay_a_bag_through_a_vl_checkpoint(vl_setup, capsys):
    root, config = vl_setup
    bag = root / "moving.mcap"
    assert main(["make-bag", "--scenario", "moving", "--out", str(bag), "--seconds", "0.5", "--size", "64x48"]) == 0
    assert main(["replay", str(bag), "--config", str(config), "--policy", "fifo",
                 "--cost", "fixed:encode=8ms,decode=1ms", "--out", str(root / "bad")]) == 2  # the tower needs a cost
    assert "lacks vision" in capsys.readouterr().err and not (root / "bad" / "units").exists()  # refused up front
    assert main(["replay", str(bag), "--config", str(config), "--policy", "fifo,dms", "--cost", VL_COSTS,
                 "--out", str(root / "replay")]) == 0
    report = json.loads((root / "replay" / "report.json").read_text())
    assert report["config"]["cost_model"] == VL_COSTS
    assert sorted(report["policies"]) == ["dms", "fifo"]
    assert all(policy["actions"] > 0 for policy in report["policies"].values())


def test_evaluate_closes_the_loop_on_a_vl_checkpoint(vl_setup):
    root, config = vl_setup
    assert main(["evaluate", "--config", str(config), "--task", "reach", "--policy", "fifo", "--budgets", "4",
                 "--episodes", "1", "--cost", "fixed:encode=8ms,decode=1ms", "--out", str(root / "bad")]) == 2
    assert main(["evaluate", "--config", str(config), "--task", "reach", "--policy", "fifo", "--budgets", "4",
                 "--episodes", "1", "--time-limit-s", "1", "--cost", VL_COSTS, "--out", str(root / "eval")]) == 0
    report = json.loads((root / "eval" / "evaluate.json").read_text())
    assert report["cost_model"] == VL_COSTS


@pytest.mark.slow
@pytest.mark.ros
def test_run_in_the_simulator_on_a_vl_checkpoint(vl_setup):
    root, config = vl_setup
    summary = root / "summary.json"
    assert main(["run", "--config", str(config), "--sim", "reach", "--duration", "3",
                 "--summary-json", str(summary)]) == 0
    reasoning = json.loads(summary.read_text())["reasoning"]
    assert reasoning["actions"] > 0 and reasoning["engine_errors"] == 0 and reasoning["kv_tokens"] <= 128
