"""``vla-edge train --recipe``: a recipe file is checked key by key, its phases run in order each from the weights
of the one before, one log holds them all, and models/sim/recipe.yaml is exactly the specs that made models/sim."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vla_edge_ros.cli import main
from vla_edge_ros.config import defaults
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.train.recipe import load_recipe
from vla_edge_ros.tools.lang_reach import read_templates
from vla_edge_ros.train.spec import AuraSpec, TrainSpec
from vla_edge_ros.worlds.sim.render import COLOUR_NAMES

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "models" / "sim"

# vla_edge_ros.train/1, the flat spec the shipped phases logged, in TrainSpec's nested names
FLAT_NAMES = {
    "max_frames": ("bc.max_frames", "aura.max_frames"),
    **{f"dms_{name}": (f"dms.{name}",) for name in ("max_frames", "window", "target_ratio", "penalty")},
    **{f"aura_{name}": (f"aura.{name}",) for name in (
        "beta", "rho", "penalty", "train_decoder", "bc_batch", "decoder_lr", "cue_writes", "forced_fraction",
        "label_weight", "memory_goal", "memory_warmup")},
    "aura_dagger_episodes": ("aura.dagger_episodes",),
    "aura_dagger_rounds": ("aura.dagger_rounds",),
}
# knobs of the code of the time that today's has not, each with the one value today's code does what it did with
NO_LONGER_KNOBS = {
    "aura_memory_lr": None,  # None: the memory learned at aura.lr, as it always does now
}
# knobs of the code of the time that today's cannot do: the recipe's comment says so
NOT_REPRODUCIBLE = {
    "aura_scored_frames": 16,  # the aura action loss on 16 frames of each episode; today's scores every frame
}
# today's knobs that a flat spec predates: off, as they were
# today's knobs that every logged phase predates (train/1 and train/2 alike): what the code of the time did
# (the dagger stage's knobs: at their defaults, since no logged 2-D world phase ran that stage)
LATER = {"aura.tasks": [], "world": "sim", "image_size": 64, "blind": False, "metaworld.camera": "corner2",
         "metaworld.noise": 0.0, "metaworld.goal_shown_s": None, "bc.max_stride": 1, "aura.max_stride": 1,
         **{f"dagger.{name}": value for name, value in asdict(TrainSpec().dagger).items()}}
PREDATED = {"aura.dagger_episodes": 0, "aura.dagger_rounds": 4, "instructions": [], "state": False, "head": "linear",
            "chunk": 1, "mlp_hidden": 128, **LATER}


def dotted(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(dotted(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def nested_names(flat_spec: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """A train/1 spec in today's dotted names. ``aura.fresh``: the code that scored a subset of frames (and
    dropped it with 6704d7d) held the memory in an earlier layout, so the first phase after it started the
    memory afresh (``load_weights`` drops a memory of another shape)."""
    nested: dict[str, Any] = dict(PREDATED)
    for name, value in dotted(flat_spec).items():
        if name in NO_LONGER_KNOBS or name in NOT_REPRODUCIBLE:
            assert value == {**NO_LONGER_KNOBS, **NOT_REPRODUCIBLE}[name], (name, value)
            continue
        for new in FLAT_NAMES.get(name, (name,)):
            nested[new] = value
    nested["aura.fresh"] = (previous is not None and "aura_scored_frames" in previous
                            and "aura_scored_frames" not in flat_spec)
    return nested


def test_the_shipped_recipe_resolves_to_the_specs_its_log_records(tmp_path):
    """Phase by phase, every knob of models/sim/recipe.yaml (defaults included) against what train_log.json
    says that phase ran with; only the paths of init_from and dagger.config differ (they were other machines'
    directories).
    The first five phases logged the flat train/1 spec, the rest train/2 (TrainSpec's own nested names),
    some before the chunk head's knobs existed."""
    recipe = load_recipe(SHIPPED / "recipe.yaml")
    logged = json.loads((SHIPPED / "train_log.json").read_text())["phases"]
    assert [phase.name for phase in recipe.phases] == [phase["name"] for phase in logged]
    previous = None
    for (phase, _), log in zip(recipe.chained(tmp_path), logged):
        resolved = dotted(json.loads(json.dumps(asdict(phase.spec))))  # tuples as the log's lists
        if log["spec_schema"] == "vla_edge_ros.train/1":
            expected = nested_names(log["spec"], previous)
        else:
            assert log["spec_schema"] == "vla_edge_ros.train/2"
            expected = {**{name: PREDATED[name] for name in ("head", "chunk", "mlp_hidden")}, **LATER,
                        **dotted(log["spec"])}
        assert (resolved.pop("init_from") is None) == (expected.pop("init_from") is None), phase.name
        for paths in (resolved, expected):  # the dagger stage's runtime configuration: the package's, found there
            paths["dagger.config"] = Path(paths["dagger.config"]).parts[-2:] if paths["dagger.config"] else ""
        if log["spec_schema"] == "vla_edge_ros.train/1" and phase.spec.drives_policy:
            # phase 5 collected its aura DAgger episodes with the torch policy, before they were driven through the
            # runtime under the world's configuration, which the recipe now resolves for it
            assert expected["dagger.config"] == "" and log["spec"]["aura_dagger_episodes"] > 0
            expected["dagger.config"] = ("config", "default.yaml")
        assert resolved == expected, (phase.name, {k: (resolved.get(k), expected.get(k))
                                                   for k in resolved.keys() | expected.keys()
                                                   if resolved.get(k) != expected.get(k)})
        previous = log["spec"]
    fresh = ["fresh-memory", "chunk-memory", "memory-refit"]
    assert [phase.name for phase in recipe.phases if phase.spec.aura.fresh] == fresh
    assert [phase.spec.head for phase in recipe.phases][-2:] == ["mlp"] * 2


def test_the_shipped_log_sums_up_every_phase_that_made_the_checkpoint():
    """One log, every phase: their seconds and demonstrations as they were logged, each stage's figures as
    segment means, the steps each stage ran."""
    log = json.loads((SHIPPED / "train_log.json").read_text())
    assert log["schema"] == "vla_edge_ros.train/2"
    assert [sorted(phase["losses"]) for phase in log["phases"]] == [
        ["aura", "bc", "dms", "perception"], ["aura", "bc", "dms"], ["aura", "dms"], ["aura", "dms"], ["aura", "dms"],
        ["bc", "perception"], ["perception"], ["perception"], ["perception"], ["bc", "perception"], ["aura", "dms"],
        ["dagger", "dms"], ["perception"], ["dagger", "dms"], ["aura"], *[["aura", "dms"]] * 5, ["perception"],
        *[["aura", "dms"]] * 6]
    steps = [{stage: summary["steps"] for stage, summary in phase["losses"].items()} for phase in log["phases"]]
    assert steps[3] == {"aura": 2000, "dms": 100} and steps[4] == {"aura": 600, "dms": 100}  # warm-up + stage steps
    assert steps[9] == {"perception": 1000, "bc": 900} and steps[10] == {"aura": 1600, "dms": 100}
    assert sum(step["perception"] for step in steps[5:9]) == 7500
    seconds = [sum(phase["seconds"].values()) for phase in log["phases"]]
    assert 6000 < sum(seconds[:5]) < 7000 and 8500 < sum(seconds[5:11]) < 9500  # the one-action model; words, chunks
    collections = [len(phase.get("dagger", [])) for phase in log["phases"][11:]]  # closed-loop episodes' rounds
    assert collections == [3, 0, 2] + [0] * 9 + [4, 4, 5, 2]  # the last four: the aura stage's, through the runtime
    assert all(round_["stage"] == "aura" and round_["episodes"] == 64 for phase in log["phases"][23:]
               for round_ in phase["dagger"])
    assert steps[14] == {"aura": 1600} and steps[22] == {"aura": 400, "dms": 100}  # the chunked model's memory
    assert steps[23] == {"aura": 500, "dms": 100} and steps[24] == {"aura": 800, "dms": 100}
    assert steps[25] == {"aura": 1000, "dms": 100} and steps[26] == {"aura": 400, "dms": 100}
    assert 14500 < sum(seconds[14:23]) < 16500 and 4500 < sum(seconds[23:25]) < 5800  # partly beside evaluations
    assert 5000 < seconds[25] < 6000 and 2000 < seconds[26] < 3000
    first = log["phases"][0]["losses"]["perception"]
    assert len(first["means"]["action"]) == 20 and first["means"]["action"][-1] < first["means"]["action"][0]
    words = log["phases"][8]["losses"]["perception"]["means"]["action"]  # the colour word grounded: lang-reach views
    assert words[-1] < 0.5 * words[0]


def phrasing(text: str) -> str:
    """A template as a reader hears it: case, punctuation and spacing left out."""
    return " ".join(re.sub(r"[.,!?;:]", " ", text.lower()).split())


def test_no_phrasing_the_figures_are_measured_on_was_ever_trained_on():
    """The held-out instruction files and the default config's instruction: none is a template any phase of the
    recipe trained on, even told apart only by case or punctuation."""
    trained = {phrasing(template) for phase in load_recipe(SHIPPED / "recipe.yaml").phases
               for template in phase.spec.instructions}
    assert len(trained) >= 20
    for name in ("eval_instructions.txt", "eval_instructions_own_style.txt"):
        held_out = {phrasing(template) for template in read_templates(SHIPPED / name)}
        assert len(held_out) >= 10 and not held_out & trained, (name, sorted(held_out & trained))
    instruction = defaults()["reasoning"]["instruction"]
    assert instruction and all(phrasing(instruction) != template.replace("{color}", colour)
                               for template in trained for colour in COLOUR_NAMES)


def recipe_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "message"), [
    ("phases: [{name: a, aura: {stepz: 3}}]", "unknown key 'aura.stepz'"),
    ("phases: [{name: a, instructions: [go to the target]}]", "each template holds {color} once"),
    ("phases: [{name: a, learning_rate: 0.1}]", "unknown key 'learning_rate'"),
    ("phases: [{name: a, seed: 0}]\nseeds: [1]", "unknown key 'seeds'"),
    ("phases: [{name: a, aura: {steps: many}}]", "aura.steps must be of type int, got str 'many'"),
    ("phases: [{name: a, aura: {train_decoder: 1}}]", "aura.train_decoder must be of type bool"),
    ("phases: [{name: a, bc: {lr: 3e-4}}]", "bc.lr must be a number, got the text '3e-4'"),
    ("phases: [{name: a, stages: [bc, polish]}]", "stages[1] must be one of ['perception', 'bc', 'dagger', 'aura', 'dms']"),
    ("phases: [{name: a, stages: bc}]", "stages must be a list of str"),
    ("phases: [{name: a, dms: {steps: 0}}]", "dms.steps=0 is below the minimum 1"),
    ("phases: [{name: a, aura: {dagger_rounds: 0}}]", "aura.dagger_rounds=0 is below the minimum 1"),
    ("phases: [{name: a, aura: {rho: 1.5}}]", "aura.rho=1.5 is above the maximum 1"),
    ("phases: [{name: a, aura: {dagger_episodes: 3}}]", "aura.dagger_episodes: 3 episodes a round cannot fill half"),
    ("phases: [{name: a, aura: {memory_warmup: 10}}]", "aura.memory_warmup needs aura.cue_writes"),
    ("phases: [{name: a, chunk: 8}]", "chunk: the linear head gives one action a cycle, got chunk 8"),
    ("phases: [{name: a, head: bins}]", "head must be one of ['linear', 'mlp']"),
    ("phases: [{name: a, tasks: [chase, fetch]}]", "tasks[1] must be one of ['reach', 'cue-reach', 'lang-reach',"),
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
    """The second phase trains only the dms gates, which the first (no dms stage) left out: every other tensor
    it exports is the first phase's, bit for bit (from its own seed it would be another model), and the one log
    holds both phases."""
    out = tmp_path / "out"
    assert main(["train", "--recipe", str(recipe_file(tmp_path, TINY)), "--out", str(out), "--quiet"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    first, last = load_checkpoint(out / "phases" / "1-first"), load_checkpoint(out)
    gates = {name for name in last.tensors if ".dms_gate." in name}
    assert gates and set(first.tensors) == set(last.tensors) - gates  # the first trained no gates: it has none
    assert not any(name.startswith("aura.") for name in last.tensors)  # no phase trained aura's memory
    for name in first.tensors:
        assert np.array_equal(first.float32(name), last.float32(name)), name
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


@pytest.mark.train
def test_resume_goes_on_from_the_first_phase_a_run_did_not_finish(tmp_path, capsys):
    """``--resume`` keeps the phases the log records with today's spec and a written checkpoint, and trains
    the rest: after a second phase that changed, the checkpoint is the one a run of the changed recipe from
    scratch writes, bit for bit; a run that finished trains nothing again; a torn log is one line."""
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    assert main(["train", "--recipe", str(recipe_file(tmp_path, TINY)), "--out", str(out), "--quiet"]) == 0
    first = (out / "phases" / "1-first" / "model.safetensors").stat().st_mtime_ns
    changed = recipe_file(tmp_path, TINY.replace("seed: 1", "seed: 2"))
    assert main(["train", "--recipe", str(changed), "--out", str(out), "--quiet", "--resume"]) == 0
    assert (out / "phases" / "1-first" / "model.safetensors").stat().st_mtime_ns == first  # kept, not retrained
    assert main(["train", "--recipe", str(changed), "--out", str(fresh), "--quiet"]) == 0
    assert (out / "model.safetensors").read_bytes() == (fresh / "model.safetensors").read_bytes()
    log = json.loads((out / "train_log.json").read_text())["phases"]
    assert [phase["spec"]["seed"] for phase in log] == [0, 2]
    last = (out / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["train", "--recipe", str(changed), "--out", str(out), "--quiet", "--resume"]) == 0
    assert (out / "model.safetensors").stat().st_mtime_ns == last and "first" in capsys.readouterr().out
    (out / "train_log.json").write_text("{")
    assert main(["train", "--recipe", str(changed), "--out", str(out), "--quiet", "--resume"]) == 2
    assert "not a training log" in capsys.readouterr().err


def test_a_smoke_run_scales_every_phase():
    recipe = load_recipe(SHIPPED / "recipe.yaml").scaled(0.02)
    fresh, dagger = recipe.phases[3].spec.aura, recipe.phases[4].spec.aura
    assert (fresh.steps, fresh.memory_warmup, recipe.phases[0].spec.episodes) == (20, 20, 24)
    assert dagger == AuraSpec(12, 8, 3e-3, train_decoder=True, decoder_lr=3e-4, cue_writes=True, memory_goal=1.0,
                              dagger_episodes=4)  # half a batch, the least a round may collect
