"""``vla-edge replay --debug-frames``: the live node's debug image of every cycle, as PNG files or one MP4."""

from __future__ import annotations

import cv2
import pytest
from replay_inputs import replay_config_file, write_moving_bag

from vla_edge_ros.cli import main
from vla_edge_ros.runtime.debug_image import layout_for

LAYOUT = layout_for((48, 64), 640, "twist")  # replay_config_file's frames, the default width and command type


@pytest.fixture(scope="module")
def moving_bag(tmp_path_factory):
    return write_moving_bag(tmp_path_factory.mktemp("bags"))


def _config(tmp_path, tiny_model):
    """replay_config_file's, with a deadline a 47 ms cycle meets: frames arrive while it runs, and are dropped."""
    config = replay_config_file(tmp_path, tiny_model)
    config.write_text(config.read_text().replace("    backend: numpy\n", "    backend: numpy\n    deadline_ms: 100.0\n"))
    return config


def _cycles(decisions: str) -> list[int]:
    """The frame index of every line of a decisions file on which a cycle ran."""
    return [int(line.split()[0]) for line in decisions.splitlines() if line.split()[2] not in ("dropped", "bad_frame")]


def test_a_png_per_cycle_named_by_its_frame(tmp_path, moving_bag, tiny_model, capsys):
    config = _config(tmp_path, tiny_model)
    argv = ["replay", str(moving_bag), "--config", str(config), "--policy", "fifo,aura", "--out", str(tmp_path / "r")]
    assert main([*argv, "--cost", "fixed:encode=40ms,decode=1ms", "--debug-frames", str(tmp_path / "d")]) == 0
    for policy in ("fifo", "aura"):
        cycles = _cycles((tmp_path / "r" / f"decisions_{policy}.txt").read_text())
        assert 0 < len(cycles) < 60  # a 47 ms cycle: frames were dropped, and have no picture
        files = sorted((tmp_path / "d" / policy).iterdir())
        assert [f.name for f in files] == [f"frame_{index:06d}.png" for index in cycles]
        picture = cv2.imread(str(files[-1]))
        assert picture.shape == (LAYOUT.height, LAYOUT.width, 3)


def test_one_mp4_per_policy_in_step_with_the_camera(tmp_path, moving_bag, tiny_model, capsys):
    config = _config(tmp_path, tiny_model)
    out, pictures = tmp_path / "r", tmp_path / "d"
    assert main(["replay", str(moving_bag), "--config", str(config), "--policy", "dms", "--cost",
                 "fixed:encode=40ms,decode=1ms", "--out", str(out), "--debug-frames", str(pictures),
                 "--debug-video"]) == 0
    cycles = _cycles((out / "decisions_dms.txt").read_text())
    video = cv2.VideoCapture(str(pictures / "dms.mp4"))
    frames = 0
    while True:
        ok, frame = video.read()
        if not ok:
            break
        assert frame.shape == (LAYOUT.height, LAYOUT.width, 3)
        frames += 1
    assert frames == cycles[-1] - cycles[0] + 1 > len(cycles)  # a video frame per camera frame, gaps held


def test_debug_options_are_checked_before_any_work(tmp_path, moving_bag, capsys):
    taken = tmp_path / "taken"
    taken.write_text("a file")
    cases = [(["--debug-video"], "--debug-video needs --debug-frames DIR"),
             (["--debug-frames", str(tmp_path / "d"), "--realtime"], "--debug-frames cannot go with --realtime"),
             (["--debug-frames", str(taken)], f"--debug-frames {taken} exists and is not a directory")]
    for extra, message in cases:
        assert main(["replay", str(moving_bag), "--out", str(tmp_path / "r"), *extra]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith(f"vla-edge replay: error: {message}") and captured.err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
