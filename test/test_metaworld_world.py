"""Meta-World as a world (worlds/metaworld): seeded layouts, upright frames, the 4-D state and action, the
expert, and one line naming what to install where the extra or OSMesa is missing.

The tests that render need the ``metaworld`` extra and libOSMesa; without them they skip with the line a
user would get. MuJoCo is never imported here directly: the package must choose its GL back end first.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from vla_edge_ros import dependencies as deps
from vla_edge_ros.config import USER_ERRORS
from vla_edge_ros.worlds.metaworld import (DESCRIPTIONS, MT10, TASKS, ArmSpec, MetaWorldEnv, WorldUnavailable,
                                           check_goal_marker, clip_action)
from vla_edge_ros.worlds.metaworld import backend
from vla_edge_ros.worlds.metaworld.camera import CAMERAS, ROLLED
from vla_edge_ros.worlds.metaworld.spec import MAX_PATH_LENGTH

ROOT = Path(__file__).resolve().parents[1]


def loaded() -> backend.Backend:
    """The libraries, or a skip that says what to install."""
    try:
        return backend.load()
    except WorldUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def push() -> Iterator[MetaWorldEnv]:
    """One push-v3 environment at the defaults (corner2, 96 x 96), shared: each test resets it."""
    loaded()
    env = MetaWorldEnv(ArmSpec(), seed=0)
    yield env
    env.close()


# --- without the libraries -------------------------------------------------------------------------------


def test_every_mt10_task_has_a_description_and_the_descriptions_differ():
    assert set(MT10) <= set(TASKS) and len(MT10) == 10 and len(TASKS) == 50
    sentences = list(DESCRIPTIONS.values())
    assert len(set(sentences)) == len(sentences)
    assert all(s == s.strip().lower() and not s.endswith(".") and 2 <= len(s.split()) <= 14 for s in sentences)
    assert ArmSpec(task="push-v3").description == "push the puck to the goal"


@pytest.mark.parametrize("field, value, message", [
    ("task", "push-v2", "unknown Meta-World task 'push-v2'"),
    ("camera", "corner5", "camera: unknown camera 'corner5'"),
    ("width", 4, "width: need an int in [8, 2048]"),
    ("height", 96.0, "height: need an int in [8, 2048]"),
    ("max_steps", MAX_PATH_LENGTH + 1, "max_steps: need an int in [1, 500]"),
    ("max_steps", 0, "max_steps: need an int in [1, 500]"),
    ("goal_shown_s", -0.1, "goal_shown_s: need seconds >= 0"),
    ("goal_shown_s", float("nan"), "goal_shown_s: need seconds >= 0"),
])
def test_a_bad_spec_is_refused_naming_its_field_before_anything_is_imported(field, value, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ArmSpec(**{field: value}).validate()


def test_an_action_is_clipped_to_the_unit_box_and_a_nan_is_zero():
    executed = clip_action([2.0, -7.0, 0.25, float("nan")])
    assert executed.dtype == np.float32 and executed.tolist() == [1.0, -1.0, 0.25, 0.0]
    with pytest.raises(ValueError, match=r"action: need 4 values"):
        clip_action([0.0, 0.0, 0.0])


@pytest.mark.parametrize("hidden", ["metaworld", "mujoco", "OpenGL"])
def test_without_the_extra_the_error_is_one_line_naming_the_extra(hidden, monkeypatch):
    """As on a machine without it: the module cannot be imported (``None`` in sys.modules stops an import)."""
    monkeypatch.setattr(backend, "_loaded", None)
    monkeypatch.setitem(sys.modules, hidden, None)
    with pytest.raises(WorldUnavailable) as caught:
        MetaWorldEnv(ArmSpec(), seed=0)
    line = str(caught.value)
    assert line == str(deps.missing("metaworld", "Meta-World")) and "\n" not in line
    assert "'metaworld==3.1.1'" in line and "'PyOpenGL>=3.1'" in line and "the 'metaworld' extra" in line
    assert isinstance(caught.value, USER_ERRORS)  # the command line prints it as one line and exits 2


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("mujoco", "OpenGL", "metaworld")),
                    reason=str(deps.missing("metaworld", "Meta-World")))
def test_without_osmesa_the_error_is_one_line_naming_the_system_package():
    """A fresh process in which libOSMesa cannot be loaded, as PyOpenGL meets it on a machine without
    libosmesa6: every candidate file name fails to open."""
    script = (
        "import ctypes, sys\n"
        "_init = ctypes.CDLL.__init__\n"
        "def init(self, name, *args, **kwargs):\n"
        "    if name and 'OSMesa' in str(name):\n"
        "        raise OSError(f'{name}: cannot open shared object file: No such file or directory')\n"
        "    _init(self, name, *args, **kwargs)\n"
        "ctypes.CDLL.__init__ = init\n"
        "from vla_edge_ros.worlds.metaworld import ArmSpec, MetaWorldEnv, WorldUnavailable\n"
        "try:\n"
        "    MetaWorldEnv(ArmSpec(), seed=0)\n"
        "except WorldUnavailable as exc:\n"
        "    print(exc, file=sys.stderr)\n"
        "    sys.exit(2)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "OSMesa" in done.stderr and "apt-get install libosmesa6" in done.stderr


# --- with them ---------------------------------------------------------------------------------------------


def test_the_same_seed_poses_the_same_layout_and_first_frame_in_another_environment(push):
    first = push.reset(3)
    layout = push.observation
    with MetaWorldEnv(ArmSpec(), seed=3) as other:
        assert np.array_equal(other.observation, layout)
        assert np.array_equal(other.frame(), first)


def test_different_seeds_pose_different_objects_and_goals(push):
    layouts, frames = [], []
    for seed in range(5):
        frames.append(push.reset(seed))
        observation = push.observation
        layouts.append(np.concatenate([observation[4:7], observation[-3:]]))  # the puck, the goal
    for i in range(5):
        for j in range(i):
            assert np.abs(layouts[i] - layouts[j]).max() > 1e-3, (i, j)
            assert not np.array_equal(frames[i], frames[j]), (i, j)


def test_reset_replays_the_episode_after_steps(push):
    first = push.reset(1)
    observation = push.observation
    for _ in range(10):
        push.step([1.0, 0.5, -0.3, 1.0], render=False)
    assert not np.array_equal(push.observation, observation)
    assert np.array_equal(push.reset(), first) and push.seed == 1 and push.steps == 0
    assert np.array_equal(push.observation, observation)


def test_a_frame_is_uint8_rgb_of_the_spec_size():
    loaded()
    with MetaWorldEnv(ArmSpec(task="reach-v3", camera="topview", width=64, height=48), seed=0) as env:
        frame = env.frame()
        assert frame.shape == (48, 64, 3) and frame.dtype == np.uint8 and frame.flags.c_contiguous
        assert frame.std() > 10  # a scene, not a blank buffer
        assert np.array_equal(frame, env.raw_frame())  # topview is not rolled: drawn as MuJoCo renders it


def test_a_goal_shown_for_a_while_is_drawn_until_then_and_changes_nothing_else(push):
    """push-v3's green goal ball: in the frames of the first 0.3 s (24 steps) as always, then gone, the layout,
    the physics and the next episode's first frame untouched."""
    hidden = MetaWorldEnv(ArmSpec(goal_shown_s=0.3), seed=4)
    try:
        frames = {}
        for env in (push, hidden):
            frames[env] = [env.reset(4)]
            for _ in range(30):
                frames[env].append(env.step([0.3, 0.0, 0.0, 0.0]).frame)
        assert np.array_equal(push.observation, hidden.observation)
        for step in (0, 23):  # 23 steps are 0.2875 s
            assert np.array_equal(frames[push][step], frames[hidden][step]), step
        for step in (24, 30):
            changed = np.any(frames[push][step] != frames[hidden][step], axis=-1)
            assert 0 < changed.sum() < 40, step  # the ball alone: a few pixels of a 96 x 96 frame
            assert (frames[push][step][changed][:, 1] > frames[hidden][step][changed][:, 1]).mean() > 0.5  # green
        assert np.array_equal(hidden.reset(4), frames[push][0])  # drawn again from the next reset
    finally:
        hidden.close()
    with pytest.raises(ValueError, match="button-press-topdown-v3 draws no goal marker to hide"):
        MetaWorldEnv(ArmSpec(task="button-press-topdown-v3", goal_shown_s=0.3), seed=0)
    check_goal_marker(ArmSpec(task="push-v3", goal_shown_s=0.3))  # the check before a run: a marker to hide
    check_goal_marker(ArmSpec(task="button-press-topdown-v3"))  # nothing hidden, nothing to check
    with pytest.raises(ValueError, match="button-press-topdown-v3 draws no goal marker to hide"):
        check_goal_marker(ArmSpec(task="button-press-topdown-v3", goal_shown_s=0.3))


def test_the_corner_camera_is_turned_upright_by_half_a_turn_not_mirrored(push):
    """The rolled camera's frame is MuJoCo's rotated by 180 degrees. And it is upright: the hand raised
    moves up in the frame, and the hand moved along +x (to the right as corner2 looks at the table) moves
    right. MuJoCo's own render has both the other way round; a mirror (rows reversed only) would get the
    vertical right and the horizontal wrong."""
    assert "corner2" in ROLLED and set(ROLLED) < set(CAMERAS)
    push.reset(0)
    frame, raw = push.frame(), push.raw_frame()
    assert frame.shape == (96, 96, 3) and frame.dtype == np.uint8
    assert np.array_equal(frame, raw[::-1, ::-1]) and not np.array_equal(frame, raw)

    def arm(image: np.ndarray) -> np.ndarray:  # the Sawyer's red links
        rgb = image.astype(int)
        return (rgb[..., 0] > 100) & (rgb[..., 1] < 60) & (rgb[..., 2] < 60)

    def moved(before: np.ndarray, after: np.ndarray) -> np.ndarray:
        """(rows, columns) from where red went to where it came: the hand's motion in the image."""
        came, went = arm(after) & ~arm(before), arm(before) & ~arm(after)
        assert came.sum() > 20 and went.sum() > 20
        return np.mean(np.nonzero(came), axis=1) - np.mean(np.nonzero(went), axis=1)

    for action, axis, sign in (([0, 0, 1, 0], 0, -1), ([1, 0, 0, 0], 1, +1)):
        push.reset(0)
        before, before_raw = push.frame(), push.raw_frame()
        for _ in range(15):
            push.step(action, render=False)
        shift, shift_raw = moved(before, push.frame()), moved(before_raw, push.raw_frame())
        assert np.sign(shift[axis]) == sign and abs(shift[axis]) > 2, (action, shift)
        assert np.sign(shift_raw[axis]) == -sign, (action, shift_raw)


def test_the_cameras_named_are_the_scenes_and_the_rolled_ones_look_with_their_up_axis_down(push):
    model, data = push._env.model, push._env.data
    assert {model.camera(i).name for i in range(model.ncam)} == set(CAMERAS)
    for name in ROLLED:  # column 1 of a camera's frame is its image's up, in world coordinates
        assert data.cam_xmat[model.camera(name).id].reshape(3, 3)[2, 1] < 0, name
    assert MAX_PATH_LENGTH == push._env.max_path_length


def test_the_state_is_the_hand_and_the_gripper_and_the_step_reports_what_ran(push):
    push.reset(0)
    state = push.state
    assert state.shape == (4,) and state.dtype == np.float64
    assert np.array_equal(state, push.observation[:4]) and 0.0 <= state[3] <= 1.0
    outcome = push.step([0.0, 0.0, 1.0, 0.0])
    assert outcome.action.shape == (4,) and outcome.action.dtype == np.float32
    assert outcome.state.shape == (4,) and outcome.frame.shape == (96, 96, 3)
    assert outcome.steps == 1 and outcome.time_s == pytest.approx(1 / 80) and push.rate_hz == pytest.approx(80)
    assert outcome.state[2] > state[2]  # raised
    assert push.step([0.0, 0.0, 0.0, 0.0], render=False).frame is None
    for _ in range(10):
        closing = push.step([0.0, 0.0, 0.0, 1.0], render=False)
    assert closing.state[3] < state[3] - 0.2  # a positive grip closes the fingers


def test_an_action_outside_the_box_moves_the_arm_as_the_clipped_action_does(push):
    wild, clipped = [5.0, -3.0, float("nan"), 9.0], [1.0, -1.0, 0.0, 1.0]
    push.reset(2)
    runs = []
    for action in (wild, clipped):
        push.reset()
        for _ in range(8):
            outcome = push.step(action, render=False)
        assert outcome.action.tolist() == clipped
        runs.append(push.observation)
    assert np.array_equal(runs[0], runs[1])
    push.reset()
    for _ in range(8):
        push.step([0.5, -0.5, 0.0, 0.5], render=False)
    assert not np.allclose(push.observation, runs[0])  # the clip did change something


def test_the_scripted_expert_pushes_the_puck_to_the_goal_and_the_episode_ends_there(push):
    push.reset(0)
    assert push.description == "push the puck to the goal" and not push.success
    before = push.observation.copy()
    while not push.done:
        action = push.expert_action()
        assert action.dtype == np.float32 and np.all(np.abs(action) <= 1.0)
        outcome = push.step(action, render=False)
    assert push.success and outcome.success and outcome.done
    assert outcome.steps < 150, outcome.steps  # issue 26 measured about 60-70
    assert np.linalg.norm(push.observation[4:7] - before[4:7]) > 0.05  # the puck moved


def test_the_episode_ends_at_its_step_limit():
    loaded()
    with MetaWorldEnv(ArmSpec(task="reach-v3", max_steps=3), seed=0) as env:
        outcomes = [env.step([0.0, 0.0, 0.0, 0.0], render=False) for _ in range(3)]
        assert [o.done for o in outcomes] == [False, False, True] and env.done
        with pytest.raises(RuntimeError, match="limit of 3 steps: reset it"):
            env.step([0.0, 0.0, 0.0, 0.0])
        env.reset()
        assert not env.done


@pytest.mark.slow
@pytest.mark.parametrize("task", MT10)
def test_every_mt10_task_renders_and_its_expert_succeeds(task):
    """About a second a task: the models, the seeded layouts and the experts of all ten MT10 tasks."""
    loaded()
    with MetaWorldEnv(ArmSpec(task=task), seed=0) as env:
        for seed in (0, 1):
            first = env.reset(seed)
            assert first.shape == (96, 96, 3) and first.std() > 10
            while not env.done:
                env.step(env.expert_action(), render=False)
            assert env.success, (task, seed, env.steps)
