"""An arena too small is blamed on the knob to change, with the value it needs; `vla-edge plan` refuses
what `vla-edge run` refuses, with the same line.

The shipped model (models/sim): a 6-token prompt, 16-token frames, a linear action head (no action
tokens in the arena), so one frame needs 22 slots.
"""

from __future__ import annotations

import pytest
import yaml

from vla_edge_ros.cli import main
from vla_edge_ros.config import load_settings
from vla_edge_ros.runtime.loader import load_engine

ONE_FRAME = "the prompt (6 tokens), one frame (16) and the action tokens (0)"


def _config(tmp_path, **params):
    path = tmp_path / "robot.yaml"
    path.write_text(yaml.safe_dump({"reasoning": {"ros__parameters": {"backend": "numpy", **params}}}))
    return path


@pytest.mark.parametrize("params, message", [
    ({"kv_capacity_tokens": 8}, f"kv_capacity_tokens=8 must be at least 22: the arena holds {ONE_FRAME}"),
    ({"kv_capacity_tokens": 8, "kv": {"cosine": {"protect_recent_frames": 0}}},
     f"kv_capacity_tokens=8 must be at least 22: the arena holds {ONE_FRAME}"),
    ({"kv_capacity_tokens": 22, "kv": {"cosine": {"protect_recent_frames": 0}}},  # aura may be switched to live
     "kv_capacity_tokens=22 must be at least 23: the arena holds the prompt (6 tokens), aura's memory token (1), "
     "one frame (16) and the action tokens (0)"),
    ({"kv_capacity_tokens": 24},
     "kv.cosine.protect_recent_frames=4 must be in [0, 0]: the arena holds 1 frames and one must stay evictable "
     "(or kv_capacity_tokens at least 86)"),
    ({"kv_capacity_tokens": 24, "kv": {"cosine": {"protect_recent_frames": 0}}},
     "kv.dms.window=32 must be in [1, 2]: the 24-slot arena holds the prompt (6), the window, one frame (16) and "
     "the action tokens (0) (or kv_capacity_tokens at least 54)"),
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
    """At 22 slots one frame fills the arena: no window of dms's fits, whatever kv.dms.window says."""
    path = _config(tmp_path, kv_capacity_tokens=22, kv={"policy": "dms"})
    with pytest.raises(ValueError, match=r"reasoning: kv_capacity_tokens=22 must be at least 54: the arena holds the "
                                         r"prompt \(6 tokens\), kv.dms.window \(32\), one frame \(16\) and the action "
                                         r"tokens \(0\)$"):
        load_engine(load_settings(path), policies=("dms",))


def test_the_capacity_a_message_names_is_enough(tmp_path, capsys):
    """85 slots hold 4 frames beside the prompt, too few for cosine's 4 protected ones and one more; the 86
    the message asks for pass the plan and build the engine."""
    path = _config(tmp_path, kv_capacity_tokens=85)
    with pytest.raises(ValueError, match=r"protect_recent_frames=4 must be in \[0, 3\]: .* \(or kv_capacity_tokens "
                                         r"at least 86\)$"):
        load_engine(load_settings(path))
    path = _config(tmp_path, kv_capacity_tokens=86)
    assert main(["plan", "--config", str(path)]) == 0
    assert "kv arena" in capsys.readouterr().out
    assert load_engine(load_settings(path)).engine.arena.capacity == 86
