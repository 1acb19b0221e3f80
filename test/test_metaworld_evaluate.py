"""vla-edge evaluate on Meta-World: the arm driven through the runtime's Driver by the same loop as the 2-D world,
the scripted expert as the ceiling, one line for what cannot run.

The tests that run episodes need the ``metaworld`` extra and libOSMesa and skip with the line a user would
get without them. They stay small: 64 x 64 frames, a few dozen steps, one or two episodes.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from vla_edge_ros import dependencies as deps
from vla_edge_ros.cli import main
from vla_edge_ros.config import parse_settings
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.model.tokenizer_files import write_tokenizer
from vla_edge_ros.runtime.block_costs import parse_cost
from vla_edge_ros.tools.arm_evaluate import evaluate_arm, format_arm_table
from vla_edge_ros.tools.arm_world import ARM_RATE_HZ, ArmTask, ArmWorld, arm_observation, arm_tasks
from vla_edge_ros.tools.evaluate import EXPERT, evaluate
from vla_edge_ros.worlds.metaworld import DESCRIPTIONS, MT10, MetaWorldEnv, WorldUnavailable, backend

FIXED = parse_cost("fixed:encode=8ms,decode=1ms")


def loaded() -> None:
    """The libraries, or a skip that says what to install."""
    try:
        backend.load()
    except WorldUnavailable as exc:
        pytest.skip(str(exc))


def _model(out: Path, *, dof: int = 4, state_dim: int = 4, words: bool = True) -> Path:
    """A random 2-layer ``sim``-shaped checkpoint with an 8-action chunk head (64 x 64 frames)."""
    write_random_model(out, preset("sim", 2, state_dim=state_dim, head="mlp", chunk=8, dof=dof), seed=0)
    if words:
        write_tokenizer(out, [*DESCRIPTIONS.values(), "user", "assistant"], preset("sim").vocab_size)
    return out


@pytest.fixture(scope="module")
def arm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model(tmp_path_factory.mktemp("models") / "arm")


def _settings(model_dir: Path):
    return parse_settings({"reasoning": {"ros__parameters": {"model_dir": str(model_dir), "backend": "numpy"}}},
                          "test.yaml")


def _config(tmp_path: Path, model_dir: Path) -> Path:
    path = tmp_path / "arm.yaml"
    path.write_text(yaml.safe_dump({"reasoning": {"ros__parameters": {"model_dir": str(model_dir),
                                                                       "backend": "numpy"}}}))
    return path


# --- without the libraries -------------------------------------------------------------------------------


def test_the_task_names_are_mt10_or_one_metaworld_task():
    assert [t.task for t in arm_tasks("mt10")] == list(MT10)
    assert arm_tasks("metaworld/push-v3", max_steps=30) == [ArmTask("push-v3", max_steps=30)]
    assert ArmTask("push-v3").name == "metaworld/push-v3" and ArmTask("push-v3").rate_hz == 80.0
    with pytest.raises(ValueError, match="unknown task 'metaworld/push-v2'"):
        arm_tasks("metaworld/push-v2")
    with pytest.raises(ValueError, match=r"max_steps: need an int in \[1, 500\]"):
        arm_tasks("mt10", max_steps=501)


def test_the_arm_gets_its_state_its_description_and_its_rate_nothing_by_hand(arm_model):
    settings = arm_observation(_settings(arm_model), preset("sim", 2, state_dim=4, head="mlp", chunk=8, dof=4),
                               ArmTask("door-open-v3"), "evaluate")
    camera, publisher = settings["camera_subscriber"], settings["action_publisher"]
    assert camera["state_type"] == "joint_state" and camera["state_joint_names"] == ["x", "y", "z", "gripper"]
    assert camera["state_topic"] and not camera["state_joint_velocities"]
    assert publisher["command_type"] == "float32_multi_array" and publisher["control_rate_hz"] == ARM_RATE_HZ
    assert settings["reasoning"]["instruction"] == DESCRIPTIONS["door-open-v3"]


@pytest.mark.parametrize("dof, state_dim, message", [
    (2, 4, "acts in 2 values (vla.action.dof), and the Meta-World arm takes 4 (dx, dy, dz, grip)"),
    (4, 6, "reads a robot state of 6 values (vla.state), and the Meta-World arm's state is 4 (x, y, z, gripper)"),
])
def test_a_checkpoint_that_does_not_fit_the_arm_is_refused_in_one_line(tmp_path, capsys, dof, state_dim, message):
    model = _model(tmp_path / "model", dof=dof, state_dim=state_dim, words=False)
    code = main(["evaluate", "--config", str(_config(tmp_path, model)), "--task", "metaworld/reach-v3",
                 "--episodes", "1", "--max-steps", "5", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_without_the_extra_evaluate_says_what_to_install_in_one_line(tmp_path, capsys, monkeypatch, arm_model):
    monkeypatch.setattr(backend, "_loaded", None)
    monkeypatch.setitem(sys.modules, "metaworld", None)  # as on a machine without it
    code = main(["evaluate", "--config", str(_config(tmp_path, arm_model)), "--task", "mt10", "--episodes", "1",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        f"vla-edge evaluate: error: {deps.missing('metaworld', 'Meta-World')}"], err


def test_options_of_the_other_world_are_refused(tmp_path, capsys, arm_model):
    config = str(_config(tmp_path, arm_model))
    assert main(["evaluate", "--config", config, "--task", "metaworld/reach-v3", "--time-limit-s", "3"]) == 2
    assert "--time-limit-s is the 2-D world's" in capsys.readouterr().err
    assert main(["evaluate", "--config", config, "--task", "reach", "--max-steps", "5"]) == 2
    assert "--max-steps and --goal-shown-s are Meta-World's" in capsys.readouterr().err
    assert main(["evaluate", "--config", config, "--task", "cue-reach", "--goal-shown-s", "0.3"]) == 2
    assert "--max-steps and --goal-shown-s are Meta-World's" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        main(["evaluate", "--task", "metaworld/push-v2"])
    assert caught.value.code == 2 and "unknown task 'metaworld/push-v2'" in capsys.readouterr().err


# --- with them ---------------------------------------------------------------------------------------------


def test_the_arm_steps_at_the_rate_evaluate_plans_on():
    loaded()
    with MetaWorldEnv(ArmTask("reach-v3", width=64, height=64, max_steps=3).arm, seed=0) as env:
        world = ArmWorld(env, 5)
        assert env.rate_hz == ARM_RATE_HZ and world.ticks == 3
        first = world.reset()
        assert first.shape == (64, 64, 3) and env.seed == 5
        step = world.step(world.command(()))  # a stop before any action: the zero action
        assert step.path_length >= 0.0 and step.time_s == 1 / ARM_RATE_HZ
        message = world.state_message()
        assert message.name == ["x", "y", "z", "gripper"] and message.position == env.state.tolist()
        assert step.frame.shape == (64, 64, 3)  # every step by default (a recorded bag's camera)
        every_second = ArmWorld(env, 5, camera_every=2)
        every_second.reset()
        frames = [every_second.step(world.command(())).frame for _ in range(3)]
        assert [frame is None for frame in frames] == [True, False, True]  # the camera's frames only


def test_the_expert_row_succeeds_and_a_random_chunked_policy_runs_through_the_driver_deterministically(
        arm_model, tmp_path):
    """Fixed costs: two runs give the same report, to the last figure; the expert reaches in every episode."""
    loaded()
    task = ArmTask("reach-v3", width=64, height=64, max_steps=60)  # the expert reaches in 46 steps at seed 0
    runs = []
    for i in range(2):
        report = evaluate(_settings(arm_model), task, ["fifo"], [4], episodes=1, seed=0, costs=FIXED,
                          out=tmp_path / f"r{i}", executions=["rtc"])
        report.pop("runtime_s"), report.pop("run")
        runs.append(report)
    assert runs[0] == runs[1]
    report = runs[0]
    assert report["task"]["name"] == "metaworld/reach-v3" and not report["notes"]  # it read the description
    cells = {(c["variant"], c["execution"]): c for c in report["cells"]}
    expert = cells[(EXPERT, None)]
    assert expert["success_rate"] == 1.0 and expert["success_ci95"][1] == 1.0
    assert 0 < expert["episode_ticks"]["mean"] == expert["episode_ticks"]["success_mean"] < 60
    cell = cells[("fifo", "rtc")]
    assert cell["actions"] > 0 and cell["invalid"] == 0 and cell["starved_share"] < 0.5  # frames and state went in
    assert cell["episode_ticks"]["mean"] <= 60


def test_the_dagger_stage_drives_the_arm_as_evaluate_does_and_sees_every_step_before_it_runs(arm_model, tmp_path):
    """``tools/policy_rollouts.drive_arm`` (what training's dagger stage collects with) gives the episode evaluate's own
    unit gives for the same checkpoint, configuration, cost, seed and step limit, and calls its look before every
    step, the arm as that step finds it."""
    loaded()
    from dataclasses import asdict

    from vla_edge_ros.config import load_settings
    from vla_edge_ros.tools.policy_rollouts import PolicyDrive, drive_arm, prepare_drive

    config = Path(__file__).resolve().parents[1] / "config" / "metaworld.yaml"
    settings = load_settings(config).replace("reasoning", {"model_dir": str(arm_model), "backend": "numpy"})
    state = prepare_drive(PolicyDrive(settings, FIXED, max_steps=12))
    seen: list[int] = []
    episode = drive_arm(state, "reach-v3", 3, lambda env: seen.append(env.steps))
    assert seen == list(range(12)) and episode.ticks == 12 and episode.actions > 0
    raw = yaml.safe_load(config.read_text())
    raw["reasoning"]["ros__parameters"].update(model_dir=str(arm_model), backend="numpy")
    local = tmp_path / "arm.yaml"
    local.write_text(yaml.safe_dump(raw))
    assert main(["evaluate", "--config", str(local), "--task", "metaworld/reach-v3", "--episodes", "1", "--seed", "3",
                 "--max-steps", "12", "--cost", FIXED.describe(), "--out", str(tmp_path / "eval")]) == 0
    unit = json.loads((tmp_path / "eval" / "reach-v3" / "units" / "fifo_b16_s3.json").read_text())["result"]
    assert asdict(episode) == unit


def test_the_command_line_evaluates_tasks_and_writes_one_report_over_them(arm_model, tmp_path, capsys):
    loaded()
    out = tmp_path / "out"
    code = main(["evaluate", "--config", str(_config(tmp_path, arm_model)), "--task", "metaworld/drawer-close-v3",
                 "--episodes", "1", "--max-steps", "12", "--cost", "fixed:encode=30ms,decode=2ms",
                 "--execution", "sync", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads((out / "evaluate.json").read_text())
    assert [t["task"]["task"] for t in report["tasks"]] == ["drawer-close-v3"]
    assert {(r["variant"], r["execution"]) for r in report["average"]} == {(EXPERT, None), ("fifo", "sync")}
    assert (out / "drawer-close-v3" / "evaluate.json").exists() and "drawer-close-v3" in printed
    assert format_arm_table(report) in printed and "goal marker" not in printed


def test_the_memory_variant_hides_the_goal_and_says_so_or_refuses_a_task_without_one(arm_model, tmp_path, capsys):
    loaded()
    config = str(_config(tmp_path, arm_model))
    base = ["evaluate", "--config", config, "--episodes", "1", "--max-steps", "30", "--cost",
            "fixed:encode=8ms,decode=1ms", "--goal-shown-s", "0.3"]
    assert main([*base, "--task", "metaworld/reach-v3", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "evaluate.json").read_text())
    assert report["tasks"][0]["task"]["goal_shown_s"] == 0.3
    assert "the goal marker drawn for the first 0.3 s only" in printed.splitlines()[0]
    assert main([*base, "--task", "mt10", "--out", str(tmp_path / "mt10")]) == 2  # before any episode runs
    assert "button-press-topdown-v3 draws no goal marker to hide" in capsys.readouterr().err
    assert not (tmp_path / "mt10").exists()


def test_aura_on_a_checkpoint_whose_recipe_never_trained_it_is_refused_in_one_line(arm_model, tmp_path, capsys):
    """As ``vla-edge train`` writes models/metaworld (perception, bc and dagger only): no aura tensors, no dms gates."""
    loaded()
    pytest.importorskip("torch")  # safetensors' bfloat16 needs it
    from safetensors.torch import load_file, save_file
    model = tmp_path / "no-memory"
    shutil.copytree(arm_model, model)
    tensors = load_file(model / "model.safetensors")
    save_file({name: t for name, t in tensors.items() if not name.startswith("aura.")
               and ".dms_gate." not in name}, model / "model.safetensors")
    base = ["evaluate", "--config", str(_config(tmp_path, model)), "--task", "metaworld/reach-v3", "--episodes", "1",
            "--max-steps", "8", "--cost", "fixed:encode=8ms,decode=1ms", "--budgets", "4"]
    assert main([*base, "--policy", "aura", "--out", str(tmp_path / "aura")]) == 2
    err = capsys.readouterr().err
    assert "kv.policy aura needs tensors" in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2
    assert main([*base, "--policy", "dms", "--out", str(tmp_path / "dms")]) == 0  # keeps by key novelty instead


def test_the_average_pools_every_task(arm_model, tmp_path):
    loaded()
    tasks = [ArmTask(name, width=64, height=64, max_steps=6) for name in ("reach-v3", "window-close-v3")]
    report = evaluate_arm(_settings(arm_model), tasks, ["fifo"], [4], episodes=1, seed=0, costs=FIXED,
                          out=tmp_path / "out")
    expert = next(r for r in report["average"] if r["variant"] == EXPERT)
    assert expert["tasks"] == 2 and expert["pooled"]["episodes"] == 2
    per_task = [next(c for c in t["cells"] if c["variant"] == EXPERT)["success_rate"] for t in report["tasks"]]
    assert expert["mean_task_success"] == sum(per_task) / 2
