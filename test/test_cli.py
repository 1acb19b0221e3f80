"""``vla-edge`` subcommands end to end, as a user runs them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from vla_edge_ros.cli import main


def _config(tmp_path, model_dir, **params):
    path = tmp_path / "robot.yaml"
    base = {"model_dir": str(model_dir), "backend": "numpy", "kv_capacity_tokens": 128}
    path.write_text(yaml.safe_dump({"reasoning": {"ros__parameters": {**base, **params}}}))
    return path


def test_the_entry_point_stays_a_function_once_its_commands_are_loaded():
    """A submodule named like the package attribute would replace ``vla_edge_ros.cli.main`` on first use."""
    import vla_edge_ros.cli as cli
    import vla_edge_ros.cli.commands  # noqa: F401

    assert callable(cli.main) and cli.main is main


def test_init_model_then_run(tmp_path, capsys):
    model = tmp_path / "m"
    assert main(["init-model", "--out", str(model), "--preset", "tiny", "--layers", "1", "--seed", "3"]) == 0
    assert main(["engine", "--config", str(_config(tmp_path, model)), "--frames", "12"]) == 0
    out = capsys.readouterr().out
    assert "12 frames: cycle p50" in out and "action [" in out


def test_init_model_with_cameras_and_a_state_then_plan_and_run_it(tmp_path, capsys):
    """`init-model --cameras 2 --state-dim 3` writes a checkpoint whose observation is 16 + 16 + 1 tokens: the plan
    counts them, and `engine` runs it on synthetic frames once the configuration names the cameras and the state."""
    model = tmp_path / "m"
    assert main(["init-model", "--out", str(model), "--preset", "tiny", "--layers", "1", "--cameras", "2",
                 "--state-dim", "3"]) == 0
    assert "1 layers, 2 cameras + a 3-value state" in capsys.readouterr().out
    config = yaml.safe_load(_config(tmp_path, model, kv_capacity_tokens=256).read_text())
    config["camera_subscriber"] = {"ros__parameters": {"extra_image_topics": ["wrist/image_raw"],
                                                       "state_topic": "joint_states",
                                                       "state_joint_names": ["a", "b", "c"]}}
    path = tmp_path / "robot.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["plan", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "observation 2 cameras x 16 tokens + 1 state token (3 values) = 33 tokens, 33,792 B of KV" in out
    assert "33,792 B per observation of 33 tokens" in out
    assert main(["engine", "--config", str(path), "--frames", "3"]) == 0
    assert "33 tokens/observation" in capsys.readouterr().out
    config["camera_subscriber"]["ros__parameters"]["state_topic"] = ""
    path.write_text(yaml.safe_dump(config))
    assert main(["plan", "--config", str(path)]) == 2  # what `run` would refuse, refused here
    assert "reads a robot state of 3 values" in capsys.readouterr().err


def test_plan_prints_breakdown_and_fails_over_budget(tmp_path, tiny_model, capsys):
    assert main(["plan", "--config", str(_config(tmp_path, tiny_model))]) == 0
    assert "kv arena" in capsys.readouterr().out
    assert main(["plan", "--config", str(_config(tmp_path, tiny_model, budget_bytes=2 ** 20))]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_parity_json_and_saved_logits(tmp_path, tiny_model, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "logits.npy"
    assert main(["parity", "--model", str(tiny_model), "--backend", "numpy", "--token-ids", "1,2,3,500",
                 "--save-logits", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["logits"]["cosine"] >= 0.99999
    assert np.load(out).shape == (2048,)


@pytest.mark.parametrize("argv, message", [
    (["run", "--config", "/nonexistent.yaml"], "cannot read config"),
    (["engine", "--config", "/nonexistent.yaml"], "cannot read config"),
    (["parity", "--model", "/nonexistent", "--token-ids", "1"], "does not exist"),
])
def test_user_errors_exit_2_with_a_message(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_bad_token_ids_are_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        main(["parity", "--model", "x", "--token-ids", "1,a"])
    assert "comma-separated" in capsys.readouterr().err
