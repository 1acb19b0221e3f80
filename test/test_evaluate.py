"""Closed-loop evaluation: the runtime drives the simulated robot; deterministic with fixed costs."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from vla_edge_ros.bags import Bag
from vla_edge_ros.cli import main
from vla_edge_ros.cli.commands import build_parser
from vla_edge_ros.config import parse_settings
from vla_edge_ros.memory import make_policy
from vla_edge_ros.model.config import load_model_config
from vla_edge_ros.model.safetensors_io import StoredTensor, read_safetensors, write_safetensors
from vla_edge_ros.tools.evaluate import (
    AURA_NOTE,
    EXPERT,
    arena_for,
    cue_swap,
    evaluate,
    format_table,
    jerk,
    picks,
    run_episode,
    run_order,
    wilson_interval,
    write_report,
)
from vla_edge_ros.tools.replay import parse_cost
from vla_edge_ros.worlds.sim.world import CueReachEnv, TaskSpec

SPEC = TaskSpec(name="cue-reach", time_limit_s=2.5)
FIXED = parse_cost("fixed:encode=8ms,decode=1ms")


def _settings(tiny_model, **reasoning):
    return parse_settings({
        "camera_subscriber": {"ros__parameters": {"frame_height": 96, "frame_width": 96}},
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy", **reasoning}}},
        "test.yaml")


def test_wilson_interval_holds_the_rate_for_every_count():
    """Rounding once put the upper bound an ulp below a rate of 1.0 (100 of 100), and the plot refused the
    negative error bar after a 37-minute run."""
    for n in range(1, 301):
        for k in range(n + 1):
            low, high = wilson_interval(k, n)
            assert 0.0 <= low <= k / n <= high <= 1.0, (k, n, low, high)


def test_wilson_interval_is_sound_at_the_edges():
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(10, 10)[1] == 1.0 and wilson_interval(10, 10)[0] == pytest.approx(0.7225, abs=1e-4)
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_the_expert_reaches_the_goal_through_the_loop():
    for seed in range(3):
        episode = run_episode(CueReachEnv(TaskSpec(), seed), seed, None)
        assert episode.success and episode.time_s < TaskSpec().time_limit_s and episode.path_length > 0


def test_fixed_cost_evaluation_is_deterministic_and_records_bags(tiny_model, tmp_path):
    settings = _settings(tiny_model)
    runs = [evaluate(settings, SPEC, ["fifo", "aura"], [2], episodes=1, seed=5, costs=FIXED, out=tmp_path / f"r{i}",
                     record_dir=tmp_path / "bags") for i in range(2)]
    for run in runs:
        run.pop("runtime_s"), run.pop("run")
    assert runs[0] == runs[1]
    cells = {(c["variant"], c["budget_frames"]): c for c in runs[0]["cells"]}
    assert cells[(EXPERT, None)]["episodes"] == 1
    fifo, aura = cells[("fifo", 2)], cells[("aura", 2)]  # aura's token and state need more than one frame's bytes
    assert fifo["actions"] > 0 and aura["actions"] > 0
    assert aura["memory_peak_bytes"] < fifo["memory_peak_bytes"] <= fifo["budget_bytes"] == aura["budget_bytes"]
    assert fifo["within_budget"] and aura["within_budget"]
    bags = sorted((tmp_path / "bags").iterdir())
    assert [b.name for b in bags] == ["cue-reach_0005.mcap"]
    with Bag(bags[0]) as bag:
        assert bag.topics["/camera/image_raw"].count == bag.topics["/vla/command"].count > 0
    path = write_report(runs[0], tmp_path / "out")
    assert path.is_file() and (tmp_path / "out" / "success.png").read_bytes()[:4] == b"\x89PNG"


def test_without_fresh_actions_the_robot_gets_safe_stops_and_never_moves(tiny_model, tmp_path):
    """A 1 ms deadline: after warm-up every cycle is refused, so every tick commands zero velocity."""
    settings = _settings(tiny_model, deadline_ms=1.0, warmup_cycles=1)
    report = evaluate(settings, TaskSpec(name="reach", time_limit_s=1.0), ["fifo"], [2], episodes=1, seed=0,
                      costs=FIXED, out=tmp_path)
    fifo = next(c for c in report["cells"] if c["policy"] == "fifo")
    assert fifo["success_rate"] == 0.0 and fifo["actions"] == 0 and fifo["safe_stops"] == 30
    assert fifo["path_length"] is None  # no successful episode to average over


def test_cli_refuses_bad_budgets(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--budgets", "0,all"])
    assert "positive frame counts" in capsys.readouterr().err


def test_variants_parse_and_a_bad_one_names_the_choices(capsys):
    args = build_parser().parse_args(["evaluate", "--policy", "dms:novelty, aura:random"])
    assert args.policy == ("dms:novelty", "aura:random")
    with pytest.raises(SystemExit):
        main(["evaluate", "--policy", "aura,aura:learned"])
    assert "fifo,cosine,aura,aura:surprise,aura:random,aura:periodic,aura:no-write,dms,dms:novelty" in capsys.readouterr().err


def test_aura_runs_before_the_rows_matched_to_its_rate_and_is_added_when_missing():
    assert run_order(["fifo", "aura:random", "cosine", "aura"]) == (["fifo", "aura", "aura:random", "cosine"], False)
    assert run_order(["aura", "fifo", "aura:periodic"]) == (["aura", "fifo", "aura:periodic"], False)
    assert run_order(["dms:novelty", "aura:surprise"]) == (["dms:novelty", "aura", "aura:surprise"], True)
    assert run_order(["dms", "dms:novelty"]) == (["dms", "dms:novelty"], False)
    with pytest.raises(ValueError, match="unknown variants"):
        run_order(["aura:learned"])


def test_gate_baselines_write_at_the_rate_the_aura_row_measured_and_aura_rows_run_once(tiny_model, tmp_path):
    lines: list[str] = []
    report = evaluate(_settings(tiny_model), TaskSpec(name="reach", time_limit_s=1.0),
                      ["aura:periodic", "fifo", "aura:random"], [2, 3], episodes=2, seed=0, costs=FIXED,
                      out=tmp_path, progress=lines.append)
    assert [(c["variant"], c["budget_frames"]) for c in report["cells"]] == [
        (EXPERT, None), ("aura", 2), ("aura:periodic", 2), ("fifo", 2), ("fifo", 3), ("aura:random", 2)]
    assert lines[0].startswith("aura added") and report["notes"][0].startswith(AURA_NOTE)
    cells = {c["variant"]: c for c in report["cells"]}
    aura, periodic = cells["aura"], cells["aura:periodic"]
    rate = aura["memory_writes"] / aura["memory_frames"]
    assert 0 < rate < 1 and aura["gate_rate"] is None and aura["note"] is None
    assert periodic["gate_rate"] == cells["aura:random"]["gate_rate"] == pytest.approx(rate)
    # each of the 2 episodes writes within one write of rate x its frames (not at 1 / round(1 / rate))
    assert abs(periodic["memory_writes"] - rate * periodic["memory_frames"]) <= 2
    assert periodic["writes_per_frame"] == periodic["memory_writes"] / periodic["memory_frames"]
    table = format_table(report)
    assert "aura:periodic" in table and "w rate:" in table


def _with_gates(model, out, *, aura_bias: float, dms_bias: float):
    """A copy of ``model`` with learned aura and dms gates whose logits are their biases (zero weights)."""
    config = load_model_config(model)
    tensors = {name: StoredTensor(t.dtype, np.array(t.array))
               for name, t in read_safetensors(model / "model.safetensors").items()}
    d_k, d_v = tensors["aura.k_proj.weight"].shape[0], tensors["aura.v_proj.weight"].shape[0]
    gates = {"aura.gate.weight": np.zeros((1, d_k + d_v), np.float32),
             "aura.gate.bias": np.array([aura_bias], np.float32)}
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}.self_attn.dms_gate."
        gates[prefix + "weight"] = np.zeros((config.num_key_value_heads, config.hidden_size), np.float32)
        gates[prefix + "bias"] = np.full(config.num_key_value_heads, dms_bias, np.float32)
    out.mkdir()
    shutil.copy(model / "config.json", out / "config.json")
    write_safetensors(out / "model.safetensors", {**tensors, **{n: StoredTensor("F32", a) for n, a in gates.items()}})
    return out


def test_learned_gates_decide_aura_and_dms_and_their_score_variants_ignore_them(tiny_model, tmp_path):
    """The aura gate never writes and the dms gate evicts every token; the score variants decide otherwise."""
    gated = _with_gates(tiny_model, tmp_path / "gated", aura_bias=-10.0, dms_bias=10.0)
    settings = _settings(gated, kv={"dms": {"target_ratio": 0.0, "threshold": 0.0}})
    report = evaluate(settings, TaskSpec(name="reach", time_limit_s=1.0), ["aura:surprise", "dms", "dms:novelty"],
                      [None], episodes=1, seed=0, costs=FIXED, out=tmp_path / "out")
    cells = {c["variant"]: c for c in report["cells"]}
    aura, surprise = cells["aura"], cells["aura:surprise"]
    frames = aura["memory_frames"]
    assert aura["memory_writes"] == 0 and frames > 0  # the threshold alone would write the first frame
    assert surprise["memory_writes"] > 0 and surprise["gate_rate"] == pytest.approx(1 / frames)
    assert surprise["note"] == f"aura wrote nothing in {frames} frames: matched to 1/{frames}, the smallest rate > 0"
    # the gate evicts every token once it leaves the window; key novelty keeps most of an arena that holds them all
    assert cells["dms"]["memory_peak_bytes"] < cells["dms:novelty"]["memory_peak_bytes"]


def test_cosine_protects_at_most_one_frame_less_than_the_budget_holds():
    from vla_edge_ros.tools.evaluate import fit_to_budget

    node = {"kv.cosine.protect_recent_frames": 4}
    knobs, note = fit_to_budget(node, "cosine", 4)
    assert knobs == {"kv.cosine.protect_recent_frames": 3} and "4 -> 3" in note
    assert fit_to_budget(node, "cosine", 16) == ({}, None)
    assert fit_to_budget(node, "cosine", None) == ({}, None)  # an arena for the whole episode
    assert fit_to_budget(node, "fifo", 2) == ({}, None)


def test_a_command_picks_the_target_it_points_at():
    targets = np.array([[0.9, 0.5], [0.5, 0.9], [0.1, 0.1]])
    robot = np.array([0.5, 0.5])
    assert picks(np.array([1.0, 0.1]), robot, targets) == 0
    assert picks(np.array([-0.1, 1.0]), robot, targets) == 1
    assert picks(np.array([-1.0, -1.0]), robot, targets) == 2
    assert picks(np.zeros(2), robot, targets) is None  # a robot that stands still picks nothing


def test_the_cue_swap_shows_each_cue_in_turn_and_the_expert_follows_every_one():
    """The expert knows the goal: if the probe did not really swap the cue, it could not pick each one."""
    for seed in range(3):
        swap = cue_swap(SPEC, seed, None)
        assert swap.seed == seed and swap.picked == [True] * SPEC.targets


def test_a_policy_without_memory_picks_one_target_whichever_was_cued(tiny_model, tmp_path):
    """After the release the frames of the three swaps are the same pixels (same layout, noise, no ring): a
    policy that holds only the current frame (aura that never writes, fifo over the last 2 frames) sends the
    same command for all three, so it picks the cued target in exactly one of them, or none."""
    report = evaluate(_settings(tiny_model), SPEC, ["aura:no-write", "fifo"], [2], episodes=2, seed=3, costs=FIXED,
                      out=tmp_path)
    cells = {c["variant"]: c for c in report["cells"]}
    assert cells[EXPERT]["cue_swap"] == {"seeds": 2, "trials": 6, "picked": 6, "rate": 1.0,
                                         "ci95": list(wilson_interval(6, 6))}
    for variant in ("aura:no-write", "fifo"):
        swap = cells[variant]["cue_swap"]
        assert swap["trials"] == 6 and swap["picked"] in (0, 1, 2)
    no_write = cells["aura:no-write"]
    assert no_write["memory_writes"] == 0 and no_write["memory_frames"] > 0 and no_write["gate_rate"] is None
    assert "swap" in format_table(report)


def test_cells_record_bytes_and_tokens_held_against_tokens_seen(tiny_model, tmp_path):
    settings = _settings(tiny_model)
    per_frame = load_model_config(tiny_model).vision.tokens_per_frame
    report = evaluate(settings, SPEC, ["fifo", "aura", "dms:novelty"], [4, None], episodes=1, seed=2,
                      costs=FIXED, out=tmp_path)
    cells = {(c["variant"], c["budget_frames"]): c for c in report["cells"]}
    everything, window = cells[("fifo", None)], cells[("fifo", 4)]
    assert everything["compression"]["tokens"] == pytest.approx(1.0)  # an arena for the episode forgets nothing
    assert everything["tokens_held"]["mean"] == pytest.approx(everything["tokens_seen_mean"])
    assert window["tokens_held"]["peak"] == 4 * per_frame and window["compression"]["tokens"] > 1
    assert window["bytes_held"]["mean"] <= window["bytes_held"]["peak"] <= window["budget_bytes"]
    aura = next(c for c in report["cells"] if c["variant"] == "aura")
    assert aura["tokens_held"]["peak"] == 1 + per_frame  # the memory token and the current frame
    assert aura["bytes_held"]["peak"] <= aura["budget_bytes"] and aura["writes_per_frame"] is not None
    for budget in (4, None):  # dms's window is inside the budget: its pages hold no more than fifo's arena may
        dms = cells[("dms:novelty", budget)]
        assert dms["within_budget"] and dms["budget_bytes"] == cells[("fifo", budget)]["budget_bytes"]
        assert dms["bytes_held"]["peak"] <= dms["budget_bytes"]
        assert dms["tokens_held"]["per_head_mean"] <= dms["tokens_held"]["mean"]  # heads hold their own tokens


def test_a_budget_whose_pages_cannot_hold_dms_s_window_is_refused_before_anything_runs(tiny_model, tmp_path):
    """dms's window (32 tokens) beside one frame needs more pages than a 1-frame arena has; a frame more than
    the window's holds it."""
    settings = _settings(tiny_model, **{"kv.dms.window": 32})
    per_frame = load_model_config(tiny_model).vision.tokens_per_frame
    enough = -(-32 // per_frame) + 1
    with pytest.raises(ValueError, match="dms:novelty cannot run within a budget of 1 frames: kv_pool_pages="):
        evaluate(settings, SPEC, ["dms:novelty"], [enough, 1], episodes=1, seed=0, costs=FIXED, out=tmp_path)
    assert not (tmp_path / "units").exists()  # refused while checking the budgets: no episode ran


def test_a_budget_bounds_all_a_policy_holds_and_gives_dms_the_pages_of_the_same_frames(tiny_model):
    config = load_model_config(tiny_model)
    spec, prompt, tokens = TaskSpec(time_limit_s=1.0), 6, config.vision.tokens_per_frame
    scratch, episode_frames = config.action.dof, 31  # bins: one slot per action dimension; 30 Hz x 1 s + 1
    fifo_slots, fifo_pool = arena_for(config, make_policy("fifo"), prompt, 8, spec, 16)
    assert (fifo_slots, fifo_pool) == (prompt + 8 * tokens + scratch, 0)  # 0: the dense pool of those slots
    dms = make_policy("dms", {"kv.dms.window": 32})
    slots, pool = arena_for(config, dms, prompt, 8, spec, 16)
    heads = config.num_hidden_layers * config.num_key_value_heads
    assert pool == heads * -(-fifo_slots // 16)  # fifo's bytes at 8 frames, the window inside them
    assert slots == prompt + 32 + episode_frames * tokens + scratch  # and a slot for every frame of the episode
    assert arena_for(config, dms, prompt, None, spec, 16) == (slots, 0)  # all: room for everything, dense pool


# --- execution modes side by side: how the robot is commanded -------------------------------------------------


@pytest.fixture(scope="module")
def chunk16_model(tmp_path_factory):
    """The tiny preset, 1 layer, with an mlp head giving 16 actions of 7 a cycle."""
    from vla_edge_ros.model.init_model import preset, write_random_model

    return write_random_model(tmp_path_factory.mktemp("chunked") / "m", preset("tiny", layers=1, head="mlp", chunk=16),
                              seed=2)


def test_jerk_is_the_second_difference_of_the_commanded_velocity_over_dt_squared():
    dt = 0.1
    assert jerk(np.zeros((5, 2)), dt).tolist() == [0.0, 0.0, 0.0]
    ramp = np.arange(6, dtype=float)[:, None] * [1.0, -2.0]  # constant acceleration: no jerk
    assert np.allclose(jerk(ramp, dt), 0.0)
    bump = np.array([[0, 0], [0, 0], [3, 4], [0, 0], [0, 0]], dtype=float)  # one tick of motion, |v| = 5
    assert np.allclose(jerk(bump, dt), [500.0, 1000.0, 500.0])
    assert jerk(np.zeros((2, 2)), dt).size == 0


def test_execution_modes_run_side_by_side_and_report_jerk_starvation_and_distinct_commands(chunk16_model, tmp_path):
    """A 100 ms model with 16-action chunks at 30 Hz: sync refuses every cycle once warm on the 33 ms deadline and
    changes its command a few times a second; the chunked modes plan on the horizon, are never refused, never
    starve, and command a new action every tick once warm. The expert's row is the reference: no execution."""
    costs = parse_cost("fixed:encode=100ms,decode=1ms")
    settings = _settings(chunk16_model)
    report = evaluate(settings, TaskSpec(name="reach", time_limit_s=1.0), ["fifo"], [2], episodes=1, seed=0,
                      costs=costs, out=tmp_path, executions=["sync", "chunk", "rtc"])
    cells = {c["execution"]: c for c in report["cells"]}
    assert list(cells) == [None, "sync", "chunk", "rtc"] and cells[None]["variant"] == EXPERT
    sync, chunk, rtc = cells["sync"], cells["chunk"], cells["rtc"]
    assert sync["refused"] > 10 and chunk["refused"] == rtc["refused"] == 0 == chunk["missed"]
    assert chunk["starved_share"] == rtc["starved_share"] == 0.0
    assert sync["distinct_commands_hz"] < 10  # once warm, every tick a new action: the wait before is not counted
    assert chunk["distinct_commands_hz"] == rtc["distinct_commands_hz"] == pytest.approx(30.0)
    assert all(c["jerk_rms"] > 0 for c in (sync, chunk, rtc))
    expert = cells[None]
    assert expert["starved_share"] == 0.0 and expert["jerk_rms"] is not None and expert["distinct_commands_hz"] > 0
    table = format_table(report)
    assert " exec " in table and "   rtc " in table and "jerk: RMS over ticks" in table
    default = evaluate(settings, TaskSpec(name="reach", time_limit_s=1.0), ["fifo"], [2], episodes=1, seed=0,
                       costs=costs, out=tmp_path / "default")
    assert [c["execution"] for c in default["cells"]] == [None, "rtc"]  # auto: rtc for a chunked checkpoint
    assert {k: v for k, v in default["cells"][1].items() if k != "execution"} == {
        k: v for k, v in rtc.items() if k != "execution"}  # the same episodes as the rtc cell, figure for figure


def test_the_execution_flag_takes_a_subset_of_the_modes(capsys):
    args = build_parser().parse_args(["evaluate", "--execution", "sync, rtc",
                                      "--cost", "fixed:encode=250ms,decode=5ms"])
    assert args.execution == ("sync", "rtc") and args.cost.describe() == "fixed:encode=250ms,decode=5ms"
    assert build_parser().parse_args(["evaluate"]).execution is None
    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", "--execution", "sync,diffusion"])
    assert exit_info.value.code == 2 and "auto,sync,chunk,ensemble,rtc" in capsys.readouterr().err
