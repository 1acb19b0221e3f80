"""Replay feeds a state-reading model the robot's state from the bag, as the live camera node pairs it, and the
bags we write carry one: make-bag's odometry of a robot executing its own commands, evaluate --record's world
odometry. Models are built here (the tiny preset with a 6-value state token), nothing is downloaded."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from replay_inputs import FIXED, replay_config_file, replay_settings

from vla_edge_ros.bags import Bag, BagError
from vla_edge_ros.bags.odometry import ODOMETRY_MSGTYPE, bag_odometry
from vla_edge_ros.bags.scenarios import BagSpec, write_bag
from vla_edge_ros.bags.writer import BagWriter
from vla_edge_ros.cli import main
from vla_edge_ros.config import ObservationKnobs
from vla_edge_ros.model.config import StateConfig
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.runtime.action_output import clip
from vla_edge_ros.runtime.image_codec import frame_from_message
from vla_edge_ros.runtime.loader import load_engine
from vla_edge_ros.runtime.robot_state import OdometryReader
from vla_edge_ros.tools.evaluate import run_episode
from vla_edge_ros.tools.replay import parse_cost, replay_bag
from vla_edge_ros.tools.replay.bag_state import StateSource, state_source, with_state
from vla_edge_ros.tools.replay.runner import read_bag, recorded_messages
from vla_edge_ros.tools.replay.session import replay_policy
from vla_edge_ros.worlds.sim.world import CueReachEnv, TaskSpec

CAMERA, ODOM, JOINTS = "/camera/image_raw", "/odom", "/joint_states"
PERIOD_NS = 33_333_333
START_NS = 1_000_000_000
JOINT_NAMES = ["a", "b", "c", "d", "e", "f"]


@pytest.fixture(scope="module")
def state_model(tmp_path_factory) -> Path:
    """The tiny model reading a 6-value state, as the retrained models/sim does."""
    return write_random_model(tmp_path_factory.mktemp("models") / "odom", preset("tiny", state_dim=6), seed=0)


@pytest.fixture(scope="module")
def moving_bag(tmp_path_factory) -> Path:
    """One second of make-bag's moving scene at 30 Hz, 64x48, with its odometry on /odom."""
    return write_bag(BagSpec(scenario="moving", seconds=1.0, size=(64, 48)), tmp_path_factory.mktemp("b") / "m.mcap")


def _messages(path: Path, topic: str) -> list:
    with Bag(path) as bag:
        return [m.msg for m in bag.messages([topic])]


def _engine_actions(settings, frames: list[np.ndarray], states: list[np.ndarray]) -> list[np.ndarray]:
    """Each observation straight into a fresh engine, its action clipped as the publisher would."""
    engine = load_engine(settings).engine
    publisher = settings["action_publisher"]
    actions = []
    for image, state in zip(frames, states):
        chunk, _ = engine.decode_action(engine.add_frame(image, (), state))
        actions.append(clip(chunk[0], publisher["action_min"], publisher["action_max"]))
    return actions


def test_replay_feeds_each_frame_the_odometry_it_was_seen_with(moving_bag, state_model):
    """state_topic empty: the bag's one odometry topic is found; every frame is paired with the odometry stamped
    as it is, and the actions are those of the same frames and states fed to the engine directly. Fed the
    previous frame's state instead, the engine acts otherwise: the pairing is what makes them equal."""
    settings = replay_settings(state_model)
    bag = read_bag(moving_bag, settings)
    assert bag.state == StateSource(ODOM, "odometry", found=True)
    assert bag.bag_info["command_topic"] == "/vla/command"
    with Bag(moving_bag) as opened:
        run = replay_policy(recorded_messages(opened, CAMERA, ODOM), with_state(settings, bag.state), "fifo",
                            parse_cost(FIXED))
    assert [r.outcome for r in run.frames] == ["admitted"] * 30
    assert run.state_messages == 30 and not any(run.state_dropped.values())
    frames = [frame_from_message(msg, False, (48, 64)) for msg in _messages(moving_bag, CAMERA)]
    states = [OdometryReader().vector(msg) for msg in _messages(moving_bag, ODOM)]
    direct = _engine_actions(with_state(settings, bag.state), frames, states)
    for record, action in zip(run.frames, direct):
        np.testing.assert_array_equal(record.action, action)
    late = _engine_actions(with_state(settings, bag.state), frames[1:], states[:-1])
    assert any(not np.array_equal(r.action, a) for r, a in zip(run.frames[1:], late))


def _state_bag(path: Path, states: list[object], joint_state: bool = False, lead_ns: int = 0) -> Path:
    """A 30 Hz camera (64x48) with, ``lead_ns`` before frame i, a state stamped as the frame when ``states[i]`` is
    not None: odometry values, or (``joint_state``) a (names, positions) pair on /joint_states. The camera's
    connection comes first, so a ROS 1 bag reads each instant's frame before its state."""
    with BagWriter(path) as writer:
        types = writer.types
        camera = writer.add_topic(CAMERA, "sensor_msgs/msg/Image")
        topic = writer.add_topic(JOINTS, "sensor_msgs/msg/JointState") if joint_state else writer.add_topic(
            ODOM, ODOMETRY_MSGTYPE)
        for index, state in enumerate(states):
            t = START_NS + index * PERIOD_NS
            if state is not None and joint_state:
                names, positions = state
                writer.write(topic, t - lead_ns, types["sensor_msgs/msg/JointState"](
                    header=writer.header(t, "base"), name=names, position=np.array(positions, dtype=np.float64),
                    velocity=np.array([]), effort=np.array([])))
            elif state is not None:
                writer.write(topic, t - lead_ns, bag_odometry(writer, t, state))
            writer.write(camera, t, types["sensor_msgs/msg/Image"](
                header=writer.header(t, "camera", seq=index), height=48, width=64, encoding="rgb8", is_bigendian=0,
                step=64 * 3, data=np.full(48 * 64 * 3, 10 * index, np.uint8)))
    return path


def test_a_stale_state_makes_no_observation_and_a_nan_one_is_dropped(state_model, tmp_path):
    """Odometry for frames 0-4 only, each received 2 ms before its frame, frame 2's NaN (dropped and counted).
    Frame 2 waits for the state due at its stamp, as a frame that came first does live; it settles when frame
    3's arrives, 31 ms late, with frame 1's state (of the two nearest, the earlier), and its cycle misses the
    deadline (the warm-up admits it). Frame 5 waits too, for a state that never comes, and frame 6 (its state
    overdue: paired at once, 66 ms old) supersedes it unread. Frame 7's is 100 ms old by the stamps, still in
    time; frames 8 and 9 find only a state older than state_max_age_ms (100): no observation, no action,
    counted as no_state with the live reason."""
    states = [[0.1 * i, 0.0, 0.0, 0.5, 0.0, 0.0] for i in range(5)] + [None] * 5
    states[2][0] = math.nan
    bag = _state_bag(tmp_path / "stale.mcap", states, lead_ns=2_000_000)
    report = replay_bag(bag, replay_settings(state_model), ["fifo"], parse_cost(FIXED), tmp_path / "out")
    fifo = report["policies"]["fifo"]
    assert fifo["no_state"] == 2 and fifo["actions"] == fifo["deadline_hits"] == 6
    assert fifo["missed"] == 1 and fifo["dropped"] == 1
    assert fifo["state_messages"] == 5 and fifo["state_dropped"]["not_finite"] == 1
    assert sum(fifo["state_dropped"].values()) == 1 and fifo["deadline_hit_rate"] == 6 / 8
    assert report["bag"]["state"] == {"topic": ODOM, "state_type": "odometry", "found": True}
    lines = (tmp_path / "out" / "decisions_fifo.txt").read_text().splitlines()
    for line, age in zip(lines[8:], ("133.3", "166.7")):
        assert line.split()[2] == "no_state" and "action=" not in line
        assert f"no robot state: the nearest is {age} ms older than the frames (state_max_age_ms 100)" in line
    assert [line.split()[2] for line in lines[:8]] == ["admitted"] * 2 + ["missed"] + ["admitted"] * 2 + [
        "dropped"] + ["admitted"] * 2
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "robot state `/odom`" in markdown and "2 of 10 decoded frames found none" in markdown
    assert "1 refused as the live node refuses them (not_finite: 1)" in markdown
    assert json.loads((tmp_path / "out" / "report.json").read_text())["schema"] == "vla_edge_ros.replay/4"


def test_a_bag_in_which_no_frame_finds_a_state_fails_saying_why(state_model, tmp_path):
    bag = _state_bag(tmp_path / "nan.mcap", [[math.nan, 0, 0, 0, 0, 0]] * 3)
    with pytest.raises(BagError, match=r"none of the 3 decoded frames on /camera/image_raw had a robot state to pair "
                                       r"with \(last: no robot state: none has arrived yet; 3 state messages, "
                                       r"dropped not_finite: 3\); nothing was replayed"):
        replay_bag(bag, replay_settings(state_model), ["fifo"], parse_cost(FIXED), tmp_path / "out")


def test_joint_states_are_read_by_name_and_a_wrong_name_is_dropped(state_model, tmp_path):
    """A JointState topic, named in the config: a message naming another joint is dropped (missing_joint), and the
    frame waits for it until the next state, then takes the one before it (its cycle then lost to the next frame,
    received with that state); the JointState topic is not mistaken for the recorded command."""
    good = (JOINT_NAMES[::-1], list(range(6)))  # any order: picked by name
    wrong = (["a", "b", "c", "d", "e", "g"], list(range(6)))
    bag = _state_bag(tmp_path / "joints.db3", [good, good, good, wrong, good, good], joint_state=True)
    settings = replay_settings(state_model).replace("camera_subscriber", {
        "state_topic": "joint_states", "state_type": "joint_state", "state_joint_names": JOINT_NAMES})
    report = replay_bag(bag, settings, ["fifo"], parse_cost(FIXED), tmp_path / "out")
    fifo = report["policies"]["fifo"]
    assert fifo["state_dropped"]["missing_joint"] == 1 and fifo["no_state"] == 0 and fifo["actions"] == 5
    assert report["bag"]["command_topic"] is None
    assert report["bag"]["state"] == {"topic": JOINTS, "state_type": "joint_state", "found": False}


def test_at_one_instant_the_state_comes_before_the_frame_in_every_storage(tmp_path):
    """A ROS 1 bag orders one instant's messages by connection (the camera's first here); replay reads the state
    first all the same, so each frame pairs with the state stamped as it."""
    bag = _state_bag(tmp_path / "ties.bag", [[float(i), 0, 0, 0, 0, 0] for i in range(3)])
    with Bag(bag) as opened:
        assert [m.topic for m in opened.messages([CAMERA, ODOM])][:2] == [CAMERA, ODOM]
        kinds = [type(m).__name__ for m in recorded_messages(opened, CAMERA, ODOM)]
    assert kinds == ["RecordedState", "RecordedFrame"] * 3


def test_where_the_state_comes_from(moving_bag, state_model, tmp_path):
    """A relative state_topic is the root namespace's; a topic of the wrong type, a bag without the topic, or
    without exactly one odometry topic when none is named, is a BagError; a state of another size than
    odometry's with no state_topic is the configuration's error."""
    settings = replay_settings(state_model)

    def knobs(**changes) -> ObservationKnobs:
        return ObservationKnobs.of(settings.replace("camera_subscriber", changes)["camera_subscriber"])

    six = StateConfig(6)
    with Bag(moving_bag) as bag:
        named = state_source(bag, knobs(state_topic="odom", state_type="odometry"), six)
        assert named == StateSource(ODOM, "odometry", found=False)
        assert state_source(bag, knobs(), None) is None
        with pytest.raises(BagError, match="/odom carries nav_msgs/msg/Odometry, and camera_subscriber.state_type "
                                           "joint_state reads sensor_msgs/msg/JointState"):
            state_source(bag, knobs(state_topic="/odom"), six)
        with pytest.raises(ValueError, match="the model reads a state of 4 values: set state_topic"):
            state_source(bag, knobs(), StateConfig(4))
    bare = write_bag(BagSpec(scenario="moving", seconds=0.2, size=(64, 48), state_topic=""), tmp_path / "bare.mcap")
    with Bag(bare) as bag, pytest.raises(BagError, match="0 nav_msgs/Odometry topics, not one: set state_topic"):
        state_source(bag, knobs(), six)


@pytest.mark.parametrize("state_topic,bag_state,message", [
    ("/robot/odom", "/odom", "no topic /robot/odom (camera_subscriber.state_topic), and the model reads the "
                             "robot's state: its state topics are /odom (nav_msgs/msg/Odometry)"),
    ("", "", "the bag has 0 nav_msgs/Odometry topics, not one: set state_topic")])
def test_a_bag_without_the_state_is_one_line_and_exit_2(state_model, tmp_path, capsys, state_topic, bag_state,
                                                        message):
    bag = write_bag(BagSpec(scenario="moving", seconds=0.2, size=(64, 48), state_topic=bag_state),
                    tmp_path / "m.mcap")
    config = replay_config_file(tmp_path, state_model)
    config.write_text(config.read_text() + f"    state_topic: '{state_topic}'\n    state_type: odometry\n")
    assert main(["replay", str(bag), "--config", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_make_bag_writes_the_odometry_of_a_robot_executing_its_commands(moving_bag, tmp_path, capsys):
    """moving: x, y the integral of the commanded velocity (dims 0-1) over the frames before, vx, vy the last
    command executed, yaw and wz 0, stamped as the frames. cue-recall's commands are answers: it stands still."""
    commands = np.array([m.data for m in _messages(moving_bag, "/vla/command")], dtype=np.float64)
    odometry = _messages(moving_bag, ODOM)
    states = np.array([OdometryReader().vector(m) for m in odometry])
    executed = np.vstack([np.zeros(2), commands[:-1, :2]])
    np.testing.assert_allclose(states[:, 0:2], np.cumsum(executed, axis=0) / 30.0, atol=1e-6)
    np.testing.assert_allclose(states[:, 3:5], executed, atol=1e-6)
    assert not states[:, [2, 5]].any() and np.abs(states[:, 0:2]).max() > 0.05  # it moved
    stamps = [(m.header.stamp.sec, m.header.stamp.nanosec) for m in odometry]
    assert stamps == [(m.header.stamp.sec, m.header.stamp.nanosec) for m in _messages(moving_bag, CAMERA)]
    assert odometry[0].header.frame_id == "odom" and odometry[0].child_frame_id == "base_link"
    cue = tmp_path / "cue.mcap"
    assert main(["make-bag", "--scenario", "cue-recall", "--out", str(cue), "--seconds", "1"]) == 0
    assert not np.array([OdometryReader().vector(m) for m in _messages(cue, ODOM)]).any()
    capsys.readouterr()
    assert main(["make-bag", "--scenario", "moving", "--out", str(tmp_path / "bare"), "--seconds", "0.2",
                 "--size", "64x48", "--state-topic", ""]) == 0
    assert "/odom" not in capsys.readouterr().out
    with Bag(tmp_path / "bare") as bag:
        assert ODOM not in bag.topics


def test_make_bag_refuses_odometry_it_cannot_integrate(tmp_path, capsys):
    """At 8x8 the disc sometimes covers no pixel: its velocity is NaN, and no robot executes that."""
    assert main(["make-bag", "--scenario", "moving", "--out", str(tmp_path / "m.mcap"), "--size", "8x8",
                 "--seconds", "20"]) == 2
    err = capsys.readouterr().err
    assert "is not finite: no odometry follows from it" in err and "--state-topic ''" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "m.mcap").exists()


def test_a_recorded_episode_holds_the_world_odometry_and_replays_with_it(state_model, tmp_path):
    """evaluate --record's bag: /odom is the world's odometry at each frame, stamped as it; a state-reading model
    replays it with every frame observed."""
    from vla_edge_ros.tools.evaluate import _expert_episode

    spec = TaskSpec(name="reach", time_limit_s=0.5)
    _expert_episode(spec, 3, replay_settings(state_model), tmp_path)
    truth: list[np.ndarray] = []
    env = CueReachEnv(spec, 3)
    run_episode(env, 3, None, record=lambda time_ns, frame, command: truth.append(env.odometry()))
    bag = tmp_path / "reach_0003.mcap"
    recorded = np.array([OdometryReader().vector(m) for m in _messages(bag, ODOM)])
    np.testing.assert_allclose(recorded, np.array(truth), atol=1e-6)
    assert np.abs(recorded[:, 3:5]).max() > 0  # the expert drove
    report = replay_bag(bag, replay_settings(state_model), ["fifo"], parse_cost(FIXED), tmp_path / "out")
    assert report["policies"]["fifo"]["no_state"] == 0 and report["policies"]["fifo"]["actions"] > 0

