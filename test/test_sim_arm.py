"""`vla-edge run --sim metaworld/<task>`: Meta-World's arm closes the loop over DDS, its camera and JointState in,
the 4-D commands of the action publisher (clipped to its limits) out, stepping at 80 Hz.

Needs rclpy, the ``metaworld`` extra and libOSMesa; without the last two the tests skip with the line a user
would get. A random-weights checkpoint and 64 x 64 frames: seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")

from ros_graph import WAIT_S, leased_domain, private_graph  # noqa: E402
from vla_edge_ros.config import parse_settings  # noqa: E402
from vla_edge_ros.model.init_model import preset, write_random_model  # noqa: E402
from vla_edge_ros.model.tokenizer_files import write_tokenizer  # noqa: E402
from vla_edge_ros.tools.arm_world import ArmTask, camera_period_steps  # noqa: E402
from vla_edge_ros.worlds.metaworld import DESCRIPTIONS, STATE, WorldUnavailable, backend  # noqa: E402

pytestmark = pytest.mark.ros
LIMIT = 0.5  # the publisher's action limits here, inside the arm's own [-1, 1]: the commands must keep to them


def loaded() -> None:
    try:
        backend.load()
    except WorldUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def arm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random `init-model --preset sim --state-dim 4 --head mlp --chunk 8 --dof 4` checkpoint (2 layers), with a
    tokenizer that reads the tasks' descriptions."""
    out = tmp_path_factory.mktemp("models") / "arm"
    write_random_model(out, preset("sim", 2, state_dim=4, head="mlp", chunk=8, dof=4), seed=0)
    write_tokenizer(out, [*DESCRIPTIONS.values(), "user", "assistant"], preset("sim").vocab_size)
    return out


def _settings(model: Path):
    return parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(model), "backend": "numpy"}},
        "action_publisher": {"ros__parameters": {"action_min": [-LIMIT], "action_max": [LIMIT]}}}, "test.yaml")


def test_the_camera_rate_is_80_hz_over_a_whole_number_of_steps():
    assert [camera_period_steps(rate) for rate in (80.0, 40.0, 20.0, 10.0)] == [1, 2, 4, 8]
    for rate in (30.0, 100.0, 0.0):
        with pytest.raises(ValueError, match="80 Hz over a whole number of steps"):
            camera_period_steps(rate)


def test_the_model_drives_the_simulated_arm_with_four_values_within_the_limits(arm_model):
    from std_msgs.msg import Float32MultiArray

    from vla_edge_ros.nodes.bringup import Pipeline

    loaded()
    task = ArmTask("reach-v3", width=64, height=64)
    with private_graph() as (context, _):
        pipeline = Pipeline(_settings(arm_model), context=context, sim_task=task)
        listener = rclpy.create_node("listener", context=context)
        heard: list[tuple[float, ...]] = []
        listener.create_subscription(Float32MultiArray, "/vla/command", lambda m: heard.append(tuple(m.data)), 10)
        pipeline.executor.add_node(listener)
        try:
            sim = pipeline.sim
            start = sim.env.state.copy()
            deadline = time.monotonic() + WAIT_S
            while not (pipeline.reasoning.actions > 5 and min(sim.commands, sim.steps, len(heard)) > 40):
                assert time.monotonic() < deadline, f"no closed loop: {sim.status()}"
                pipeline.run(duration_s=0.2)
            # what the nodes were told: the arm's frames, its JointState, its description, 80 Hz float arrays
            camera, publisher = pipeline.settings["camera_subscriber"], pipeline.settings["action_publisher"]
            assert (camera["frame_height"], camera["frame_width"], camera["state_type"]) == (64, 64, "joint_state")
            assert tuple(camera["state_joint_names"]) == STATE and pipeline.camera.states.received > 0
            assert (publisher["command_type"], publisher["control_rate_hz"]) == ("float32_multi_array", 80.0)
            assert pipeline.reasoning.figures()["instruction"] == DESCRIPTIONS["reach-v3"]
            moving = [values for values in heard if values]  # an empty array: the stop before the first action
            assert moving and all(len(values) == 4 for values in moving)
            assert max(abs(v) for values in moving for v in values) <= LIMIT + 1e-6
            assert sim.malformed_commands == 0 and sim.failure is None
            assert np.linalg.norm(sim.env.state[:3] - start[:3]) > 0 or sim.tally.count  # the hand moved
        finally:
            pipeline.executor.remove_node(listener)
            listener.destroy_node()
            pipeline.shutdown()


def test_each_new_episode_is_announced_and_starts_the_reasoning_nodes_memory_afresh(arm_model):
    """Episodes of 12 steps back to back: before each new layout the arm calls ``~/reset_episode`` and waits for
    the answer, so the reasoning node starts a new episode (its memory from the prompt, the slot's chunks
    withdrawn) as evaluate starts one; none goes unannounced."""
    from vla_edge_ros.nodes.bringup import Pipeline

    loaded()
    task = ArmTask("reach-v3", width=64, height=64, max_steps=12)
    with private_graph() as (context, _):
        pipeline = Pipeline(_settings(arm_model), context=context, sim_task=task)
        try:
            sim, reasoning = pipeline.sim, pipeline.reasoning
            started = reasoning.episodes
            deadline = time.monotonic() + WAIT_S
            while sim.tally.count < 3:
                assert time.monotonic() < deadline, f"episodes do not end: {sim.status()}"
                pipeline.run(duration_s=0.2)
            assert sim.unannounced == 0 and sim.summary()["unannounced_episodes"] == 0
            assert reasoning.episodes - started >= sim.tally.count - 1  # each announced one applied by now, or next
            assert pipeline.slot.episode >= 1
        finally:
            pipeline.shutdown()


def test_the_arm_takes_four_values_or_a_stop_and_drops_the_rest(arm_model):
    from std_msgs.msg import Float32MultiArray

    from vla_edge_ros.nodes.sim_arm import SimArmNode

    loaded()
    with private_graph() as (context, _):
        with pytest.raises(ValueError, match="as a Float32MultiArray"):
            SimArmNode(ArmTask("reach-v3"), image_topic="camera/image_raw", command_topic="vla/command",
                       command_type="twist", state_topic="arm/state", context=context)
        with pytest.raises(ValueError, match="80 Hz over a whole number"):
            SimArmNode(ArmTask("reach-v3"), image_topic="camera/image_raw", command_topic="vla/command",
                       command_type="float32_multi_array", state_topic="arm/state", camera_rate_hz=30.0,
                       context=context)
        node = SimArmNode(ArmTask("reach-v3", width=32, height=32), image_topic="camera/image_raw",
                          command_topic="vla/command", command_type="float32_multi_array", state_topic="arm/state",
                          context=context)
        try:
            assert node._current().tolist() == [0.0] * 4 and node.stale_steps == 1  # nothing yet: the zero action
            node._take(Float32MultiArray(data=[0.5, -0.5, 0.25, 1.0]))
            assert node._current().tolist() == [0.5, -0.5, 0.25, 1.0]
            node._take(Float32MultiArray(data=[0.5, 0.5]))  # dropped and counted: the last command stays
            assert node.malformed_commands == 1 and node._current().tolist() == [0.5, -0.5, 0.25, 1.0]
            node._take(Float32MultiArray(data=[]))  # the publisher's stop before it knows the action's size
            assert node._current().tolist() == [0.0] * 4 and node.commands == 2
            message = node.state_message(node.get_clock().now().to_msg())
            assert list(message.name) == list(STATE) and list(message.position) == node.env.state.tolist()
        finally:
            node.destroy_node()


def _vla_edge(*args: str, env: dict[str, str], timeout: float = 180.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vla_edge_ros", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_vla_edge_run_sim_metaworld_runs_the_arm_and_prints_its_episodes(arm_model, tmp_path):
    loaded()
    config = Path(__file__).resolve().parent.parent / "config" / "metaworld.yaml"
    with leased_domain() as domain:
        env = {**os.environ, "ROS_DOMAIN_ID": str(domain)}
        done = _vla_edge("run", "--config", str(config), "--model", str(arm_model), "--sim", "metaworld/reach-v3",
                         "--duration", "4", "--summary-json", str(tmp_path / "summary.json"), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert 'simulated arm, metaworld/reach-v3 "move the gripper to the goal"' in done.stdout
    assert "| arm 0/0 succeeded, " in done.stdout  # the status line's (a random policy reaches nothing in 4 s)
    summary = json.loads((tmp_path / "summary.json").read_text())
    arm = summary["sim_arm"]
    # wiring, not rate: a loaded machine may give the arm only a few of its 320 steps in 4 s
    assert arm["task"] == "metaworld/reach-v3" and arm["steps"] > 0 and arm["commands"] > 0
    assert arm["camera_rate_hz"] == 20.0 and arm["frames"] > 0 and arm["failure"] is None
    assert summary["action_publisher"]["published"] > 0


def test_run_sim_metaworld_refuses_in_one_line(arm_model, tmp_path):
    """A renderer that cannot start (as without OSMesa) and a task that is not one Meta-World task: one line, exit
    code 2, no traceback."""
    env = {**os.environ, "MUJOCO_GL": "no-such-backend", "ROS_DOMAIN_ID": "231"}  # nothing gets on the graph
    done = _vla_edge("run", "--model", str(arm_model), "--sim", "metaworld/reach-v3", "--duration", "1", env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "MUJOCO_GL" in done.stderr, done.stderr
    for task, message in [("metaworld/push-v2", "unknown task 'metaworld/push-v2'"),
                          ("mt10", "runs one Meta-World task")]:
        done = _vla_edge("run", "--sim", task, "--duration", "1", env=env)
        assert done.returncode == 2 and message in done.stderr, done.stderr
