"""Bags without rosbag2: generated sample bags read back through Bag in every layout, auto-detection,
every bad input as one BagError, and recorded commands mapped back to the action space."""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from rosbags.typesys import Stores, get_typestore

from vla_edge_ros.bags import Bag, BagError, command_vector
from vla_edge_ros.bags.scenarios import COMMAND_DIMS, CUE_CLASSES, START_NS, BagSpec, scenario_frames, write_bag
from vla_edge_ros.bags.writer import BagWriter
from vla_edge_ros.cli import main
from vla_edge_ros.runtime.image_codec import decode_compressed, decode_raw
from vla_edge_ros.worlds.scenes import TEST, CueScene, scene_seed

SPEC = BagSpec(seconds=0.5, size=(40, 30), images="both")  # 15 frames at 30 Hz
FRAMES = 15
RAW, JPEG, COMMAND, ODOM = "/camera/image_raw", "/camera/image_raw/compressed", "/vla/command", "/odom"
TYPES = get_typestore(Stores.ROS2_KILTED).types

# (name of --out, storage, compression): every layout the writer makes and the reader must open.
LAYOUTS = [("dir", "mcap", "none"), ("dir", "sqlite3", "none"), ("bag.mcap", None, "none"),
           ("bag.db3", None, "none"), ("bag.bag", None, "none"), ("dir", "mcap", "message"),
           ("dir", "sqlite3", "file"), ("bag.mcap", None, "chunk"), ("bag.bag", None, "chunk")]


def _raws(path: Path) -> list[tuple[str, str, int, bytes]]:
    with Bag(path) as bag:
        return list(bag.raw_messages(list(bag.topics)))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[tuple[str, str, int, bytes]]:
    return _raws(write_bag(SPEC, tmp_path_factory.mktemp("ref") / "ref.mcap"))


@pytest.mark.parametrize("name,storage,compression", LAYOUTS)
def test_every_layout_reads_back_the_scenario(tmp_path, reference, name, storage, compression):
    path = write_bag(SPEC, tmp_path / name, storage=storage, compression=compression)
    expected = list(scenario_frames(SPEC))
    times = [START_NS + round(i * 1e9 / 30) for i in range(FRAMES)]
    with Bag(path) as bag:
        assert {t: (i.msgtype, i.count) for t, i in bag.topics.items()} == {
            RAW: ("sensor_msgs/msg/Image", FRAMES), JPEG: ("sensor_msgs/msg/CompressedImage", FRAMES),
            COMMAND: ("std_msgs/msg/Float32MultiArray", FRAMES), ODOM: ("nav_msgs/msg/Odometry", FRAMES)}
        assert (bag.start_ns, bag.end_ns, bag.message_count) == (times[0], times[-1], 4 * FRAMES)
        assert bag.duration_s == pytest.approx(14 / 30)
        messages = list(bag.messages([RAW, JPEG, COMMAND]))
    assert [m.time_ns for m in messages] == sorted(m.time_ns for m in messages)
    by_topic = {topic: [m for m in messages if m.topic == topic] for topic in (RAW, JPEG, COMMAND)}
    for (pixels, action), time_ns, raw, jpeg, command in zip(expected, times, *by_topic.values()):
        assert raw.time_ns == jpeg.time_ns == command.time_ns == time_ns
        stamp = raw.msg.header.stamp
        assert stamp.sec * 10**9 + stamp.nanosec == time_ns and raw.msg.header.frame_id == "camera"
        m = raw.msg
        np.testing.assert_array_equal(decode_raw(m.encoding, m.height, m.width, m.step, m.is_bigendian, m.data), pixels)
        decoded = decode_compressed(jpeg.msg.format, jpeg.msg.data).astype(int)
        assert decoded.shape == pixels.shape and np.abs(decoded - pixels).mean() < 6  # JPEG quality 90
        np.testing.assert_array_equal(command.msg.data, action)
    # Whatever the layout, the camera, commands and odometry publish as the same CDR bytes (ROS 1 converted), in
    # the same order: each instant's odometry first.
    assert _raws(path) == reference


def test_same_arguments_write_the_same_messages_and_the_seed_matters(tmp_path, reference):
    assert _raws(write_bag(SPEC, tmp_path / "again.db3")) == reference
    other = _raws(write_bag(replace(SPEC, seed=1), tmp_path / "seed1.mcap"))
    assert [r[3] for r in other if r[0] == RAW] != [r[3] for r in reference if r[0] == RAW]
    cue = BagSpec(scenario="cue-recall", seconds=2.0)
    assert _raws(write_bag(cue, tmp_path / "cue1.mcap")) == _raws(write_bag(cue, tmp_path / "cue2.bag"))


def test_moving_commands_track_the_disc():
    """The measured disc position and velocity follow synthetic.py's Lissajous path (at 30 Hz scene time)."""
    commands = np.array([command for _, command in scenario_frames(BagSpec(seconds=3.0, size=(320, 240)))])
    t = np.arange(len(commands)) / 30.0
    assert commands.shape == (90, COMMAND_DIMS) and not commands[:, 4:].any()
    np.testing.assert_allclose(commands[:, 2], 0.7 * np.cos(0.7 * t), atol=0.01)
    np.testing.assert_allclose(commands[:, 3], 0.6 * np.sin(1.1 * t), atol=0.01)
    # Forward differences over one frame: the velocity half a frame ahead.
    np.testing.assert_allclose(commands[:-1, 0], -0.49 * np.sin(0.7 * (t[:-1] + 1 / 60)), atol=0.08)
    np.testing.assert_allclose(commands[:-1, 1], 0.66 * np.cos(1.1 * (t[:-1] + 1 / 60)), atol=0.08)
    np.testing.assert_array_equal(commands[-1, :2], commands[-2, :2])  # the last frame keeps the last velocity


def test_cue_recall_episodes_answer_the_cue_class_at_each_query():
    spec = BagSpec(scenario="cue-recall", seconds=4.5)  # four whole 30-frame episodes; the half is dropped
    frames = list(scenario_frames(spec))
    assert len(frames) == 120 and frames[0][0].shape == (64, 64, 3)
    for index in range(4):
        episode = frames[index * 30:(index + 1) * 30]
        answer = np.full(COMMAND_DIMS, np.nan, np.float32)
        answer[:CUE_CLASSES] = -1
        answer[index % CUE_CLASSES] = 1
        np.testing.assert_array_equal(episode[-1][1], answer)
        assert all(np.isnan(command).all() for _, command in episode[:-1])
    scene = CueScene(scene_seed(0, TEST, 2), classes=CUE_CLASSES)
    np.testing.assert_array_equal(frames[60][0], scene.cue_frame(2))  # the benchmark's episode 2


def test_topic_detection(tmp_path):
    with Bag(write_bag(SPEC, tmp_path / "both.mcap")) as bag:
        with pytest.raises(BagError, match=r"several image topics, choose one with --image-topic: "
                                           r"/camera/image_raw \(sensor_msgs/msg/Image, 15 messages\), "
                                           r"/camera/image_raw/compressed \(sensor_msgs/msg/CompressedImage"):
            bag.image_topic()
        assert bag.image_topic(JPEG) == JPEG and bag.command_topic() == COMMAND
        with pytest.raises(BagError, match="no topic /camera/depth; its image topics are /camera/image_raw "):
            bag.image_topic("/camera/depth")
        with pytest.raises(BagError, match="/vla/command carries std_msgs/msg/Float32MultiArray, not a image"):
            bag.image_topic(COMMAND)
        with pytest.raises(BagError, match="not a command type"):
            bag.command_topic(RAW)
        with pytest.raises(BagError, match="no topic /tf"):
            next(bag.messages(["/tf"]))
    with Bag(write_bag(BagSpec(seconds=0.1, size=(16, 16)), tmp_path / "raw.mcap")) as bag:
        assert bag.image_topic() == RAW

    with BagWriter(tmp_path / "commands.mcap") as writer:
        writer.write(writer.add_topic("/cmd_vel", "geometry_msgs/msg/Twist"), START_NS, _twist())
        writer.write(writer.add_topic("/joints", "sensor_msgs/msg/JointState"), START_NS, _joint_state(["a"], [1.0]))
    with Bag(tmp_path / "commands.mcap") as bag:
        with pytest.raises(BagError, match="no image topic .* the bag has /cmd_vel \\(geometry_msgs/msg/Twist"):
            bag.image_topic()
        with pytest.raises(BagError, match="several command topics, choose one with --command-topic"):
            bag.command_topic()
        assert bag.command_topic("/joints") == "/joints"


def test_no_command_topic_is_none(tmp_path):
    with BagWriter(tmp_path / "camera.db3") as writer:
        image = TYPES["sensor_msgs/msg/Image"](header=writer.header(START_NS, "camera"), height=1, width=1,
                                               encoding="mono8", is_bigendian=0, step=1, data=np.zeros(1, np.uint8))
        writer.write(writer.add_topic(RAW, "sensor_msgs/msg/Image"), START_NS, image)
    with Bag(tmp_path / "camera.db3") as bag:
        assert bag.command_topic() is None and bag.image_topic() == RAW and bag.duration_s == 0


def test_bare_storage_files_and_a_directory_without_metadata_open(tmp_path, reference):
    for storage, suffix in (("mcap", ".mcap"), ("sqlite3", ".db3")):
        directory = write_bag(SPEC, tmp_path / storage, storage=storage)
        assert _raws(directory / f"{storage}{suffix}") == reference
        (directory / "metadata.yaml").unlink()
        assert _raws(directory) == reference


def test_a_bag_of_types_it_does_not_define_decodes_with_the_builtins(tmp_path):
    db3 = write_bag(SPEC, tmp_path / "old.db3")
    with sqlite3.connect(db3) as db:  # what a pre-Iron rosbag2 SQLite bag looks like
        db.execute("DELETE FROM message_definitions")
    with Bag(db3) as bag:
        assert [m.msg.width for m in bag.messages([RAW])] == [40] * FRAMES


def test_bad_inputs_are_one_clear_bag_error(tmp_path):
    with pytest.raises(BagError, match="missing.mcap: no such file or directory"):
        Bag(tmp_path / "missing.mcap")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(BagError, match=r"notes.txt: not a bag \(expected a rosbag2 directory"):
        Bag(tmp_path / "notes.txt")
    (tmp_path / "fake.mcap").write_text("hello")
    with pytest.raises(BagError, match="fake.mcap: cannot read it as a bag: not a bag, or a truncated or corrupt"):
        Bag(tmp_path / "fake.mcap")
    (tmp_path / "folder").mkdir()
    with pytest.raises(BagError, match="folder: not a bag: the directory has no metadata.yaml"):
        Bag(tmp_path / "folder")
    with BagWriter(tmp_path / "empty.mcap") as writer:
        writer.add_topic(RAW, "sensor_msgs/msg/Image")
    with pytest.raises(BagError, match=r"empty.mcap: the bag is empty \(no messages on 1 topics\)"):
        Bag(tmp_path / "empty.mcap")
    for name in ("cut.mcap", "cut.db3"):
        whole = write_bag(SPEC, tmp_path / f"whole-{name}").read_bytes()
        (tmp_path / name).write_bytes(whole[:len(whole) // 2])
        with pytest.raises(BagError, match=f"{name}: cannot read it as a bag: not a bag, or a truncated or corrupt"):
            Bag(tmp_path / name)


def test_a_corrupt_record_is_a_bag_error_while_reading(tmp_path):
    db3 = write_bag(SPEC, tmp_path / "junk.db3")
    with sqlite3.connect(db3) as db:
        db.execute("UPDATE messages SET data = x'0001000001' WHERE id = 4")
    with Bag(db3) as bag, pytest.raises(BagError, match="junk.db3: the .* message on .* at .* ns does not decode"):
        list(bag.messages(list(bag.topics)))
    mcap = write_bag(SPEC, tmp_path / "junk.mcap", compression="chunk")
    data = bytearray(mcap.read_bytes())
    data[len(data) // 3:len(data) // 3 + 64] = b"\xff" * 64
    mcap.write_bytes(bytes(data))
    with Bag(mcap) as bag, pytest.raises(BagError, match="junk.mcap: truncated or corrupt storage"):
        list(bag.raw_messages(list(bag.topics)))


def test_make_bag_command_line(tmp_path, capsys):
    out = tmp_path / "cue"
    args = ["make-bag", "--scenario", "cue-recall", "--out", str(out), "--seconds", "1", "--storage", "sqlite3"]
    assert main([*args, "--compressed"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "/camera/image_raw/compressed" in printed and "30 messages" in printed
    assert main(args) == 2 and "exists; pass --force to replace it" in capsys.readouterr().err
    assert main([*args, "--force", "--raw", "--size", "32x32"]) == 0
    with Bag(out) as bag:
        assert bag.image_topic() == RAW and next(bag.messages([RAW])).msg.width == 32
    (tmp_path / "notes").write_text("mine")
    for not_a_bag in (tmp_path, tmp_path / "notes"):
        assert main(["make-bag", "--scenario", "moving", "--out", str(not_a_bag), "--force"]) == 2
        assert "refusing to replace" in capsys.readouterr().err
    assert main(["make-bag", "--scenario", "cue-recall", "--out", str(tmp_path / "x.mcap"), "--seconds", "0.5"]) == 2
    assert "needs at least one 1 s episode" in capsys.readouterr().err
    assert main(["make-bag", "--scenario", "moving", "--out", str(tmp_path / "x.bag"), "--storage", "mcap"]) == 2
    assert "contradicts the suffix" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["make-bag", "--scenario", "dance", "--out", str(tmp_path / "x.mcap")])
    assert "invalid choice: 'dance' (choose from 'moving', 'cue-recall')" in capsys.readouterr().err
    assert not list(tmp_path.glob(".*partial*")), "a failed run left its staging directory behind"


def _twist(lx=0.0, ly=0.0, lz=0.0, ax=0.0, ay=0.0, az=0.0):
    vector = TYPES["geometry_msgs/msg/Vector3"]
    return TYPES["geometry_msgs/msg/Twist"](linear=vector(x=lx, y=ly, z=lz), angular=vector(x=ax, y=ay, z=az))


def _joint_state(names: list[str], positions: list[float]):
    header = TYPES["std_msgs/msg/Header"](stamp=TYPES["builtin_interfaces/msg/Time"](sec=0, nanosec=0), frame_id="")
    return TYPES["sensor_msgs/msg/JointState"](header=header, name=names, position=np.array(positions),
                                               velocity=np.array([]), effort=np.array([]))


def test_command_vector_maps_each_command_type_back_to_the_action():
    kw = {"twist_dims": [0, 1, -1, -1, -1, 2], "joint_names": ["a", "b", "c"]}
    nan = np.nan
    for msgtype in ("std_msgs/msg/Float32MultiArray", "std_msgs/msg/Float64MultiArray"):
        array = TYPES[msgtype](layout=TYPES["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0),
                               data=np.array([0.5, -0.25, 1.0], np.float32 if "32" in msgtype else np.float64))
        result = command_vector(array, msgtype, **kw)
        assert result.dtype == np.float64
        np.testing.assert_array_equal(result, [0.5, -0.25, 1.0])
    np.testing.assert_array_equal(command_vector(_twist(0.1, 0.2, 0.3, 0.4, 0.5, 0.6), "geometry_msgs/msg/Twist", **kw),
                                  [0.1, 0.2, 0.6])
    np.testing.assert_array_equal(
        command_vector(_twist(1, 2, 3, 4, 5, 6), "geometry_msgs/msg/Twist", twist_dims=[5, -1, 0, -1, -1, -1],
                       joint_names=[]), [3, nan, nan, nan, nan, 1])
    for bad in ([0, 1, 2], [0, 0, -1, -1, -1, -1], [0, -2, 1, 2, 3, 4]):
        with pytest.raises(ValueError, match="twist_dims"):
            command_vector(_twist(), "geometry_msgs/msg/Twist", twist_dims=bad, joint_names=[])
    state = _joint_state(["c", "x", "a", "b"], [3.0, 9.0, 1.0])  # no position for b
    np.testing.assert_array_equal(command_vector(state, "sensor_msgs/msg/JointState", **kw), [1.0, nan, 3.0])
    def point(*positions: float):
        zero = TYPES["builtin_interfaces/msg/Duration"](sec=0, nanosec=0)
        return TYPES["trajectory_msgs/msg/JointTrajectoryPoint"](
            positions=np.array(positions), velocities=np.array([]), accelerations=np.array([]),
            effort=np.array([]), time_from_start=zero)

    trajectory = TYPES["trajectory_msgs/msg/JointTrajectory"](
        header=_joint_state([], []).header, joint_names=["b", "a"], points=[point(2.0, 1.0), point(7.0, 7.0)])
    np.testing.assert_array_equal(command_vector(trajectory, "trajectory_msgs/msg/JointTrajectory", **kw),
                                  [1.0, 2.0, nan])
    trajectory.points = []
    assert np.isnan(command_vector(trajectory, "trajectory_msgs/msg/JointTrajectory", **kw)).all()
    with pytest.raises(ValueError, match="sensor_msgs/msg/Image is not a command type"):
        command_vector(None, "sensor_msgs/msg/Image", **kw)


def test_recorded_commands_decode_from_a_bag_into_the_action(tmp_path):
    with Bag(write_bag(SPEC, tmp_path / "c.bag")) as bag:  # through ROS 1 deserialisation too
        first = next(bag.messages([bag.command_topic()]))
    vector = command_vector(first.msg, first.msgtype, twist_dims=[0, 1, 2, 3, 4, 5], joint_names=[])
    np.testing.assert_array_equal(vector, next(scenario_frames(SPEC))[1])


def _cli(*argv: str) -> subprocess.CompletedProcess:
    """``vla-edge`` in its own process, so that a blocking open fails the test by timeout instead of hanging it."""
    return subprocess.run([sys.executable, "-m", "vla_edge_ros", *argv], capture_output=True, text=True,
                          timeout=60)


def _storage(directory: Path) -> Path:
    (storage,) = directory.glob("*.mcap")
    return storage


def _fifo_bags(tmp_path: Path) -> dict[str, Path]:
    """A FIFO in each place a bag's bytes are read from: the bag itself, the one storage file of a directory
    without metadata, and the storage file a rosbag2 directory's metadata.yaml names."""
    os.mkfifo(tmp_path / "fifo.mcap")
    (tmp_path / "bare").mkdir()
    os.mkfifo(tmp_path / "bare" / "x.mcap")
    rosbag2 = write_bag(SPEC, tmp_path / "rosbag2", storage="mcap")
    storage = _storage(rosbag2)
    storage.unlink()
    os.mkfifo(storage)
    return {"file": tmp_path / "fifo.mcap", "bare": tmp_path / "bare", "rosbag2": rosbag2}


def test_a_fifo_as_a_bag_is_refused_at_once_not_waited_on(tmp_path):
    """Reading a FIFO blocks until a writer comes, which none will: replay used to hang for good."""
    bags = _fifo_bags(tmp_path)
    result = _cli("replay", str(bags["file"]), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"vla-edge replay: error: {bags['file']}: not a bag: it is a FIFO (named pipe)\n"
    result = _cli("replay", str(bags["bare"]), str(bags["rosbag2"]), "--out", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"vla-edge replay: error: {bags['bare']}: not a bag: {bags['bare'] / 'x.mcap'} is a FIFO (named pipe)",
        f"vla-edge replay: error: {bags['rosbag2']}: not a bag: {_storage(bags['rosbag2'])} is a FIFO (named pipe)",
        f"vla-edge replay: 2 of 2 bags failed: {bags['bare']}, {bags['rosbag2']}"]


def test_play_refuses_a_fifo_too(tmp_path):
    pytest.importorskip("rclpy")
    fifo = tmp_path / "fifo.mcap"
    os.mkfifo(fifo)
    result = _cli("play", str(fifo))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"vla-edge play: error: {fifo}: not a bag: it is a FIFO (named pipe)\n"


def test_devices_and_sockets_are_not_bags(tmp_path):
    """They do not hang every time, but reading one is never what was meant: named as what it is."""
    with pytest.raises(BagError, match="^/dev/null: not a bag: it is a character device$"):
        Bag("/dev/null")
    sock, directory = tmp_path / "s.mcap", tmp_path / "d"
    directory.mkdir()
    (directory / "linked.mcap").symlink_to(sock)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(sock))
        with pytest.raises(BagError, match=f"^{re.escape(str(sock))}: not a bag: it is a socket$"):
            Bag(sock)
        linked = re.escape(f"{directory}: not a bag: {directory / 'linked.mcap'}")
        with pytest.raises(BagError, match=f"^{linked} is a socket$"):
            Bag(directory)
