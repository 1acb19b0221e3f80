"""The dagger stage in the 2-D world: the policy drives fresh layouts through the runtime as ``vla-edge evaluate``
does, each frame it sees labelled as a demonstration's (``demos.PlanarLabeller``), worded as that seed's
demonstration would be."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("torch")

from vla_edge_ros.cli import main
from vla_edge_ros.config import load_settings
from vla_edge_ros.runtime.block_costs import parse_cost
from vla_edge_ros.runtime.loader import load_model, prompt_ids
from vla_edge_ros.tools.evaluate import run_episode
from vla_edge_ros.tools.lang_reach import instructor_for
from vla_edge_ros.tools.policy_rollouts import PolicyDrive, drive_planar, prepare_drive
from vla_edge_ros.train.demos import PlanarEpisode, PlanarLabeller, excursion, load_demo, record_demo
from vla_edge_ros.train.recipe import load_recipe
from vla_edge_ros.train.spec import TrainSpec
from vla_edge_ros.train.trainer import phase_config, phase_wording, planar_episode
from vla_edge_ros.worlds.sim.world import CueReachEnv, TaskSpec
from train_runs import assert_resume_keeps

ROOT = Path(__file__).resolve().parents[1]
COST = "fixed:encode=8ms,decode=1ms,prompt=20ms"
TEMPLATES = ("go {color}", "the {color} one")
TINY = {"state": True, "head": "mlp", "chunk": 4, "mlp_hidden": 32, "tasks": ["reach", "lang-reach"],
        "instructions": list(TEMPLATES), "episodes": 4, "stages": ["bc", "dagger"],
        "bc": {"steps": 2, "batch": 2, "lr": 0.001}}


def _recipe(path: Path, **knobs) -> Path:
    path.write_text(yaml.safe_dump({"phases": [{"name": "tiny", **knobs}]}))
    return path


def test_a_2d_dagger_phase_drives_under_the_default_configuration_unless_told_otherwise(tmp_path):
    """The dagger stage's episodes, and the aura stage's DAgger episodes, drive under the world's configuration."""
    shipped = load_recipe(_recipe(tmp_path / "r.yaml", **TINY)).phases[0].spec
    mine = load_recipe(_recipe(tmp_path / "m.yaml", **TINY, dagger={"config": "mine.yaml"})).phases[0].spec
    assert shipped.dagger.config == str(ROOT / "config" / "default.yaml")
    assert mine.dagger.config == str(tmp_path / "mine.yaml")
    aura = {**TINY, "stages": ["aura"], "aura": {"steps": 2, "batch": 2, "lr": 0.01, "dagger_episodes": 2}}
    assert load_recipe(_recipe(tmp_path / "a.yaml", **aura)).phases[0].spec.dagger.config == shipped.dagger.config


def test_a_collected_episode_is_told_what_its_demonstration_would_be(tmp_path):
    spec = TrainSpec(state=True, head="mlp", chunk=4, mlp_hidden=32, tasks=("reach", "lang-reach"),
                     instructions=TEMPLATES, episodes=4, stages=("bc", "dagger"))
    wording = phase_wording(spec, phase_config(spec), tmp_path)
    for index, seed in enumerate([7, 2**40 + 3, 11]):
        episode = planar_episode(spec, wording, spec.tasks[index % 2], seed)
        demo = record_demo(TaskSpec(name=episode.task), seed, spec.image_size, wording, chunk=spec.chunk)
        assert episode.task == spec.tasks[index % 2] and episode.prompt == demo.prompt
        assert (episode.image_size, episode.chunk) == (spec.image_size, spec.chunk)


def test_the_labeller_on_the_experts_path_records_the_noiseless_demonstration():
    """Driven by the expert (no noise, no excursion), what the labeller records equals ``record_demo``'s episode."""
    spec = TaskSpec(name="lang-reach")
    seed = next(s for s in range(100) if not excursion(np.random.default_rng([s, 1]), spec.release_frames)[0])
    recorded = record_demo(spec, seed, 32, noise_sigma=0.0, chunk=4)
    labeller = PlanarLabeller(PlanarEpisode("lang-reach", seed, 32, 4, recorded.prompt))
    env = CueReachEnv(spec, seed)
    episode = run_episode(env, seed, None, record=lambda _now, frame, _expert: labeller.see(env, frame))
    labelled = labeller.demo(episode.success)
    assert recorded.success and labelled.success and len(labelled.frames) == len(recorded.frames)
    for name in ("frames", "chunks", "where", "states"):
        np.testing.assert_array_equal(getattr(labelled, name), getattr(recorded, name))
    assert labelled.prompt == recorded.prompt and labelled.cue_frames == recorded.cue_frames


def test_the_dagger_stage_drives_the_2d_world_as_evaluate_does(tmp_path):
    """``drive_planar`` with the shipped model gives the episode evaluate's own unit gives for the same
    configuration, cost, seed and instruction, and shows the labeller every frame the robot saw."""
    settings = load_settings(ROOT / "config" / "default.yaml")
    checkpoint = load_model(settings)
    templates = ("please drive to the {color} target",)
    (tmp_path / "t.txt").write_text(templates[0] + "\n")
    assert main(["evaluate", "--task", "lang-reach", "--instructions", str(tmp_path / "t.txt"), "--policy", "fifo",
                 "--budgets", "16", "--episodes", "1", "--seed", "5", "--cost", COST,
                 "--out", str(tmp_path / "eval")]) == 0
    unit = json.loads((tmp_path / "eval" / "units" / "fifo_b16_s5.json").read_text())["result"]
    instructor = instructor_for(templates, checkpoint, settings["reasoning"]["instruction_max_tokens"])
    prompt = tuple(int(i) for i in instructor.prompt(CueReachEnv(TaskSpec(name="lang-reach"), 5), 5, "episode"))
    state = prepare_drive(PolicyDrive(settings, parse_cost(COST), prompt_tokens=instructor.check(("red", "green",
                                                                                                  "blue", "purple"))))
    labeller = PlanarLabeller(PlanarEpisode("lang-reach", 5, checkpoint.config.vision.image_size, 24, prompt))
    episode = drive_planar(state, "lang-reach", 5, prompt, labeller.see)
    unit.pop("goal_colour")
    assert {k: v for k, v in asdict(episode).items() if k != "goal_colour"} == unit
    labelled = labeller.demo(episode.success)
    assert len(labelled.frames) == episode.ticks and labelled.chunks.shape == (episode.ticks, 24, 2)
    assert labelled.prompt == prompt and np.abs(labelled.chunks).max() <= 1


def test_the_aura_stages_episodes_are_evaluates_aura_row(tmp_path):
    """``drive_planar`` with the aura memory gives the episode evaluate's aura unit gives (the learned gate, its
    budget) for the same configuration, cost and seed: the aura stage's DAgger sees what evaluate measures."""
    settings = load_settings(ROOT / "config" / "default.yaml")
    checkpoint = load_model(settings)
    assert main(["evaluate", "--task", "cue-reach", "--policy", "aura", "--episodes", "1", "--seed", "5",
                 "--cost", COST, "--out", str(tmp_path / "eval")]) == 0
    [path] = (tmp_path / "eval" / "units").glob("aura_b*_s5.json")
    unit = json.loads(path.read_text())["result"]
    state = prepare_drive(PolicyDrive(settings, parse_cost(COST), policy="aura"))
    env = CueReachEnv(TaskSpec(name="cue-reach"), 5)
    prompt = tuple(int(i) for i in prompt_ids(settings, checkpoint))  # what evaluate tells cue-reach: the configured one
    labeller = PlanarLabeller(PlanarEpisode("cue-reach", 5, checkpoint.config.vision.image_size, 24, prompt))
    episode = drive_planar(state, "cue-reach", 5, prompt, labeller.see)
    assert asdict(episode) == unit and episode.memory_writes > 0
    assert len(labeller.demo(episode.success).frames) == episode.ticks
    with pytest.raises(ValueError, match="fifo or aura"):
        PolicyDrive(settings, parse_cost(COST), policy="cosine")


@pytest.mark.slow  # about 20 s: two trainings whose collections drive a fresh model for whole episodes
def test_a_2d_dagger_phase_collects_with_its_own_weights_and_resumes_them(tmp_path):
    out = tmp_path / "out"
    recipe = _recipe(tmp_path / "r.yaml", **TINY, dagger={"steps": 4, "batch": 2, "lr": 0.001, "episodes": 2,
                                                          "rounds": 2, "window": 100})
    assert main(["train", "--recipe", str(recipe), "--out", str(out), "--workers", "2", "--quiet"]) == 0
    log = json.loads((out / "train_log.json").read_text())["phases"][0]
    assert [(r["round"], r["episodes"]) for r in log["dagger"]] == [(0, 2), (1, 2)]
    driven = sorted((out / "demos").glob("tiny-dagger*.npz"))
    assert [path.name.split("-")[1] + "-" + path.name.split("-")[2] for path in driven] == \
        ["dagger0-lang", "dagger0-reach", "dagger1-lang", "dagger1-reach"]
    for path in driven:
        demo = load_demo(path)
        assert demo.chunks.shape == (len(demo.frames), 4, 2) and demo.states.shape == (len(demo.frames), 6)
        assert len(demo.prompt) > 0 and np.abs(demo.chunks).max() <= 1
    assert not (out / "dagger").exists()
    assert_resume_keeps(recipe, out, driven)
