"""vla-edge evaluate --task lang-reach: instructions from a template file, success per colour, the blind
ablation and the mid-episode switch, through the same closed loop as every task."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vla_edge_ros.config import parse_settings
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.model.instruction import InstructionTokenizer
from vla_edge_ros.model.tokenizer_files import write_tokenizer
from vla_edge_ros.runtime.block_costs import parse_cost
from vla_edge_ros.tools.evaluate import EXPERT, evaluate, format_table
from vla_edge_ros.tools.lang_reach import Instructor, read_templates, switch_plan
from vla_edge_ros.worlds.sim.render import COLOUR_NAMES
from vla_edge_ros.worlds.sim.world import CueReachEnv, TaskSpec

COSTS = parse_cost("fixed:encode=4ms,decode=1ms,prompt=5ms")
SPEC = TaskSpec(name="lang-reach", time_limit_s=3.0)
TEMPLATES = ("please drive to the {color} target", "head over to the {color} square")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    out = write_random_model(tmp_path_factory.mktemp("models") / "sim", preset("sim"), seed=0)
    return write_tokenizer(out, ["go to the red target", "go to the blue target", "user", "assistant"],
                           preset("sim").vocab_size)


def _settings(model_dir: Path):
    return parse_settings({
        "camera_subscriber": {"ros__parameters": {"frame_height": 96, "frame_width": 96}},
        "reasoning": {"ros__parameters": {"model_dir": str(model_dir), "backend": "numpy"}}}, "test.yaml")


def test_templates_are_read_one_a_line_and_a_bad_one_is_named(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("# held out\nplease drive to the {color} target\n\n  head over to the {color} square  \n")
    assert read_templates(good) == TEMPLATES
    for text, message in [("go to the target\n", "good.txt:1: a template holds {color} exactly once"),
                          ("{color} or {color}\n", "exactly once"), ("go to {colour} {color}\n", "no other braces"),
                          ("# nothing\n\n", "no templates")]:
        good.write_text(text)
        with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("}", r"\}")):
            read_templates(good)
    good.write_bytes(b"\xff\xfe{color}\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_templates(good)
    with pytest.raises(ValueError, match="not a regular file"):
        read_templates(tmp_path)


def test_each_probe_starts_from_its_own_prompt(model):
    tokenizer = InstructionTokenizer.load(model, preset("sim").vocab_size)
    instructor = Instructor(TEMPLATES, tokenizer, 64)
    env = CueReachEnv(SPEC, 3)
    told = instructor.instruction(env, 3)
    assert told in {t.format(color=env.goal_colour) for t in TEMPLATES} and instructor.instruction(env, 3) == told
    assert instructor.prompt(env, 3, "episode").tolist() == tokenizer.prompt_ids(told, 64).tolist()
    assert instructor.prompt(env, 3, "blind").tolist() == tokenizer.template_ids("").tolist()  # no colour said
    assert instructor.check(COLOUR_NAMES) >= len(instructor.prompt(env, 3, "episode"))
    tick, goal = switch_plan(env, 3)
    assert goal != env.goal and SPEC.frames(1.0) <= tick < SPEC.frames(SPEC.time_limit_s / 2)


def test_a_lang_reach_evaluation_reports_colours_blind_and_switch(model, tmp_path):
    runs = [evaluate(_settings(model), SPEC, ["fifo"], [4], episodes=3, seed=11, costs=COSTS, out=tmp_path / f"r{i}",
                     templates=TEMPLATES) for i in range(2)]
    for run in runs:
        run.pop("runtime_s"), run.pop("run")
    assert runs[0] == runs[1]  # deterministic under a fixed cost model
    cells = {c["variant"]: c for c in runs[0]["cells"]}
    expert = cells[EXPERT]["language"]  # it knows the goal: the probes' own check
    assert expert["blind"]["rate"] == expert["switch"]["rate"] == 1.0 == cells[EXPERT]["success_rate"]
    assert sum(r["episodes"] for r in expert["per_colour"].values()) == 3
    fifo = cells["fifo"]["language"]
    assert fifo["blind"]["episodes"] == fifo["switch"]["episodes"] == 3
    units = sorted(p.name for p in (tmp_path / "r0" / "units").iterdir())
    assert sum(name.endswith("_blind.json") for name in units) == sum(name.endswith("_switch.json") for name in units)
    assert "blind" in format_table(runs[0]) and "goal switched mid-way" in format_table(runs[0])


def test_the_switch_names_the_new_goal_s_colour(model, tmp_path):
    report = evaluate(_settings(model), SPEC, ["fifo"], [4], episodes=2, seed=20, costs=COSTS, out=tmp_path,
                      templates=TEMPLATES)
    import json

    for seed in (20, 21):
        switched = json.loads((tmp_path / "units" / f"fifo_b4_s{seed}_switch.json").read_text())["result"]
        env = CueReachEnv(SPEC, seed)
        _, goal = switch_plan(env, seed)
        env.goal = goal
        assert switched["goal_colour"] == env.goal_colour  # the colour of the goal it was switched to
    assert report["task"]["name"] == "lang-reach"


@pytest.mark.parametrize("task, templates, costs, message", [
    ("lang-reach", (), COSTS, "lang-reach needs instruction templates"),
    ("reach", TEMPLATES, COSTS, "reach takes no instructions"),
    ("lang-reach", TEMPLATES, parse_cost("fixed:encode=4ms,decode=1ms"), "lacks prompt"),
])
def test_what_lang_reach_needs_is_refused_before_anything_runs(model, tmp_path, task, templates, costs, message):
    with pytest.raises(ValueError, match=message):
        evaluate(_settings(model), TaskSpec(name=task), ["fifo"], [4], episodes=1, seed=0, costs=costs,
                 out=tmp_path, templates=templates)


def test_a_model_without_a_tokenizer_or_a_bad_file_is_one_line_and_exit_2(tiny_model, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"camera_subscriber": {"ros__parameters": {"frame_height": 96,
                                                                                 "frame_width": 96}},
                                      "reasoning": {"ros__parameters": {"model_dir": str(tiny_model)}}}))
    templates = tmp_path / "t.txt"
    templates.write_text("please drive to the {color} target\n")
    base = [sys.executable, "-m", "vla_edge_ros", "evaluate", "--config", str(config), "--task", "lang-reach",
            "--episodes", "1", "--cost", "fixed:encode=4ms,decode=1ms,prompt=5ms", "--out", str(tmp_path / "o")]
    for extra, message in ((["--instructions", str(templates)], "has no tokenizer.json"),
                           (["--instructions", str(tmp_path / "missing.txt")], "not a regular file")):
        done = subprocess.run(base + extra, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_a_config_with_more_cameras_or_a_state_is_refused_by_evaluate(model, tmp_path):
    """The simulated robot has one camera and publishes no state: every cycle would make no observation."""
    settings = parse_settings({
        "camera_subscriber": {"ros__parameters": {"frame_height": 96, "frame_width": 96,
                                                  "extra_image_topics": ["wrist/image_raw"]}},
        "reasoning": {"ros__parameters": {"model_dir": str(model), "backend": "numpy"}}}, "robot.yaml")
    with pytest.raises(ValueError, match="evaluate feeds one camera and no robot state"):
        evaluate(settings, SPEC, ["fifo"], [4], episodes=1, seed=0, costs=COSTS, out=tmp_path, templates=TEMPLATES)
