"""``vla-edge replay`` on the command line: exit status 2 with one clear line for every bad input."""

from __future__ import annotations

import numpy as np
import pytest
from replay_inputs import FIXED, replay_config_file, write_moving_bag

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
