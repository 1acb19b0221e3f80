"""``vla-edge train --recipe``: a recipe file is checked key by key, its phases run in order each from the weights
of the one before, and one log holds them all."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vla_edge_ros.cli import main
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.train.recipe import load_recipe


def recipe_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "message"), [
    ("phases: [{name: a, aura: {stepz: 3}}]", "unknown key 'aura.stepz'"),
    ("phases: [{name: a, learning_rate: 0.1}]", "unknown key 'learning_rate'"),
    ("phases: [{name: a, seed: 0}]\nseeds: [1]", "unknown key 'seeds'"),
    ("phases: [{name: a, aura: {steps: many}}]", "aura.steps must be of type int, got str 'many'"),
    ("phases: [{name: a, aura: {train_decoder: 1}}]", "aura.train_decoder must be of type bool"),
    ("phases: [{name: a, bc: {lr: 3e-4}}]", "bc.lr must be a number, got the text '3e-4'"),
    ("phases: [{name: a, stages: [bc, polish]}]", "stages[1] must be one of ['perception', 'bc', 'aura', 'dms']"),
    ("phases: [{name: a, stages: bc}]", "stages must be a list of str"),
    ("phases: [{name: a, dms: {steps: 0}}]", "dms.steps=0 is below the minimum 1"),
    ("phases: [{name: a, aura: {dagger_rounds: 0}}]", "aura.dagger_rounds=0 is below the minimum 1"),
    ("phases: [{name: a, aura: {rho: 1.5}}]", "aura.rho=1.5 is above the maximum 1"),
    ("phases: [{name: a, aura: {dagger_episodes: 3}}]", "aura.dagger_episodes: 3 episodes a round cannot fill half"),
    ("phases: [{name: a, aura: {memory_warmup: 10}}]", "aura.memory_warmup needs aura.cue_writes"),
    ("phases: [{name: a, aura: 5}]", "aura must be a mapping of its knobs"),
    ("phases: [{name: a}, {name: b, init_from: x}]", "phase 2 (b): init_from: only the first phase"),
    ("phases: [{name: a}, {name: a}]", "phase 2: name 'a' is taken"),
    ("phases: [{seed: 1}]", "phase 1: name must be"),
    ("phases: []", "phases must be a non-empty list"),
    ("phases: [{name: a, seed: &s 1}]", "anchors and aliases"),
])
def test_a_bad_recipe_is_one_line_naming_the_file_and_the_key(tmp_path, capsys, text, message):
    path = recipe_file(tmp_path, text + "\n")
    assert main(["train", "--recipe", str(path), "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vla-edge train: error: {path}: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "never").exists()


def test_a_missing_recipe_is_one_line(tmp_path, capsys):
    assert main(["train", "--recipe", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "none.yaml") in err and "No such file" in err and err.count("\n") == 1


def test_the_old_flags_are_gone(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--recipe", "r.yaml", "--out", "never", "--aura-dagger", "64"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --aura-dagger" in capsys.readouterr().err


def test_a_relative_init_from_resolves_against_the_recipe_file(tmp_path, monkeypatch):
    (tmp_path / "recipes" / "start").mkdir(parents=True)
    path = recipe_file(tmp_path / "recipes", "phases: [{name: a, init_from: start}, {name: b}]\n")
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(Path("recipes") / path.name)
    assert recipe.phases[0].spec.init_from == str((tmp_path / "recipes" / "start").resolve())
    chained = recipe.chained(Path("out"))
    assert [where for _, where in chained] == [Path("out/phases/1-a"), Path("out")]
    assert chained[1][0].spec.init_from == str(Path("out/phases/1-a"))


TINY = """\
phases:
  - name: first
    seed: 0
    tasks: [cue-reach]
    episodes: 2
    stages: [perception, bc]
    perception: {steps: 2, batch: 8}
    bc: {steps: 2, batch: 2, max_frames: 12}
  - name: second
    seed: 1
    tasks: [cue-reach]
    episodes: 2
    stages: [dms]
    dms: {steps: 3, batch: 2, max_frames: 8, lr: 0.05}
"""


@pytest.mark.train
def test_a_two_phase_recipe_runs_the_second_phase_from_the_first_ones_weights(tmp_path, capsys):
    """The second phase trains only the dms gates: every other tensor it exports is the first phase's, bit for
    bit (from its own seed it would be another model), and the one log holds both phases."""
    out = tmp_path / "out"
    assert main(["train", "--recipe", str(recipe_file(tmp_path, TINY)), "--out", str(out), "--quiet"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    first, last = load_checkpoint(out / "phases" / "1-first"), load_checkpoint(out)
    gates = {name for name in last.tensors if ".dms_gate." in name}
    assert gates and set(first.tensors) == set(last.tensors)
    for name in last.tensors:
        same = np.array_equal(first.float32(name), last.float32(name))
        assert same != (name in gates), name
    log = json.loads((out / "train_log.json").read_text())
    assert log["schema"] == "vla_edge_ros.train/2" and [p["name"] for p in log["phases"]] == ["first", "second"]
    one, two = log["phases"]
    assert one["spec"]["init_from"] is None and two["spec"]["init_from"] == str(out / "phases" / "1-first")
    assert two["spec"]["dms"] == {"steps": 3, "batch": 2, "lr": 0.05, "max_frames": 8, "window": 32,
                                  "target_ratio": 4.0, "penalty": 1.0}
    assert {stage: s["steps"] for stage, s in one["losses"].items()} == {"perception": 2, "bc": 2}
    assert list(two["losses"]) == ["dms"] and len(two["losses"]["dms"]["means"]["distill"]) == 3
    assert set(two["seconds"]) == {"demos", "dms"} and two["demos"]["episodes"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "phases", "train_log.json"]
