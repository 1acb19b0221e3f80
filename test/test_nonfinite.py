"""A corrupt checkpoint never drives the robot (issue 22).

Weights holding NaN or Inf are refused at load, naming the tensor and the count. Loaded anyway (the
debugging knob), or overflowing from finite weights, a non-finite hidden state or logit is an invalid
cycle: no action, no fresh command, counted and reported; replay and evaluate say so and exit 2.
"""

from __future__ import annotations

import csv
import json
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from vla_edge_ros.config import parse_settings
from vla_edge_ros.model.checkpoint import CheckpointError, load_checkpoint
from vla_edge_ros.model.config import ModelConfigError, load_model_config
from vla_edge_ros.model.init_model import preset, write_model, write_random_model
from vla_edge_ros.model.safetensors_io import StoredTensor, read_safetensors
from vla_edge_ros.numerics.bf16 import bf16_bits
from vla_edge_ros.numerics.finite import NonFiniteError, count_nonfinite_bits
from vla_edge_ros.runtime.block_costs import parse_cost
from vla_edge_ros.runtime.clock import VirtualClock
from vla_edge_ros.runtime.driver import Driver
from vla_edge_ros.runtime.loader import load_engine
from vla_edge_ros.runtime.reasoning_health import Level, ReasoningHealth
from vla_edge_ros.config import DiagnosticsKnobs
from vla_edge_ros.runtime.admission import AdmissionGate
from vla_edge_ros.worlds.synthetic import SyntheticCamera

COSTS = parse_cost("fixed:encode=8ms,decode=1ms")
BAD = {"nan": np.nan, "inf": np.inf}


# --- counting non-finite values on the stored bits -------------------------------------------------------


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16", "F64"])
def test_count_nonfinite_bits_agrees_with_isfinite_in_every_float_format(dtype):
    """NaN, +-Inf, the largest finite values and subnormals, in each storage format: the exponent-bit count is
    exactly NumPy's count of non-finite values after widening."""
    rng = np.random.default_rng(3)
    values = rng.standard_normal(10_001).astype(np.float32) * 10.0
    values[[0, 17, 5_000, 10_000]] = [np.nan, np.inf, -np.inf, np.nan]
    values[[1, 2]] = [3.0e38, 1e-40]  # finite in fp32 and bf16 (huge, subnormal)
    stored = {"F32": values, "F16": values.astype(np.float16), "BF16": bf16_bits(values),
              "F64": values.astype(np.float64)}[dtype]
    tensor = StoredTensor(dtype, stored)
    expected = int((~np.isfinite(tensor.to_float32() if dtype != "F64" else stored)).sum())
    assert tensor.nonfinite_count() == expected >= 4


def test_count_nonfinite_bits_reads_integer_tensors_as_finite_and_spans_chunks():
    assert count_nonfinite_bits(np.full(100, 0x7FC0, np.uint16).view(np.int16), "I16") == 0
    assert count_nonfinite_bits(np.arange(10, dtype=np.int64), "I64") == 0
    big = np.zeros((1 << 22) + 5, np.float32)
    big[[0, (1 << 22) - 1, 1 << 22, (1 << 22) + 4]] = np.nan  # both sides of the chunk boundary
    assert count_nonfinite_bits(big, "F32") == 4


# --- the loader refuses non-finite weights ---------------------------------------------------------------


def _corrupt(source: Path, out: Path, value: float, names: list[str] | None = None, rows: slice = slice(None)) -> Path:
    """A copy of the checkpoint at ``source`` with ``value`` written into ``rows`` of tensors ``names`` (all
    when None)."""
    config = load_model_config(source)
    arrays = {name: t.to_float32().copy() for name, t in read_safetensors(source / "model.safetensors").items()}
    dtype = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[
        read_safetensors(source / "model.safetensors")["model.norm.weight"].dtype]
    for name in names or list(arrays):
        arrays[name][rows] = value
    return write_model(out, config, arrays, dtype)


@pytest.fixture(scope="module")
def sim_model(tmp_path_factory) -> Path:
    """A random model with the linear head (the shape of models/sim)."""
    return write_random_model(tmp_path_factory.mktemp("models") / "sim", preset("sim"), seed=0)


@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_loader_refuses_non_finite_weights_naming_the_tensor_and_count(tiny_model, tmp_path, bad, dtype):
    source = write_random_model(tmp_path / "src", preset("tiny"), seed=0, dtype=dtype)
    target = _corrupt(source, tmp_path / "bad", BAD[bad], ["model.layers.2.mlp.up_proj.weight"], slice(3, 5))
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(target)
    message = str(error.value)
    assert "'model.layers.2.mlp.up_proj.weight' (512 of 196,608)" in message and "not finite" in message
    assert "reasoning.allow_nonfinite_weights" in message
    assert load_checkpoint(target, allow_nonfinite=True).tensors["model.layers.2.mlp.up_proj.weight"].nonfinite_count() == 512


def test_loader_names_at_most_three_tensors(tiny_model, tmp_path):
    target = _corrupt(tiny_model, tmp_path / "bad", np.nan)
    with pytest.raises(CheckpointError, match=r"tensor\(s\) hold NaN or Inf values: .* and \d+ more; "):
        load_checkpoint(target)


@pytest.mark.parametrize("field, value", [("q01", [float("nan")] * 2), ("q99", [float("inf")] * 2),
                                          ("mean", [float("nan")] * 3), ("std", [0.0, 0.5, 0.5])])
def test_non_finite_action_bounds_and_image_statistics_are_refused(sim_model, tmp_path, field, value):
    """q01/q99 of NaN passed 'q01 < q99' (every comparison with NaN is false) and unnormalized every action to NaN."""
    target = tmp_path / "model"
    target.mkdir()
    for name in ("model.safetensors",):
        (target / name).symlink_to(sim_model / name)
    config = json.loads((sim_model / "config.json").read_text())
    config["vla"]["action" if field in ("q01", "q99") else "vision"][field] = value
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match=field):
        load_checkpoint(target)


# --- a non-finite output is an invalid cycle: no fresh command, for every head ----------------------------


def _settings(model_dir: Path, **reasoning) -> object:
    return parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(model_dir), "backend": "numpy", "kv_capacity_tokens": 128,
                                          "allow_nonfinite_weights": True, **reasoning}},
        "action_publisher": {"ros__parameters": {"command_type": "float32_multi_array"}}}, "test.yaml")


def _drive(model_dir: Path, frames: int = 12) -> tuple[list, list]:
    """The live pipeline's schedule on the virtual clock: (cycle results, commands at 50 Hz)."""
    settings = _settings(model_dir)
    driver = Driver(load_engine(settings).engine, settings, VirtualClock(0), COSTS, (48, 64))
    camera = SyntheticCamera(height=48, width=64, seed=4)
    results, commands = [], []
    for index in range(frames):
        now = index * 33_333_333
        driver.camera(camera.frame(), stamp_ns=index, arrival_ns=now)
        if driver.clock() <= now:
            driver.clock.wait_until(now)
            results.append(driver.reason().result)
        commands += [driver.command(now + tick * 20_000_000) for tick in (0, 1)]
    return results, commands


CORRUPTIONS = {
    # every weight (the reproduction: a data section overwritten with NaN or Inf)
    "all-nan": dict(value=np.nan), "all-inf": dict(value=np.inf),
    # the head alone: the hidden state is finite, the logits (bins rows / linear head) are not
    "head-nan": dict(value=np.nan, head=True), "head-inf": dict(value=np.inf, head=True),
    # finite weights (bf16's largest) that overflow fp32 in the head: +-Inf logits, which tanh would have read as
    # full speed; the loader cannot see this one
    "head-overflow": dict(value=3.0e38, head=True),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
@pytest.mark.parametrize("head", ["bins", "linear"])
def test_a_non_finite_output_gives_no_fresh_command_for_either_head(tiny_model, sim_model, tmp_path, head, case):
    spec = CORRUPTIONS[case]
    source = tiny_model if head == "bins" else sim_model
    if spec.get("head"):
        names, rows = (["lm_head.weight"], slice(-256, None)) if head == "bins" else (["action_head.weight"], slice(None))
    else:
        names, rows = None, slice(None)
    target = _corrupt(source, tmp_path / "bad", spec["value"], names, rows)
    results, commands = _drive(target)
    assert results and all(r.invalid and r.action is None for r in results), [r.invalid for r in results]
    assert all(command.safe_stop and command.values is not None and all(v == 0.0 for v in command.values)
               for command in commands)
    if spec.get("head"):  # the frame's hidden state was fine: the head's input is what went bad
        assert "logits" in results[0].invalid or "head's input" in results[0].invalid


def test_finite_weights_still_act(tiny_model):
    """The same schedule on the intact model: every cycle acts (the test above can fail)."""
    results, commands = _drive(tiny_model)
    assert results and all(r.action is not None and not r.invalid for r in results)
    assert any(not command.safe_stop for command in commands)


def test_the_engine_raises_rather_than_returning_a_nan_action(tiny_model, tmp_path):
    engine = load_engine(_settings(_corrupt(tiny_model, tmp_path / "bad", np.nan))).engine
    with pytest.raises(NonFiniteError, match="the frame's last hidden state: not finite"):
        engine.step(np.zeros((64, 64, 3), np.uint8))


def test_reasoning_health_reports_invalid_outputs_as_an_error_never_as_acting(tiny_model):
    health = ReasoningHealth(DiagnosticsKnobs.of({}))
    gate = AdmissionGate.from_settings(_settings(tiny_model)["reasoning"])
    for i in range(30):
        health.record("invalid", i * 33_000_000)
    judged = health.judge(30 * 33_000_000, gate.snapshot())
    assert judged.level is Level.ERROR and "not finite" in judged.message and "acting on" not in judged.message
    assert judged.shares["invalid"] == 1.0


# --- the command line: refusal at load, replay and evaluate, parity ---------------------------------------


def _cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vla_edge_ros", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def _nan_data_section(source: Path, out: Path) -> Path:
    """The issue's reproduction: every byte of the data section overwritten with bf16 NaN (0x7FC0)."""
    out.mkdir()
    (out / "config.json").write_bytes((source / "config.json").read_bytes())
    raw = bytearray((source / "model.safetensors").read_bytes())
    start = 8 + struct.unpack("<Q", raw[:8])[0]
    raw[start:] = np.full((len(raw) - start) // 2, 0x7FC0, np.uint16).tobytes()
    (out / "model.safetensors").write_bytes(bytes(raw))
    return out


def _config(path: Path, model_dir: Path, **reasoning) -> Path:
    path.write_text(yaml.safe_dump({
        "camera_subscriber": {"ros__parameters": {"frame_height": 48, "frame_width": 64}},
        "reasoning": {"ros__parameters": {"model_dir": str(model_dir), "backend": "numpy", "kv_capacity_tokens": 128,
                                          **reasoning}}}))
    return path


def test_run_and_plan_refuse_a_nan_checkpoint_in_one_line(tiny_model, tmp_path):
    bad = _nan_data_section(tiny_model, tmp_path / "tn")
    config = _config(tmp_path / "tn.yaml", bad)
    for command in (["plan"], ["run", "--sim", "reach", "--duration", "8"]):
        result = _cli(*command, "--config", str(config), cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "weights are not finite" in lines[0] and "Traceback" not in result.stderr
        assert "'model.embed_tokens.weight'" in lines[0]


def test_replay_counts_invalid_outputs_apart_and_exits_2(tiny_model, tmp_path):
    """Replay once wrote 60 of 60 frames as deadline hits with `nan` actions, and exited 0."""
    from replay_inputs import write_moving_bag

    bag = write_moving_bag(tmp_path)
    bad = _corrupt(tiny_model, tmp_path / "bad", np.nan)
    replay = ["replay", str(bag), "--policy", "fifo", "--cost", "fixed:encode=4ms,decode=1ms"]
    refused = _cli(*replay, "--config", str(_config(tmp_path / "a.yaml", bad)), "--out", str(tmp_path / "no"),
                   cwd=tmp_path)
    assert refused.returncode == 2 and "weights are not finite" in refused.stderr and "Traceback" not in refused.stderr
    out = tmp_path / "report"
    result = _cli(*replay, "--config", str(_config(tmp_path / "b.yaml", bad, allow_nonfinite_weights=True)),
                  "--out", str(out), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "not finite" in result.stderr and "Traceback" not in result.stderr
    fifo = json.loads((out / "report.json").read_text())["policies"]["fifo"]
    assert fifo["deadline_hits"] == fifo["actions"] == 0 and fifo["invalid"] > 0
    assert fifo["action_error"] is None
    with (out / "predictions_fifo.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    actions = [value for row in rows for name, value in row.items() if name.startswith("action_")]
    assert actions and all(value == "" for value in actions)  # no `nan` action: none at all
    assert sum(row["outcome"] == "invalid" for row in rows) == fifo["invalid"]
    assert "not finite" in (out / "report.md").read_text()


def test_parity_says_the_weights_are_not_finite(tiny_model, tmp_path):
    pytest.importorskip("transformers")
    bad = _corrupt(tiny_model, tmp_path / "bad", np.nan, ["model.layers.1.mlp.down_proj.weight"], slice(0, 1))
    refused = _cli("parity", "--model", str(bad), "--token-ids", "1,2,3", cwd=tmp_path)
    assert refused.returncode == 2 and "weights are not finite" in refused.stderr
    assert "'model.layers.1.mlp.down_proj.weight'" in refused.stderr
    result = _cli("parity", "--model", str(bad), "--token-ids", "1,2,3", "--allow-nonfinite-weights", cwd=tmp_path)
    assert result.returncode == 1 and "FAIL" in result.stdout
    assert "outputs are not finite, first at layer 2: NOT FINITE" in result.stdout, result.stdout


def test_evaluate_counts_invalid_outputs_and_exits_2(tiny_model, tmp_path):
    bad = _corrupt(tiny_model, tmp_path / "bad", np.nan, ["lm_head.weight"], slice(-256, None))
    config = tmp_path / "e.yaml"
    config.write_text(yaml.safe_dump({
        "camera_subscriber": {"ros__parameters": {"frame_height": 96, "frame_width": 96}},
        "reasoning": {"ros__parameters": {"model_dir": str(bad), "backend": "numpy", "allow_nonfinite_weights": True}}}))
    result = _cli("evaluate", "--config", str(config), "--task", "reach", "--policy", "fifo", "--budgets", "2",
                  "--episodes", "1", "--time-limit-s", "1", "--cost", "fixed:encode=4ms,decode=1ms",
                  "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "fifo: the model's output was not finite" in result.stderr and "Traceback" not in result.stderr
    fifo = next(c for c in json.loads((tmp_path / "out" / "evaluate.json").read_text())["cells"] if c["policy"] == "fifo")
    assert fifo["invalid"] > 0 and fifo["actions"] == 0 and fifo["refused"] == 0


# --- both backends: the CUDA kernels (here under the simulator) refuse as NumPy does -----------------------


def _micro(tmp_path: Path, head: str) -> Path:
    """A model small enough for the CUDA simulator: one layer, a 256-token vocabulary (all bins)."""
    from vla_edge_ros.model.config import ActionConfig

    config = replace(preset("tiny", layers=1), hidden_size=16, intermediate_size=24, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=8, vocab_size=256,
                     vision=replace(preset("tiny").vision, image_size=16, patch_size=4, tokens_per_frame=4),
                     action=ActionConfig(head=head, dof=2))
    return write_random_model(tmp_path / f"micro-{head}", config, seed=1)


@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize("head", ["bins", "linear"])
@pytest.mark.parametrize("backend", ["numpy", pytest.param("cuda", marks=pytest.mark.slow)])  # 15-55 s each
def test_both_backends_refuse_a_non_finite_head_input(tmp_path, backend, head, bad):
    from vla_edge_ros.engine import VlaEngine

    source = _micro(tmp_path, head)
    name = "lm_head.weight" if head == "bins" else "action_head.weight"
    checkpoint = load_checkpoint(_corrupt(source, tmp_path / "bad", BAD[bad], [name], slice(0, 1)),
                                 allow_nonfinite=True)
    engine = VlaEngine(checkpoint, backend=backend, kv_capacity_tokens=12)
    engine.set_prompt([3, 4])
    frame = SyntheticCamera(height=16, width=16, seed=6).frame()
    with pytest.raises(NonFiniteError, match="the action logits: not finite" if head == "bins" else "head's input"):
        engine.step(frame)
    intact = VlaEngine(load_checkpoint(source), backend=backend, kv_capacity_tokens=12)
    intact.set_prompt([3, 4])
    assert np.isfinite(intact.step(frame).action).all()
