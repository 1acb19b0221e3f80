"""An arena too small is blamed on the knob to change, with the value it needs; `vla-edge plan` refuses
what `vla-edge run` refuses, with the same line.

The shipped model (models/sim) with a 6-token prompt (``prompt_token_ids``, and no room kept for a longer
instruction: ``instruction_max_tokens`` 6), its 17-token observations (16 frame tokens and the odometry's) and
its mlp chunk head (no action tokens in the arena): one observation needs 23 slots.
"""

from __future__ import annotations

import pytest
import yaml

from vla_edge_ros.cli import main
from vla_edge_ros.config import load_settings
from vla_edge_ros.runtime.loader import load_engine

ONE_FRAME = "the prompt (6 tokens), one frame (17) and the action tokens (0)"


def _config(tmp_path, **params):
    path = tmp_path / "robot.yaml"
    reasoning = {"backend": "numpy", "prompt_token_ids": [151, 9, 402, 77, 1030, 12], "instruction_max_tokens": 6}
    path.write_text(yaml.safe_dump({
        "camera_subscriber": {"ros__parameters": {"state_topic": "odom", "state_type": "odometry"}},
        "reasoning": {"ros__parameters": {**reasoning, **params}}}))
    return path


@pytest.mark.parametrize("params, message", [
    ({"kv_capacity_tokens": 8}, f"kv_capacity_tokens=8 must be at least 23: the arena holds {ONE_FRAME}"),
    ({"kv_capacity_tokens": 8, "kv": {"cosine": {"protect_recent_frames": 0}}},
     f"kv_capacity_tokens=8 must be at least 23: the arena holds {ONE_FRAME}"),
    ({"kv_capacity_tokens": 23, "kv": {"cosine": {"protect_recent_frames": 0}}},  # aura may be switched to live
     "kv_capacity_tokens=23 must be at least 24: the arena holds the prompt (6 tokens), aura's memory token (1), "
     "one frame (17) and the action tokens (0)"),
    ({"kv_capacity_tokens": 24},
     "kv.cosine.protect_recent_frames=4 must be in [0, 0]: the arena holds 1 frames and one must stay evictable "
     "(or kv_capacity_tokens at least 91)"),
    ({"kv_capacity_tokens": 24, "kv": {"cosine": {"protect_recent_frames": 0}}},
     "kv.dms.window=32 must be in [1, 1]: the 24-slot arena holds the prompt (6), the window, one frame (17) and "
     "the action tokens (0) (or kv_capacity_tokens at least 55)"),
    ({"prompt_token_ids": [1, 4096]}, "reasoning.prompt_token_ids has ids >= vocab_size 2048"),
])
def test_plan_refuses_with_the_line_run_refuses_with(tmp_path, capsys, params, message):
    path = _config(tmp_path, **params)
    prefix = "" if "vocab_size" in message else "reasoning: "
    with pytest.raises(ValueError) as info:
        load_engine(load_settings(path))  # what `vla-edge run` (and the ROS bringup) start with
    assert str(info.value) == f"{path}: {prefix}{message}"
    assert main(["plan", "--config", str(path)]) == 2
    assert capsys.readouterr().err == f"vla-edge plan: error: {path}: {prefix}{message}\n"


def test_a_dms_window_no_arena_of_this_size_could_hold_blames_kv_capacity_tokens(tmp_path):
    """At 23 slots one frame fills the arena: no window of dms's fits, whatever kv.dms.window says."""
    path = _config(tmp_path, kv_capacity_tokens=23, kv={"policy": "dms"})
    with pytest.raises(ValueError, match=r"reasoning: kv_capacity_tokens=23 must be at least 55: the arena holds the "
                                         r"prompt \(6 tokens\), kv.dms.window \(32\), one frame \(17\) and the action "
                                         r"tokens \(0\)$"):
        load_engine(load_settings(path), policies=("dms",))


def test_the_capacity_a_message_names_is_enough(tmp_path, capsys):
    """85 slots hold 4 frames beside the prompt, too few for cosine's 4 protected ones and one more; the 91
    the message asks for pass the plan and build the engine."""
    path = _config(tmp_path, kv_capacity_tokens=85)
    with pytest.raises(ValueError, match=r"protect_recent_frames=4 must be in \[0, 3\]: .* \(or kv_capacity_tokens "
                                         r"at least 91\)$"):
        load_engine(load_settings(path))
    path = _config(tmp_path, kv_capacity_tokens=91)
    assert main(["plan", "--config", str(path)]) == 0
    assert "kv arena" in capsys.readouterr().out
    assert load_engine(load_settings(path)).engine.arena.capacity == 91
