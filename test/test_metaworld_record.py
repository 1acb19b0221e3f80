"""evaluate --record on Meta-World: the scripted expert's episodes as bags (camera, the arm's JointState, the 4-D
commands) that `vla-edge replay` reads with config/metaworld.yaml, state paired by joint name as live.

Needs the ``metaworld`` extra and libOSMesa; without them the tests skip with the line a user would get. One
episode of a dozen steps at 96 x 96: seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from vla_edge_ros.bags import Bag
from vla_edge_ros.cli import main
from vla_edge_ros.config import load_settings
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.model.tokenizer_files import write_tokenizer
from vla_edge_ros.runtime.robot_state import JointStateReader
from vla_edge_ros.tools.arm_world import ArmTask, ArmWorld, arm_observation
from vla_edge_ros.tools.evaluate import drive_episode
from vla_edge_ros.worlds.metaworld import DESCRIPTIONS, STATE, MetaWorldEnv, WorldUnavailable, backend

ROOT = Path(__file__).resolve().parent.parent
FIXED = "fixed:encode=8ms,decode=1ms"
STEPS = 12


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(config, the bag of reach-v3's seed 0): evaluate --record, through the command line."""
    try:
        backend.load()
    except WorldUnavailable as exc:
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("record")
    model = root / "arm"
    write_random_model(model, preset("sim", 2, state_dim=4, head="mlp", chunk=8, dof=4), seed=0)
    write_tokenizer(model, [*DESCRIPTIONS.values(), "user", "assistant"], preset("sim").vocab_size)
    config = yaml.safe_load((ROOT / "config" / "metaworld.yaml").read_text())  # the shipped config, as a user runs it
    config["reasoning"]["ros__parameters"].update(model_dir=str(model), backend="numpy")
    path = root / "metaworld.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["evaluate", "--config", str(path), "--task", "metaworld/reach-v3", "--episodes", "1",
                 "--max-steps", str(STEPS), "--cost", FIXED, "--out", str(root / "eval"),
                 "--record", str(root / "bags")]) == 0
    return path, root / "bags" / "reach-v3_0000.mcap"


def test_the_arm_s_config_loads_from_any_directory_and_says_what_run_and_evaluate_set(tmp_path, monkeypatch):
    """config/metaworld.yaml is installed with the other configs (setup.py's config/*.yaml) and read from anywhere;
    what the arm dictates (``arm_observation``) it already holds, so a bringup or a replay reads the arm the same
    way; only the instruction is each task's."""
    monkeypatch.chdir(tmp_path)
    settings = load_settings(ROOT / "config" / "metaworld.yaml")
    assert settings["reasoning"]["model_dir"].endswith("models/metaworld")
    assert Path(settings["reasoning"]["model_dir"]).is_absolute()
    config = preset("sim", 2, state_dim=4, head="mlp", chunk=8, dof=4)
    arm = arm_observation(settings, config, ArmTask("push-v3"), "evaluate")
    for node in ("camera_subscriber", "action_publisher"):
        assert arm[node] == settings[node], node
    assert arm["reasoning"]["instruction"] == DESCRIPTIONS["push-v3"]
    assert 'glob("config/*.yaml")' in (ROOT / "setup.py").read_text()


def test_a_recorded_episode_holds_the_frames_the_arm_s_joint_state_and_the_expert_s_actions(recorded):
    _, bag_path = recorded
    truth: dict[str, list] = {"frames": [], "states": [], "actions": []}
    with MetaWorldEnv(ArmTask("reach-v3", max_steps=STEPS).arm, 0) as env:
        def seen(time_ns: int, frame: np.ndarray, expert: np.ndarray) -> None:
            truth["frames"].append(frame)
            truth["states"].append(env.state)
            truth["actions"].append(expert)

        drive_episode(ArmWorld(env, 0), 0, None, seen)
    with Bag(bag_path) as bag:
        assert {name: info.msgtype for name, info in bag.topics.items()} == {
            "/arm/state": "sensor_msgs/msg/JointState", "/camera/image_raw": "sensor_msgs/msg/Image",
            "/vla/command": "std_msgs/msg/Float32MultiArray"}
        states = [m.msg for m in bag.messages(["/arm/state"])]
        images = [m.msg for m in bag.messages(["/camera/image_raw"])]
        commands = [m.msg for m in bag.messages(["/vla/command"])]
    assert len(states) == len(images) == len(commands) == STEPS  # one per step: the expert needs more for reach
    assert [list(m.name) for m in states] == [list(STATE)] * STEPS
    reader = JointStateReader(STATE, False)
    np.testing.assert_allclose([reader.vector(m) for m in states], truth["states"], atol=1e-9)
    for image, frame in zip(images, truth["frames"]):
        assert (image.height, image.width, image.encoding) == (96, 96, "rgb8")
        assert np.array_equal(np.asarray(image.data).reshape(96, 96, 3), frame)
    np.testing.assert_allclose([np.asarray(m.data) for m in commands], truth["actions"], atol=1e-7)
    assert [(m.header.stamp.sec, m.header.stamp.nanosec) for m in states] == \
        [(m.header.stamp.sec, m.header.stamp.nanosec) for m in images]  # each state stamped as its frame
    times = [m.header.stamp.sec * 10**9 + m.header.stamp.nanosec for m in images]
    assert set(np.diff(times)) == {12_500_000}  # one step, 12.5 ms apart


def test_replay_reads_the_recorded_episode_with_the_arm_s_config(recorded, tmp_path, capsys):
    config, bag_path = recorded
    assert main(["replay", str(bag_path), "--config", str(config), "--policy", "fifo", "--cost", FIXED,
                 "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["bag"]["state"] == {"topic": "/arm/state", "state_type": "joint_state", "found": False}
    assert report["bag"]["command_topic"] == "/vla/command"
    fifo = report["policies"]["fifo"]
    assert fifo["decoded_frames"] == STEPS and fifo["no_state"] == 0 and fifo["actions"] > 0
    capsys.readouterr()
