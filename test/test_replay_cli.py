"""``vla-edge replay`` on the command line: ``--out`` checked before any work, ``--json`` alone on stdout, a
batch that runs past a bad bag, and exit status 2 with one clear line for every bad input."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from replay_inputs import FIXED, camera_bag, replay_config_file, write_moving_bag

from vla_edge_ros.bags.writer import BagWriter
from vla_edge_ros.cli import main


@pytest.fixture(scope="module")
def moving_bag(tmp_path_factory):
    return write_moving_bag(tmp_path_factory.mktemp("bags"))


def test_cli_errors_are_clear_and_exit_2(tmp_path, capsys, moving_bag, tiny_model):
    assert main(["replay", str(tmp_path / "missing.mcap")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "junk.mcap").write_bytes(b"not a bag at all")
    assert main(["replay", str(tmp_path / "junk.mcap")]) == 2
    assert "junk.mcap" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["replay", str(moving_bag), "--policy", "fifo,lru"])
    assert "lru" in capsys.readouterr().err
    config = replay_config_file(tmp_path, tiny_model)
    assert main(["replay", str(moving_bag), "--config", str(config), "--policy", "cosine", "--cost", FIXED,
                 "--out", str(tmp_path / "out")]) == 0
    output = capsys.readouterr().out
    assert "| cosine |" in output and "frames/s" in output and (tmp_path / "out" / "report.json").is_file()


@pytest.mark.parametrize("observation,message", [
    ("    extra_image_topics: [wrist/image_raw]\n", "replay feeds one camera, and this configuration's observation "
                                                  "has 2 (extra_image_topics): not yet"),
    ("    state_topic: joint_states\n", "state_topic is 'joint_states', but ")])
def test_several_cameras_or_a_state_the_model_does_not_read_are_refused_before_any_work(
        tmp_path, capsys, moving_bag, tiny_model, observation, message):
    config = replay_config_file(tmp_path, tiny_model)
    config.write_text(config.read_text() + observation)
    assert main(["replay", str(moving_bag), "--config", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_out_is_checked_before_any_work(tmp_path, capsys, moving_bag):
    """A file where the report directory should be, or a place where no file can be written, fails at once
    with one line: the bag is never opened (a missing bag would otherwise be the error), nothing is created."""
    taken = tmp_path / "taken"
    taken.write_text("not a directory")
    (tmp_path / "00_moving").write_text("in the way")  # where a batch's first report would go
    missing = str(tmp_path / "missing.mcap")
    cases = [([missing, "--out", str(taken)], f"--out {taken} exists and is not a directory"),
             ([missing, "--out", str(taken / "sub")], f"--out {taken / 'sub'}: cannot write a report there"),
             ([str(moving_bag), missing, "--out", str(tmp_path)],
              f"--out {tmp_path / '00_moving'} exists and is not a directory")]
    if Path("/proc/self").is_dir():  # Linux: a directory nobody, not even root, can create files in
        cases.append(([missing, "--out", "/proc/report"], "--out /proc/report: cannot write a report there: /proc: "))
    for argv, message in cases:
        assert main(["replay", *argv]) == 2
        captured = capsys.readouterr()  # one line: no progress line, so no replay started
        assert captured.err.count("\n") == 1 and captured.err.startswith(f"vla-edge replay: error: {message}")
        assert "Traceback" not in captured.err and captured.out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00_moving", "taken"]


def test_json_prints_only_json_and_a_bad_bag_in_a_batch_fails_alone(tmp_path, moving_bag, tiny_model):
    """In a subprocess, so that anything written to stdout by any layer would show."""
    junk = tmp_path / "junk.mcap"
    junk.write_bytes(b"not a bag at all")
    out = tmp_path / "reports"
    result = subprocess.run(
        [sys.executable, "-m", "vla_edge_ros", "replay", str(junk), str(moving_bag), "--json", "--policy", "fifo",
         "--cost", FIXED, "--config", str(replay_config_file(tmp_path, tiny_model)), "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    document = json.loads(result.stdout)  # nothing but one JSON document
    assert document["schema"] == "vla_edge_ros.replay-batch/1"
    assert [f["bag"] for f in document["failed"]] == [str(junk)] and "junk.mcap" in document["failed"][0]["error"]
    (report,) = document["reports"]
    assert report["bag"]["path"] == str(moving_bag) and report["policies"]["fifo"]["deadline_hits"] == 60
    assert json.loads((out / "01_moving" / "report.json").read_text())["policies"]["fifo"]["decisions_sha256"] == \
        report["policies"]["fifo"]["decisions_sha256"]
    assert "Traceback" not in result.stderr and "replaying 60 frames" in result.stderr  # progress: stderr
    assert f"1 of 2 bags failed: {junk}" in result.stderr


def test_truncated_bags_and_bags_without_a_camera_are_clear_errors(tmp_path, capsys, moving_bag):
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(moving_bag.read_bytes()[: moving_bag.stat().st_size // 2])
    assert main(["replay", str(cut), "--out", str(tmp_path / "out")]) == 2
    assert "cut.mcap" in capsys.readouterr().err
    blind = tmp_path / "blind.mcap"
    with BagWriter(blind) as writer:
        topic = writer.add_topic("/vla/command", "std_msgs/msg/Float32MultiArray")
        writer.write(topic, 1_000_000_000, writer.types["std_msgs/msg/Float32MultiArray"](
            layout=writer.types["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0),
            data=np.zeros(7, np.float32)))
    assert main(["replay", str(blind), "--out", str(tmp_path / "out")]) == 2
    assert "no image topic" in capsys.readouterr().err


def test_a_bag_that_breaks_while_replaying_is_one_line_naming_it_once(tmp_path, capsys, tiny_model):
    """A record that does not decode is found by the unit reading the frames, in a worker: its BagError reaches
    the user as its own message, not as a traceback's last line (``vla_edge_ros.bags.reader.BagError: ...``)."""
    bag = camera_bag(tmp_path / "broken.db3", bad=lambda index: False)
    with sqlite3.connect(bag) as db:
        db.execute("UPDATE messages SET data = x'0001000001' WHERE id = 5")
    assert main(["replay", str(bag), "--config", str(replay_config_file(tmp_path, tiny_model)), "--policy", "fifo",
                 "--cost", FIXED, "--out", str(tmp_path / "out")]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert line.startswith(f"vla-edge replay: error: {bag}: the sensor_msgs/msg/Image message on /camera/image_raw "
                           "at 1133333332 ns does not decode (")
    assert line.count(str(bag)) == 1 and "vla_edge_ros." not in line
