"""Training on Meta-World: a recipe phase with ``world: metaworld`` records the scripted experts' demonstrations
(each frame labelled with the expert's plan from the state it shows), trains the 4-D chunk head with the arm's
state token and the task's description as the instruction, and writes a checkpoint ``vla-edge evaluate --task
metaworld/...`` drives the arm with; ``blind`` makes the state-only baseline in the same format.

The recipe's rules need nothing installed; the rest needs the ``metaworld`` extra and libOSMesa and skips with
the line a user would get without them. Everything stays small: 32 x 32 frames, a few short demonstrations, a
few optimiser steps.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from vla_edge_ros.cli import main
from vla_edge_ros.config import ConfigError
from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.memory import FifoPolicy
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.memory_tensors import check_aura
from vla_edge_ros.model.init_model import AURA_DIM, preset
from vla_edge_ros.train.arm_demos import (ArmEpisode, ArmRecorder, PlanLabeller, arm_episode, arm_episodes,
                                          arm_state_statistics, episodes_identity, pieces)
from vla_edge_ros.train.demos import Demo, load_demo, sample_frames
from vla_edge_ros.train.recipe import load_recipe
from vla_edge_ros.train.spec import MetaWorldSpec, TrainSpec
from vla_edge_ros.train.stages import dagger
from vla_edge_ros.train.torch_model import VlaModel
from vla_edge_ros.train.trainer import phase_config, train
from vla_edge_ros.worlds.metaworld import MT10, ArmSpec, MetaWorldEnv, WorldUnavailable, backend
from train_runs import assert_resume_keeps

pytestmark = pytest.mark.train
ROOT = Path(__file__).resolve().parents[1]
TASKS = ("reach-v3", "push-v3")
SMALL = {"world": "metaworld", "tasks": list(TASKS), "episodes": 4, "state": True, "head": "mlp", "chunk": 4,
         "mlp_hidden": 32, "image_size": 32, "stages": ["perception", "bc"],
         "perception": {"steps": 3, "batch": 8}, "bc": {"steps": 3, "batch": 2, "max_frames": 8}}


def loaded() -> None:
    """The libraries, or a skip that says what to install."""
    try:
        backend.load()
    except WorldUnavailable as exc:
        pytest.skip(str(exc))


def _recipe(path: Path, **knobs) -> Path:
    path.write_text(yaml.safe_dump({"phases": [{"name": "arm", **knobs}]}))
    return path


# --- the recipe's rules: nothing installed ------------------------------------------------------------------------


@pytest.mark.parametrize("knobs, message", [
    ({"world": "metaworld", "stages": ["bc"]}, r"tasks: \['reach', 'cue-reach'\] are not the metaworld world's; .*"
                                               r"MT10's reach-v3, push-v3"),
    ({"world": "metaworld", "tasks": ["reach-v3"]}, r"stages: \['aura', 'dms'\] learn a memory task; .* and aura where "
                                                    r"metaworld.goal_shown_s hides the goal"),
    ({**SMALL, "stages": ["bc", "dms"], "metaworld": {"goal_shown_s": 0.3}}, r"stages: \['dms'\] learn a memory task"),
    ({**SMALL, "metaworld": {"goal_shown_s": -0.1}}, "metaworld.goal_shown_s"),
    ({"metaworld": {"goal_shown_s": 0.3}}, "metaworld: its knobs are for world: metaworld"),
    ({**SMALL, "stages": ["bc", "aura"], "episodes": 32, "metaworld": {"goal_shown_s": 0.3}, "aura": {"tasks": ["reach"]}},
     r"aura.tasks: the aura episodes are drawn from the phase's demonstrations"),
    ({"world": "metaworld", "tasks": ["reach-v3"], "stages": ["bc"], "instructions": ["go {color}"]},
     "instructions: the metaworld world's instruction is each task's description"),
    ({"tasks": ["reach-v3"]}, r"tasks: \['reach-v3'\] are not the sim world's"),
    ({"metaworld": {"noise": 0.1}}, "metaworld: its knobs are for world: metaworld"),
    ({"blind": True}, r"blind: a model that sees no frames needs the robot's state \(state: true\)"),
    ({"image_size": 66}, "image_size: a frame is cut into 4 x 4 patches"),
    ({**SMALL, "metaworld": {"camera": "topdown"}}, "metaworld.camera"),
    ({"dagger": {"max_steps": 100}}, "dagger.max_steps: the 2-D world's episodes end at their task's time limit"),
    ({**SMALL, "dagger": {"batch": 8, "episodes": 3}}, "cannot fill half a batch of 8"),
    ({**SMALL, "dagger": {"cost": "measured"}}, "dagger.cost: the collected episodes run on a fixed cost model"),
    ({**SMALL, "dagger": {"cost": "fixed:encode=8ms"}}, "fixed cost model lacks decode"),
])
def test_a_metaworld_phase_is_refused_in_one_line_naming_the_key(tmp_path, knobs, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(_recipe(tmp_path / "r.yaml", **knobs))


def test_a_metaworld_phase_trains_the_arms_action_and_the_2d_world_is_as_it_was(tmp_path):
    spec = load_recipe(_recipe(tmp_path / "r.yaml", **SMALL, metaworld={"camera": "corner3", "noise": 0.1})).phases[0].spec
    assert (spec.world, spec.tasks, spec.metaworld.camera, spec.metaworld.noise) == ("metaworld", TASKS, "corner3", 0.1)
    episodes = arm_episodes(spec)
    assert [(e.task, e.seed) for e in episodes] == [(TASKS[i % 2], 10**6 + i) for i in range(4)]  # never evaluate's
    assert {(e.camera, e.image_size, e.chunk, e.noise, e.render) for e in episodes} == {("corner3", 32, 4, 0.1, True)}
    assert not any(e.render for e in arm_episodes(replace(spec, blind=True)))  # the baseline draws nothing
    config = phase_config(replace(spec, state=False))
    assert (config.action.dof, config.action.chunk, config.vision.image_size, config.vision.patch_size) == (4, 4, 32, 8)
    assert phase_config(TrainSpec()) == preset("sim")  # the 2-D world's model is untouched by the new knobs


def test_a_phase_that_hides_the_goal_trains_the_aura_memory_on_episodes_that_hide_it(tmp_path):
    """The memory variant's training: with ``metaworld.goal_shown_s`` the aura stage is the arm's too, on the arm's
    tasks, and every demonstration (and collected episode) hides the goal as ``evaluate --goal-shown-s`` does."""
    spec = load_recipe(_recipe(tmp_path / "r.yaml", **SMALL | {"stages": ["bc", "aura"]}, metaworld={"goal_shown_s": 0.3},
                               aura={"tasks": ["push-v3"], "batch": 2, "bc_batch": 2})).phases[0].spec
    assert spec.stages == ("bc", "aura") and spec.aura.tasks == ("push-v3",)
    assert {e.goal_shown_s for e in arm_episodes(spec)} == {0.3}
    assert arm_episode(spec, 0, 5, noise=0.0, tasks=spec.aura.tasks).task == "push-v3"
    drawn = replace(spec, stages=("bc",), metaworld=MetaWorldSpec())
    assert {e.goal_shown_s for e in arm_episodes(drawn)} == {None}
    assert episodes_identity(arm_episodes(spec)) != episodes_identity(arm_episodes(drawn))  # never resumed as one


def test_a_dagger_phase_resolves_its_configuration_against_the_recipe_then_the_package(tmp_path):
    (tmp_path / "mine.yaml").write_text("{}\n")
    dagger_phase = {**SMALL, "stages": ["perception", "bc", "dagger"]}
    mine = load_recipe(_recipe(tmp_path / "r.yaml", **dagger_phase, dagger={"config": "mine.yaml"})).phases[0].spec
    shipped = load_recipe(_recipe(tmp_path / "s.yaml", **dagger_phase)).phases[0].spec
    assert mine.dagger.config == str(tmp_path / "mine.yaml")
    assert shipped.dagger.config == str(ROOT / "config" / "metaworld.yaml")


def test_a_missing_dagger_configuration_is_refused_before_anything_is_recorded(tmp_path, capsys):
    recipe = _recipe(tmp_path / "r.yaml", **SMALL | {"stages": ["perception", "bc", "dagger"]},
                     dagger={"config": "absent.yaml"})
    assert main(["train", "--recipe", str(recipe), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "absent.yaml" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_the_dagger_stage_collects_with_the_weights_of_the_time_and_trains_on_half_its_own():
    """Two collections over four steps: the first before any step, the second after two, each seeing the weights
    as they were then; every batch after a collection holds its episodes beside demonstrations."""
    spec = TrainSpec(world="metaworld", tasks=TASKS, episodes=4, head="mlp", chunk=4, mlp_hidden=32, image_size=32,
                     stages=("perception", "bc", "dagger"))
    torch.manual_seed(0)
    model = VlaModel(phase_config(spec), AURA_DIM)
    rng = np.random.default_rng(0)

    def demo(task: str, value: float) -> Demo:
        frames = np.full((6, 32, 32, 3), int(abs(value) * 255), np.uint8)
        return Demo(task, frames, np.full((6, 4, 4), value, np.float32), np.zeros((6, 4), np.float32), 6, True,
                    np.zeros((6, 4), np.float32), (1, 2))

    seen: list[tuple[int, torch.Tensor]] = []

    def collect(round_: int) -> list[Demo]:
        seen.append((round_, model.action_head.state_dict()[next(iter(model.action_head.state_dict()))].clone()))
        return [demo("push-v3", -0.5)]

    losses: list[float] = []
    dagger(model, [demo("reach-v3", 0.5)] * 2, replace(spec.dagger, steps=4, batch=2, rounds=2, episodes=1), rng,
           collect, lambda step, figures: losses.append(figures["action"]))
    assert [round_ for round_, _ in seen] == [0, 1] and len(losses) == 4
    assert not torch.equal(seen[0][1], seen[1][1])  # the second collection drove the weights two steps on


def test_a_driven_episode_is_cut_into_pieces_that_keep_every_frame_in_order():
    frames = np.arange(300).reshape(300, 1, 1, 1).astype(np.uint8) * np.ones((1, 2, 2, 3), np.uint8)
    demo = Demo("push-v3", frames, np.zeros((300, 4, 4), np.float32), np.zeros((300, 4), np.float32), 300, False,
                np.arange(300 * 4, dtype=np.float32).reshape(300, 4), (3,))
    cut = pieces(demo, 128)
    assert [len(piece.frames) for piece in cut] == [128, 128, 44]
    assert all(piece.cue_frames == len(piece.frames) and piece.prompt == (3,) and not piece.success for piece in cut)
    hidden = pieces(replace(demo, cue_frames=130), 128)  # the goal drawn in the first 130 frames only
    assert [piece.cue_frames for piece in hidden] == [128, 2, 0]
    rng = np.random.default_rng(0)
    for _ in range(200):  # a piece without a cue frame is sampled as any other
        picked = sample_frames(hidden[2], rng, max_frames=16)
        assert picked.size and picked.max() < 44 and np.all(np.diff(picked) > 0)
    np.testing.assert_array_equal(np.concatenate([piece.states for piece in cut]), demo.states)
    np.testing.assert_array_equal(np.concatenate([piece.frames for piece in cut]), demo.frames)


def test_the_mt10_recipes_are_one_phase_the_baseline_blind_on_the_same_demonstrations():
    """models/metaworld: the camera policy and the state-only baseline differ in nothing but ``blind``, the
    stages' lengths (the baseline keeps those it was measured at, the camera recipe's first ones) and the camera
    policy's dagger stage, so they learn from the same demonstrations (seeds, noise, labels)."""
    shipped = ROOT / "models" / "metaworld"
    (camera,), (baseline,) = (load_recipe(shipped / name).phases for name in ("recipe.yaml", "state-only.yaml"))
    assert camera.spec.tasks == MT10 and camera.spec.stages == ("perception", "bc", "dagger") and not camera.spec.blind
    assert baseline.spec.stages == ("perception", "bc")
    assert baseline.spec.perception.steps <= camera.spec.perception.steps
    assert baseline.spec.bc.steps <= camera.spec.bc.steps
    lengths = {"perception": replace(baseline.spec.perception, steps=camera.spec.perception.steps),
               "bc": replace(baseline.spec.bc, steps=camera.spec.bc.steps)}
    assert replace(baseline.spec, blind=False, stages=camera.spec.stages, dagger=camera.spec.dagger,
                   **lengths) == camera.spec and baseline.spec.blind
    assert [(e.task, e.seed, e.noise) for e in arm_episodes(baseline.spec)] == \
        [(e.task, e.seed, e.noise) for e in arm_episodes(camera.spec)]


def test_the_memory_recipe_starts_from_the_mt10_policy_and_hides_the_goal_as_evaluation_does():
    """models/metaworld-memory: one phase from models/metaworld with the same model (so its weights load), on
    reach-v3 and push-v3 with the goal shown for 0.3 s, bc then aura; its demonstrations are neither an
    evaluation's (seeds from 0) nor the MT10 recipe's, and its checkpoint carries aura's learned write gate."""
    (memory,), (mt10,) = (load_recipe(ROOT / "models" / name / "recipe.yaml").phases
                          for name in ("metaworld-memory", "metaworld"))
    spec = memory.spec
    assert Path(spec.init_from).resolve() == ROOT / "models" / "metaworld"
    assert spec.tasks == TASKS and spec.stages == ("bc", "aura") and spec.metaworld.goal_shown_s == 0.3
    seeds = {e.seed for e in arm_episodes(spec)}
    assert min(seeds) >= 1000 and not seeds & {e.seed for e in arm_episodes(mt10.spec)}
    checkpoint, started_from = (load_checkpoint(ROOT / "models" / name) for name in ("metaworld-memory", "metaworld"))
    assert checkpoint.config == started_from.config  # the same model, state statistics included
    assert check_aura(checkpoint)[1]


# --- with Meta-World -------------------------------------------------------------------------------------------


def test_the_experts_plan_is_what_it_goes_on_to_execute_and_leaves_the_episode_as_it_was():
    loaded()
    with MetaWorldEnv(ArmSpec(task="push-v3", max_steps=40), seed=10**6) as env:
        plans, executed = [], []
        for _ in range(30):
            before = env.observation, env.state, env.steps
            plans.append(env.expert_plan(6))
            assert np.array_equal(env.observation, before[0]) and env.steps == before[2]
            executed.append(env.step(env.expert_action(), render=False).action)
        for _ in range(5):
            executed.append(env.step(env.expert_action(), render=False).action)
        for i, plan in enumerate(plans):
            np.testing.assert_allclose(plan, executed[i:i + 6], atol=1e-6)
        assert env.steps == 35 and len(env.expert_plan(6)) == 6  # its last action at the limit, step 40
        with pytest.raises(ValueError, match="run past the episode's limit of 40 steps"):
            env.expert_plan(7)


def test_a_demonstration_is_labelled_with_the_plan_and_depends_on_its_episode_alone():
    loaded()
    recorder = ArmRecorder()
    try:
        plain = recorder.record(ArmEpisode("reach-v3", 10**6, image_size=32, chunk=4))
        noisy = recorder.record(ArmEpisode("reach-v3", 10**6, image_size=32, chunk=4, noise=0.1))
        blind = recorder.record(ArmEpisode("reach-v3", 10**6, image_size=32, chunk=4, noise=0.1, render=False))
        again = ArmRecorder().record(ArmEpisode("reach-v3", 10**6, image_size=32, chunk=4, noise=0.1))
    finally:
        recorder.close()
    assert plain.success and noisy.success and plain.frames.shape[1:] == (32, 32, 3)
    assert plain.chunks.shape == (len(plain.frames), 4, 4) and plain.states.shape == (len(plain.frames), 4)
    # on the expert's own path a frame's plan is what the next frames' expert does
    np.testing.assert_array_equal(plain.chunks[1:, 0], plain.chunks[:-1, 1])
    assert not np.array_equal(noisy.states, plain.states[:len(noisy.states)])  # noise moves the arm off that path
    for got in (blind, again):  # the same episode, drawn or not, in a fresh recorder or not
        np.testing.assert_array_equal(got.states, noisy.states)
        np.testing.assert_array_equal(got.chunks, noisy.chunks)
    np.testing.assert_array_equal(again.frames, noisy.frames)
    assert not blind.frames.any() and noisy.frames.any()
    assert 0.0 < noisy.where.min() and noisy.where.max() < 1.0  # the object and goal on the table, mapped


def test_train_on_two_tasks_with_workers_and_evaluate_the_checkpoint_on_the_arm(tmp_path, capsys):
    """The smoke run of the issue: two tasks, four short demonstrations on two worker processes, a few steps of
    perception and bc; then ``vla-edge evaluate`` runs it on reach-v3 (it must run, not succeed)."""
    loaded()
    out = tmp_path / "arm"
    recipe = _recipe(tmp_path / "r.yaml", **SMALL, metaworld={"noise": 0.1})
    assert main(["train", "--recipe", str(recipe), "--out", str(out), "--workers", "2", "--quiet"]) == 0
    config = json.loads((out / "config.json").read_text())["vla"]
    assert config["action"] | {"q01": [], "q99": []} == {"head": "mlp", "dof": 4, "q01": [], "q99": [],
                                                          "normalize_mask": [], "chunk": 4, "mlp_hidden": 32}
    demos = [load_demo(path) for path in sorted((out / "demos").glob("arm-*.npz"))]
    assert sorted(demo.task for demo in demos) == sorted(TASKS * 2)
    statistics = arm_state_statistics(demos)  # the state token's normalisation: the demonstrations'
    np.testing.assert_allclose(config["state"]["mean"], statistics.mean)
    np.testing.assert_allclose(config["state"]["std"], statistics.std)
    assert (out / "tokenizer.json").is_file()
    log = json.loads((out / "train_log.json").read_text())["phases"][0]
    assert log["demos"]["episodes"] == 4 and log["demos"]["expert_success"] == 1.0
    assert sorted(log["losses"]) == ["bc", "perception"] and log["spec"]["world"] == "metaworld"
    settings = tmp_path / "arm.yaml"
    settings.write_text(yaml.safe_dump({"reasoning": {"ros__parameters": {"model_dir": str(out), "backend": "numpy"}}}))
    capsys.readouterr()
    assert main(["evaluate", "--config", str(settings), "--task", "metaworld/reach-v3", "--episodes", "1",
                 "--max-steps", "20", "--cost", "fixed:encode=8ms,decode=1ms", "--out", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "evaluate.json").read_text())
    policy = [cell for cell in report["tasks"][0]["cells"] if cell["variant"] == "fifo"][0]
    assert policy["episodes"] == 1 and policy["invalid"] == 0
    assert not any("prompt_token_ids" in note for note in report["tasks"][0]["notes"])  # it reads the description


def test_a_demonstration_that_hides_the_goal_counts_the_frames_that_show_it():
    """push-v3 with its goal ball drawn for 0.3 s: the first 24 frames (80 Hz) are the plain demonstration's and
    are its cue frames, later frames lack the ball, and the arm's path and labels are unchanged."""
    loaded()
    recorder = ArmRecorder()
    try:
        plain = recorder.record(ArmEpisode("push-v3", 10**6, image_size=96, chunk=4))
        hidden = recorder.record(ArmEpisode("push-v3", 10**6, image_size=96, chunk=4, goal_shown_s=0.3))
    finally:
        recorder.close()
    assert plain.cue_frames == len(plain.frames) > 30 and hidden.cue_frames == 24
    np.testing.assert_array_equal(hidden.frames[:24], plain.frames[:24])
    assert all(np.any(hidden.frames[i] != plain.frames[i]) for i in (24, 30))
    np.testing.assert_array_equal(hidden.states, plain.states)
    np.testing.assert_array_equal(hidden.chunks, plain.chunks)


def _aura_phase(tmp_path: Path, phase: dict | None = None, **aura) -> Path:
    """A small recipe whose phase trains bc, then the aura memory with the decoder on push-v3 with the goal ball
    drawn for 0.3 s only (``phase``: more of the phase's keys)."""
    return _recipe(tmp_path / "r.yaml", **SMALL | {"stages": ["bc", "aura"], "tasks": ["push-v3"], "episodes": 2},
                   **(phase or {}), metaworld={"goal_shown_s": 0.3},
                   aura={"steps": 2, "batch": 2, "max_frames": 8, "max_stride": 4, "cue_writes": True,
                         "memory_goal": 1.0, "memory_warmup": 2, "train_decoder": True, "bc_batch": 2, **aura})


def test_an_aura_phase_on_the_hidden_goal_writes_a_memory_the_arm_is_evaluated_with(tmp_path, capsys):
    """The memory variant end to end, small: the phase writes aura's tensors (its learned gate among them), and
    ``vla-edge evaluate --goal-shown-s 0.3 --policy aura`` drives push-v3 with them (it must run, not succeed)."""
    loaded()
    out = tmp_path / "arm"
    assert main(["train", "--recipe", str(_aura_phase(tmp_path)), "--out", str(out), "--quiet"]) == 0
    log = json.loads((out / "train_log.json").read_text())["phases"][0]
    assert sorted(log["losses"]) == ["aura", "bc"] and log["losses"]["aura"]["steps"] == 4  # warm-up + steps
    assert check_aura(load_checkpoint(out))[1]  # a learned write gate
    assert all(load_demo(path).cue_frames == 24 for path in (out / "demos").glob("arm-*.npz"))
    settings = tmp_path / "arm.yaml"
    settings.write_text(yaml.safe_dump({"reasoning": {"ros__parameters": {"model_dir": str(out), "backend": "numpy"}}}))
    capsys.readouterr()
    assert main(["evaluate", "--config", str(settings), "--task", "metaworld/push-v3", "--goal-shown-s", "0.3",
                 "--policy", "aura", "--episodes", "1", "--max-steps", "30", "--cost", "fixed:encode=8ms,decode=1ms",
                 "--out", str(tmp_path / "eval")]) == 0
    cells = json.loads((tmp_path / "eval" / "evaluate.json").read_text())["tasks"][0]["cells"]
    aura = [cell for cell in cells if cell["variant"] == "aura"][0]
    assert aura["episodes"] == 1 and aura["invalid"] == 0 and aura["memory_frames"] > 0


def test_a_phase_hiding_a_goal_a_task_does_not_draw_is_refused_before_anything_is_recorded(tmp_path, capsys):
    loaded()
    recipe = _recipe(tmp_path / "r.yaml", **SMALL | {"stages": ["bc"], "tasks": ["button-press-topdown-v3"]},
                     metaworld={"goal_shown_s": 0.3})
    assert main(["train", "--recipe", str(recipe), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "button-press-topdown-v3 draws no goal marker to hide" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # about a minute: the runtime drives the arm with the aura memory, two worker processes
def test_an_aura_phase_collects_its_own_hidden_goal_episodes_through_the_runtime(tmp_path):
    """aura's DAgger on the arm: the collected episodes hide the goal as the demonstrations do (24 cue frames, or
    all of them when an episode is shorter), driven with the aura memory of the weights of the time."""
    loaded()
    out = tmp_path / "arm"
    recipe = _aura_phase(tmp_path, {"dagger": {"max_steps": 40}}, dagger_episodes=2, dagger_rounds=1)
    assert main(["train", "--recipe", str(recipe), "--out", str(out), "--workers", "2", "--quiet"]) == 0
    log = json.loads((out / "train_log.json").read_text())["phases"][0]
    assert [(r["round"], r["episodes"], r["stage"]) for r in log["dagger"]] == [(0, 2, "aura")]
    driven = sorted((out / "demos").glob("arm-aura0-*.npz"))
    assert len(driven) == 2
    for path in driven:
        demo = load_demo(path)
        assert demo.cue_frames == min(24, len(demo.frames)) and len(demo.frames) == 37  # plans of 4 within 40 steps


@pytest.mark.parametrize("goal_shown_s", [None, 0.3])
def test_a_step_the_expert_drives_is_labelled_as_its_demonstration_is(goal_shown_s):
    """``PlanLabeller`` on an episode the expert itself drives records what ``ArmRecorder`` does for it: the same
    frames, states, object positions, plans (on the expert's path a plan is what it goes on to execute) and cue
    frames."""
    loaded()
    episode = ArmEpisode("reach-v3", 10**6, image_size=32, chunk=4, goal_shown_s=goal_shown_s)
    recorder = ArmRecorder()
    try:
        recorded = recorder.record(episode)
    finally:
        recorder.close()
    labeller = PlanLabeller(episode)
    with MetaWorldEnv(ArmSpec(task="reach-v3", goal_shown_s=goal_shown_s), seed=0) as env:
        env.reset(episode.seed)
        while not env.success:
            labeller.see(env)
            env.step(env.expert_action(), render=False)
        labelled = labeller.demo(env.success)
    assert labelled.success and len(labelled.frames) == len(recorded.frames)
    assert labelled.cue_frames == recorded.cue_frames == (len(recorded.frames) if goal_shown_s is None else 24)
    for name in ("frames", "states", "where"):
        np.testing.assert_array_equal(getattr(labelled, name), getattr(recorded, name))
    np.testing.assert_allclose(labelled.chunks, recorded.chunks, atol=1e-6)


@pytest.mark.slow  # 30-60 s: two trainings with worker processes; the parts are tested alone in the default tier
def test_a_dagger_phase_drives_the_arm_with_its_own_weights_and_resumes_them(tmp_path):
    """Two collections of two episodes each, the runtime driving the arm with the phase's weights of the time on two
    worker processes, each step labelled; the log says what was collected, the checkpoints of the collections are
    gone, and ``--resume`` reuses every episode and gives the same weights."""
    loaded()
    out = tmp_path / "arm"
    recipe = _recipe(tmp_path / "r.yaml", **SMALL | {"stages": ["perception", "bc", "dagger"]},
                     dagger={"steps": 4, "batch": 2, "episodes": 2, "rounds": 2, "max_steps": 12, "window": 5,
                             "max_frames": 8})
    assert main(["train", "--recipe", str(recipe), "--out", str(out), "--workers", "2", "--quiet"]) == 0
    log = json.loads((out / "train_log.json").read_text())["phases"][0]
    assert [(r["round"], r["episodes"]) for r in log["dagger"]] == [(0, 2), (1, 2)]
    assert sorted(log["losses"]) == ["bc", "dagger", "perception"] and log["losses"]["dagger"]["steps"] == 4
    driven = sorted((out / "demos").glob("arm-dagger*.npz"))
    assert [path.name.split("-")[1] + "-" + path.name.split("-")[2] for path in driven] == \
        ["dagger0-push", "dagger0-reach", "dagger1-push", "dagger1-reach"]
    for path in driven:  # a step is labelled while its plan of 4 fits in the 12 steps: steps 0-8
        demo = load_demo(path)
        assert len(demo.frames) == 9 and demo.chunks.shape == (9, 4, 4) and np.abs(demo.chunks).max() <= 1
    assert not (out / "dagger").exists()
    assert_resume_keeps(recipe, out, driven)


def test_a_blind_phase_acts_on_the_state_alone_in_the_camera_models_format(tmp_path):
    """The state-only baseline: no frame drawn, the encoder's pixel weights zero in the checkpoint, so the engine
    gives the same action whatever the camera shows."""
    loaded()
    spec = load_recipe(_recipe(tmp_path / "r.yaml", **{**SMALL, "tasks": ["reach-v3"], "episodes": 2},
                               blind=True)).phases[0].spec
    log = train(spec, tmp_path / "blind", "blind")
    assert log.demos["episodes"] == 2
    checkpoint = load_checkpoint(tmp_path / "blind")
    assert not checkpoint.float32("vision.patch_proj.weight").any()
    assert checkpoint.float32("vision.patch_proj.bias").any()  # the rest of the encoder trained as ever
    rng = np.random.default_rng(0)
    state = np.array([0.0, 0.6, 0.2, 1.0], np.float32)
    actions = []
    for _ in range(2):  # two fresh engines, two random frames
        engine = VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=256, policy=FifoPolicy())
        engine.set_prompt([5, 6, 7])
        actions.append(engine.step(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), state=state).chunk)
    np.testing.assert_array_equal(actions[0], actions[1])
