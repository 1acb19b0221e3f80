"""Offline replay: deterministic decisions, live buffer and gate semantics, reports, and clear errors."""

from __future__ import annotations

import json
import time
from collections import Counter

import numpy as np
import pytest

from vla_edge_ros.bags.scenarios import BagSpec, write_bag
from vla_edge_ros.bags.writer import BagWriter
from vla_edge_ros.cli import main
from vla_edge_ros.config import parse_settings
from vla_edge_ros.runtime.admission import BlockKind
from vla_edge_ros.tools.replay import parse_cost, replay_bag
from vla_edge_ros.tools.replay.report import action_error
from vla_edge_ros.tools.replay.session import PolicyRun

FIXED = "fixed:encode=8ms,decode=1ms"


@pytest.fixture(scope="module")
def moving_bag(tmp_path_factory):
    return write_bag(BagSpec(scenario="moving", seconds=2.0, size=(64, 48)),
                     tmp_path_factory.mktemp("bags") / "moving.mcap")


@pytest.fixture
def settings(tiny_model):
    return _settings(tiny_model)


def _settings(tiny_model, **reasoning):
    return parse_settings({
        "camera_subscriber": {"ros__parameters": {"frame_height": 48, "frame_width": 64}},
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy",
                                          "kv_capacity_tokens": 128, **reasoning}}}, "test.yaml")


def _accounted(policy: dict) -> int:
    return (policy["deadline_hits"] + policy["missed"] + policy["refused"] + policy["stale"] + policy["dropped"]
            + sum(policy["bad_frames"].values()))


def test_a_fixed_cost_replay_decides_identically_byte_for_byte(moving_bag, settings, tmp_path):
    reports = [replay_bag(moving_bag, settings, ["fifo", "aura"], parse_cost(FIXED), tmp_path / name, log=print)
               for name in ("a", "b")]
    for name in ("fifo", "aura"):
        first = (tmp_path / "a" / f"decisions_{name}.txt").read_bytes()
        assert first == (tmp_path / "b" / f"decisions_{name}.txt").read_bytes()
        assert len(first.splitlines()) == 60
    for report in reports:
        for policy in report["policies"].values():
            policy.pop("replay")  # wall-clock speed: the only field allowed to differ
    assert reports[0] == reports[1]
    fifo = reports[0]["policies"]["fifo"]
    assert fifo["frames"] == 60 and _accounted(fifo) == 60
    assert fifo["latency_ms"]["p50"] == pytest.approx(8 + 6 * 1)  # encode + 6 decode steps, nothing else
    assert fifo["action_error"]["compared"] == fifo["actions"] and len(fifo["action_error"]["l1"]) == 7
    assert reports[0]["policies"]["aura"]["memory_bytes"]["peak"] < fifo["memory_bytes"]["peak"]
    for plot in ("latency.png", "timeline.png", "memory.png", "writes.png"):
        assert (tmp_path / "a" / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| fifo |" in (tmp_path / "a" / "report.md").read_text()
    assert json.loads((tmp_path / "a" / "report.json").read_text())["schema"] == "vla_edge_ros.replay/1"


def test_blocks_slower_than_the_frame_rate_drop_frames_and_the_gate_refuses(moving_bag, settings, tmp_path):
    """50 ms per encode at 30 Hz: the buffer overwrites frames while the reasoner is busy, and once warm-up
    is over the gate refuses every cycle it predicts to overrun the 33 ms deadline."""
    report = replay_bag(moving_bag, settings, ["fifo"], parse_cost("fixed:encode=50ms,decode=1ms"), tmp_path)
    fifo = report["policies"]["fifo"]
    decisions = (tmp_path / "decisions_fifo.txt").read_text().splitlines()
    outcomes = Counter(line.split()[2] for line in decisions)
    assert fifo["dropped"] == outcomes["dropped"] > 0
    # warm-up starts three encodes, each 50 ms late for a 33 ms deadline (the decode after each is refused:
    # its deadline has passed); then the gate knows the encode cost and refuses it, except for one recovery
    # attempt after 40 refusals in a row (4 x probe_after), which overruns again
    missed = [line.split()[2:5] for line in decisions if line.split()[2] == "missed"]
    assert missed == [["missed", "warmup", "decode"]] * 4
    refused = [line.split()[3:] for line in decisions if line.split()[2] == "refused"]
    assert fifo["refused"] == len(refused) >= 40 and all(r[1] == "encode_prefill" for r in refused)
    assert fifo["missed"] == 4
    assert fifo["deadline_hits"] == fifo["actions"] == 0 and _accounted(fifo) == 60


def test_measured_costs_and_real_time_pacing(moving_bag, tiny_model, tmp_path):
    # the longest deadline the schema allows: with measured costs a busy machine's cycles are long, and a 33 ms
    # deadline would (rightly) have the gate refuse them all; the deadline is tested with fixed costs above
    settings = _settings(tiny_model, deadline_ms=1000.0)
    start = time.monotonic()
    report = replay_bag(moving_bag, settings, ["fifo"], parse_cost("measured"), tmp_path, realtime=True)
    assert time.monotonic() - start >= report["bag"]["duration_s"]  # paced by the wall clock
    fifo = report["policies"]["fifo"]
    assert _accounted(fifo) == 60 and fifo["actions"] > 0


def test_undecodable_frames_are_counted_not_fatal(settings, tmp_path):
    path = tmp_path / "odd.mcap"
    with BagWriter(path) as writer:
        topic = writer.add_topic("/camera/image_raw", "sensor_msgs/msg/Image")
        for index in range(20):
            encoding = "yuv422_weird" if index % 5 == 0 else "rgb8"
            writer.write(topic, 1_000_000_000 + index * 33_333_333, writer.types["sensor_msgs/msg/Image"](
                header=writer.header(1_000_000_000 + index * 33_333_333, "camera", seq=index), height=48, width=64,
                encoding=encoding, is_bigendian=0, step=64 * 3, data=np.full(48 * 64 * 3, index, np.uint8)))
    report = replay_bag(path, settings, ["fifo"], parse_cost(FIXED), tmp_path / "out")
    fifo = report["policies"]["fifo"]
    assert fifo["bad_frames"] == {"unknown_encoding": 4} and fifo["actions"] > 0 and _accounted(fifo) == 20
    assert report["bag"]["command_topic"] is None and fifo["action_error"] is None


def test_action_error_pairs_each_action_with_the_nearest_command():
    run = PolicyRun("fifo")
    run.actions = [(1_000_000_000, np.array([0.5, 0.0, 1.0], np.float32)),
                   (2_000_000_000, np.array([0.0, 0.0, 0.0], np.float32)),
                   (5_000_000_000, np.array([5.0, 5.0, 5.0], np.float32)),  # nearest command has no ground truth
                   (9_000_000_000, np.array([9.0, 9.0, 9.0], np.float32))]  # no command within 500 ms
    commands = [(900_000_000, np.array([0.0, np.nan, 0.0])), (2_100_000_000, np.array([1.0, np.nan, -1.0])),
                (5_000_000_000, np.full(3, np.nan))]
    error = action_error(run, commands)
    assert error["compared"] == 2
    assert error["l1"] == pytest.approx([0.75, 1.0])  # the unmapped middle dimension is left out
    assert error["rmse"] == pytest.approx([np.sqrt((0.25 + 1) / 2), 1.0])


@pytest.mark.parametrize("text, expected", [
    ("measured", None),
    ("fixed:encode=4ms,decode=1ms", {BlockKind.ENCODE_PREFILL: 4_000_000, BlockKind.DECODE: 1_000_000}),
    ("fixed:decode=250us,encode=2.5ms", {BlockKind.ENCODE_PREFILL: 2_500_000, BlockKind.DECODE: 250_000}),
])
def test_cost_models_parse(text, expected):
    assert parse_cost(text).fixed_ns == expected


@pytest.mark.parametrize("text", ["fixed:encode=4ms", "fixed:encode=4s,decode=1ms", "cheap", "fixed:prefill=1ms"])
def test_bad_cost_models_are_refused(text):
    with pytest.raises(ValueError):
        parse_cost(text)


def test_cli_errors_are_clear_and_exit_2(tmp_path, capsys, moving_bag, tiny_model):
    assert main(["replay", str(tmp_path / "missing.mcap")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "junk.mcap").write_bytes(b"not a bag at all")
    assert main(["replay", str(tmp_path / "junk.mcap")]) == 2
    assert "junk.mcap" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["replay", str(moving_bag), "--policy", "fifo,lru"])
    assert "lru" in capsys.readouterr().err
    config = tmp_path / "c.yaml"
    config.write_text(f"reasoning:\n  ros__parameters:\n    model_dir: {tiny_model}\n    kv_capacity_tokens: 128\n"
                      "camera_subscriber:\n  ros__parameters:\n    frame_height: 48\n    frame_width: 64\n")
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
