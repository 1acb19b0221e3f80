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
import yaml

from vla_edge_ros.cli import main
from vla_edge_ros.config import ConfigError
from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.memory import FifoPolicy
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.init_model import preset
from vla_edge_ros.train.arm_demos import ArmEpisode, ArmRecorder, arm_episodes, arm_state_statistics, load_demo
from vla_edge_ros.train.recipe import load_recipe
from vla_edge_ros.train.spec import TrainSpec
from vla_edge_ros.train.trainer import phase_config, train
from vla_edge_ros.worlds.metaworld import MT10, ArmSpec, MetaWorldEnv, WorldUnavailable, backend

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
    ({"world": "metaworld", "tasks": ["reach-v3"]}, r"stages: \['aura', 'dms'\] learn the 2-D world's memory tasks"),
    ({"world": "metaworld", "tasks": ["reach-v3"], "stages": ["bc"], "instructions": ["go {color}"]},
     "instructions: the metaworld world's instruction is each task's description"),
    ({"tasks": ["reach-v3"]}, r"tasks: \['reach-v3'\] are not the sim world's"),
    ({"metaworld": {"noise": 0.1}}, "metaworld: its knobs are for world: metaworld"),
    ({"blind": True}, r"blind: a model that sees no frames needs the robot's state \(state: true\)"),
    ({"image_size": 66}, "image_size: a frame is cut into 4 x 4 patches"),
    ({**SMALL, "metaworld": {"camera": "topdown"}}, "metaworld.camera"),
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


def test_the_mt10_recipes_are_one_phase_the_baseline_blind_on_the_same_demonstrations():
    """models/metaworld: the camera policy and the state-only baseline differ in nothing but ``blind`` and the
    stages' lengths (the baseline keeps those it was measured at, the camera recipe's first ones), so they
    learn from the same episodes (seeds, noise, labels)."""
    shipped = ROOT / "models" / "metaworld"
    (camera,), (baseline,) = (load_recipe(shipped / name).phases for name in ("recipe.yaml", "state-only.yaml"))
    assert camera.spec.tasks == MT10 and camera.spec.stages == ("perception", "bc") and not camera.spec.blind
    assert baseline.spec.perception.steps <= camera.spec.perception.steps
    assert baseline.spec.bc.steps <= camera.spec.bc.steps
    lengths = {"perception": replace(baseline.spec.perception, steps=camera.spec.perception.steps),
               "bc": replace(baseline.spec.bc, steps=camera.spec.bc.steps)}
    assert replace(baseline.spec, blind=False, **lengths) == camera.spec and baseline.spec.blind
    assert [(e.task, e.seed, e.noise) for e in arm_episodes(baseline.spec)] == \
        [(e.task, e.seed, e.noise) for e in arm_episodes(camera.spec)]


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
