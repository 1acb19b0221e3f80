"""The VLA engine: frames in, actions out, on a bounded arena whose positions never run away."""

from __future__ import annotations

import copy
import re
from dataclasses import replace

import numpy as np
import pytest

from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.config import ActionConfig, StateConfig
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.model.state_token import StateError
from vla_edge_ros.model.vision import FrameError
from vla_edge_ros.worlds.synthetic import SyntheticCamera

PROMPT = [11, 402, 77, 1030, 6]


@pytest.fixture
def engine(tiny_model):
    engine = VlaEngine(load_checkpoint(tiny_model), backend="numpy", kv_capacity_tokens=96)
    engine.set_prompt(PROMPT)
    return engine


def test_step_decodes_one_bin_token_per_dof_within_the_action_range(engine):
    result = engine.step(SyntheticCamera(seed=1).frame())
    head = engine.head
    assert len(result.tokens) == engine.config.action.dof
    assert all(head.first_bin_token <= t < engine.config.vocab_size for t in result.tokens)
    assert result.action.shape == (engine.config.action.dof,)
    assert np.all(np.abs(result.action) <= 1.0)
    assert engine.arena.used == len(PROMPT) + engine.tokens_per_frame  # action tokens were scratch


def test_warm_up_leaves_the_episode_as_it_started(tiny_model, engine):
    frame = SyntheticCamera(seed=7).frame()
    engine.warm_up()
    assert engine.arena.used == len(PROMPT) and engine.policy.frames_kept() == 0
    cold = VlaEngine(load_checkpoint(tiny_model), backend="numpy", kv_capacity_tokens=96)
    cold.set_prompt(PROMPT)
    assert engine.step(frame).tokens == cold.step(frame).tokens


def test_bins_match_huggingface_greedy_decoding_over_the_same_embeddings(tiny_model, engine):
    torch = pytest.importorskip("torch")
    from vla_edge_ros.tools.parity import load_reference

    frame = SyntheticCamera(seed=2).frame()
    result = engine.step(frame)
    model = load_reference(tiny_model)
    table = model.get_input_embeddings().weight.detach().numpy()
    sequence = np.concatenate([table[PROMPT], engine.encoder.encode(frame)])
    tokens = []
    with torch.no_grad():
        for _ in range(engine.config.action.dof):
            logits = model(inputs_embeds=torch.from_numpy(sequence[None]), use_cache=False).logits[0, -1].numpy()
            token = engine.head.first_bin_token + int(np.argmax(logits[engine.head.bin_rows]))
            tokens.append(token)
            sequence = np.concatenate([sequence, table[[token]]])
    assert result.tokens == tokens


def test_positions_and_memory_stay_bounded_over_a_long_episode(engine):
    camera = SyntheticCamera(height=48, width=64, seed=3)
    capacity = engine.arena.capacity
    for _ in range(60):
        engine.step(camera.frame())
        assert engine.arena.used <= capacity
        assert engine.arena.positions.max() < capacity
        # the pinned prompt stays first, in order
        np.testing.assert_array_equal(engine.arena.positions[engine.prompt_slots], np.arange(len(PROMPT)))
    assert engine.arena.valid[engine.prompt_slots].all()


def _prefill_frame(engine: VlaEngine, embeddings: np.ndarray) -> np.ndarray:
    slots = engine.arena.allocate(engine.tokens_per_frame)
    start = engine.arena.next_position()
    positions = np.arange(start, start + engine.tokens_per_frame, dtype=np.int32)
    return engine.backend.forward(positions, slots, embeddings=embeddings).hidden


def test_shifting_every_cached_position_is_invisible_to_the_model(engine):
    """RoPE attention sees relative positions only: rotating all keys by the same shift changes nothing."""
    camera = SyntheticCamera(height=48, width=64, seed=4)
    for _ in range(2):
        engine.step(camera.frame())
    shifted = copy.deepcopy(engine)
    slots = shifted.arena.slots_in_order()
    shifted.backend.rotate_keys(slots, np.full(slots.size, 9, dtype=np.int32))
    shifted.arena.positions[slots] += 9
    frame = engine.encoder.encode(camera.frame())
    np.testing.assert_allclose(_prefill_frame(engine, frame), _prefill_frame(shifted, frame), rtol=1e-4, atol=1e-4)


def test_compaction_closes_holes_and_keeps_order(engine):
    camera = SyntheticCamera(height=48, width=64, seed=5)
    for _ in range(3):
        engine.step(camera.frame())
    engine.arena.release(engine.policy.frames.pop(0))
    before = engine.arena.slots_in_order()
    engine.compact_positions()
    np.testing.assert_array_equal(engine.arena.slots_in_order(), before)
    np.testing.assert_array_equal(engine.arena.positions[before], np.arange(before.size))


def test_linear_head(tmp_path):
    config = replace(preset("tiny", layers=1), action=ActionConfig(head="linear", dof=3, q01=(-2.0, 0.0, -1.0),
                                                                     q99=(2.0, 4.0, 1.0), normalize_mask=(True, True, False)))
    engine = VlaEngine(load_checkpoint(write_random_model(tmp_path / "lin", config)), backend="numpy",
                       kv_capacity_tokens=64)
    engine.set_prompt([1, 2])
    result = engine.step(SyntheticCamera(height=32, width=32).frame())
    assert result.tokens == [] and result.action.shape == (3,)
    assert -2.0 <= result.action[0] <= 2.0 and 0.0 <= result.action[1] <= 4.0 and -1.0 <= result.action[2] <= 1.0


@pytest.mark.parametrize("frame", [
    np.zeros((32, 32), np.uint8),
    np.zeros((32, 32, 4), np.uint8),
    np.zeros((32, 32, 3), np.float32),
    np.zeros((0, 32, 3), np.uint8),
    "not an image",
])
def test_bad_frames_are_refused_and_change_nothing(engine, frame):
    used = engine.arena.used
    with pytest.raises(FrameError):
        engine.step(frame)
    assert engine.arena.used == used


def test_prompt_that_leaves_no_room_is_refused(tiny_model):
    engine = VlaEngine(load_checkpoint(tiny_model), backend="numpy", kv_capacity_tokens=32)
    with pytest.raises(ValueError, match="no room"):
        engine.set_prompt(list(range(20)))


def test_backend_choice(tiny_model):
    from vla_edge_ros.model.backends import resolve_backend

    assert resolve_backend("auto") == "numpy"  # the simulator never counts as a GPU
    with pytest.raises(ValueError, match="backend must be one of"):
        VlaEngine(load_checkpoint(tiny_model), backend="tpu", kv_capacity_tokens=256)


def test_cuda_without_a_gpu_is_a_clear_error(tiny_model):
    import subprocess
    import sys

    code = ("from vla_edge_ros.model.checkpoint import load_checkpoint\n"
            "from vla_edge_ros.engine import VlaEngine\n"
            f"VlaEngine(load_checkpoint({str(tiny_model)!r}), backend='cuda', kv_capacity_tokens=256)\n")
    env = {**__import__("os").environ, "NUMBA_ENABLE_CUDASIM": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0
    assert "no CUDA GPU is usable here" in done.stderr


def test_arena_too_small_for_one_frame(tiny_model):
    with pytest.raises(ValueError, match="cannot hold one frame"):
        VlaEngine(load_checkpoint(tiny_model), backend="numpy", kv_capacity_tokens=16)


@pytest.mark.slow  # ~25 s simulated; the default suite's CUDA end-to-end check is test_parity's bf16 case
def test_cuda_backend_engine_decodes_the_same_action_as_numpy(tmp_path):
    """A whole VLA cycle (frame prefill + bin decoding) on the CUDA kernels, here under the simulator."""
    config = replace(preset("tiny", layers=1), hidden_size=16, intermediate_size=24, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=8, vocab_size=256,
                     vision=replace(preset("tiny").vision, image_size=16, patch_size=4, tokens_per_frame=4),
                     action=ActionConfig(head="bins", dof=2))
    checkpoint = load_checkpoint(write_random_model(tmp_path / "micro", config, seed=1))
    frame = SyntheticCamera(height=16, width=16, seed=6).frame()
    results = {}
    for backend in ("numpy", "cuda"):
        engine = VlaEngine(checkpoint, backend=backend, kv_capacity_tokens=12)
        engine.set_prompt([3, 4])
        results[backend] = engine.step(frame)
    assert results["cuda"].tokens == results["numpy"].tokens
    np.testing.assert_array_equal(results["cuda"].action, results["numpy"].action)


def test_a_refused_decode_step_abandons_the_action_but_keeps_the_frame(engine):
    answers = iter([True, False])
    done = []
    prefill = engine.add_frame(SyntheticCamera(height=48, width=64, seed=8).frame())
    assert engine.decode_action(prefill, admit=lambda: next(answers), done=done.append) is None
    assert done == [True]  # the one admitted step was reported, the refused one was not run
    assert engine.arena.used == len(PROMPT) + engine.tokens_per_frame and engine.policy.frames_kept() == 1


# --- an observation: several cameras and the robot's state ---------------------------------------------------

STATE_MEAN, STATE_STD = (0.5, -1.0, 2.0), (0.25, 2.0, 4.0)


@pytest.fixture(scope="module")
def observing_model(tmp_path_factory):
    """The tiny model seeing two cameras and a 3-value state, with normalisation statistics."""
    config = replace(preset("tiny", cameras=2, state_dim=3),
                     state=StateConfig(3, mean=STATE_MEAN, std=STATE_STD))
    return write_random_model(tmp_path_factory.mktemp("models") / "observing", config, seed=3)


@pytest.fixture
def observing(observing_model):
    engine = VlaEngine(load_checkpoint(observing_model), backend="numpy", kv_capacity_tokens=160)
    engine.set_prompt(PROMPT)
    return engine


def test_an_observation_is_each_cameras_tokens_then_the_normalised_projected_state(observing):
    front, wrist = SyntheticCamera(seed=1).frame(), SyntheticCamera(seed=2).frame()
    state = np.array([1.0, 3.0, -2.0])
    embeddings = observing.encode_frame(front, (wrist,), state).embeddings
    tokens = observing.tokens_per_frame
    assert embeddings.shape == (2 * tokens + 1, observing.config.hidden_size) == (observing.observation_tokens, 256)
    np.testing.assert_array_equal(embeddings[:tokens], observing.encoder.encode(front))
    np.testing.assert_array_equal(embeddings[tokens:2 * tokens], observing.encoder.encode(wrist))
    checkpoint = observing.checkpoint
    z = (state - np.array(STATE_MEAN)) / np.array(STATE_STD)  # [2, 1, -1]
    expected = checkpoint.float32("state_proj.weight") @ z + checkpoint.float32("state_proj.bias")
    np.testing.assert_allclose(embeddings[-1], expected, rtol=1e-5, atol=1e-6)
    result = observing.step(front, (wrist,), state)
    assert observing.arena.used == len(PROMPT) + 33 and result.action.shape == (7,)


def test_the_observation_matches_huggingface_greedy_decoding_over_the_same_embeddings(observing_model, observing):
    """The state token (computed here from the tensors, apart from the engine) after both cameras' tokens, after the
    prompt: transformers' greedy bins over that sequence are the engine's."""
    torch = pytest.importorskip("torch")
    from vla_edge_ros.tools.parity import load_reference

    front, wrist = SyntheticCamera(seed=3).frame(), SyntheticCamera(seed=4).frame()
    state = np.array([0.7, -0.2, 5.0])
    result = observing.step(front, (wrist,), state)
    checkpoint = observing.checkpoint
    token = (checkpoint.float32("state_proj.weight") @ ((state - STATE_MEAN) / np.array(STATE_STD))
             + checkpoint.float32("state_proj.bias"))
    model = load_reference(observing_model)
    table = model.get_input_embeddings().weight.detach().numpy()
    sequence = np.concatenate([table[PROMPT], observing.encoder.encode(front), observing.encoder.encode(wrist),
                               token[None]]).astype(np.float32)
    tokens = []
    with torch.no_grad():
        for _ in range(observing.config.action.dof):
            logits = model(inputs_embeds=torch.from_numpy(sequence[None]), use_cache=False).logits[0, -1].numpy()
            tokens.append(observing.head.first_bin_token + int(np.argmax(logits[observing.head.bin_rows])))
            sequence = np.concatenate([sequence, table[tokens[-1:]]])
    assert result.tokens == tokens


@pytest.mark.parametrize("extra, state, error, words", [
    ((), [0.0, 0.0, 0.0], FrameError, "sees 2 cameras per observation, got 1 frames"),
    ("twice", [0.0, 0.0, 0.0], FrameError, "sees 2 cameras per observation, got 3 frames"),
    ("once", None, StateError, "reads a robot state of 3 values, and none was given"),
    ("once", [0.0, 0.0], StateError, "must be 3 values, got shape \\[2\\]"),
    ("once", [0.0, np.nan, 0.0], StateError, "holds NaN or Inf"),
    ("once", [0.0, 0.0, np.inf], StateError, "holds NaN or Inf"),
    ("once", [3e38, 0.0, 0.0], StateError, "overflows once normalised"),  # finite, then / 0.25: not any more
])
def test_an_observation_the_model_does_not_read_is_refused_and_changes_nothing(observing, extra, state, error, words):
    frame = SyntheticCamera(seed=5).frame()
    extra = {"once": (frame,), "twice": (frame, frame)}.get(extra, extra)
    before = observing.arena.used
    with pytest.raises(error, match=words):
        observing.step(frame, extra, None if state is None else np.array(state))
    assert observing.arena.used == before and observing.policy.frames_kept() == 0


def test_a_state_given_to_a_model_without_one_is_refused(engine):
    with pytest.raises(StateError, match="reads no robot state, and one was given"):
        engine.step(SyntheticCamera(seed=1).frame(), (), np.zeros(3))


def test_warm_up_of_an_observing_model_leaves_the_episode_as_it_started(observing):
    assert observing.warm_up() == "" and observing.arena.used == len(PROMPT)


@pytest.mark.parametrize("vla, words", [
    ({"state": {"dim": 3, "std": [1.0, 0.0, 1.0]}}, "vla.state.std must be positive"),
    ({"state": {"dim": 3, "mean": [1.0]}}, "vla.state.mean has 1 entries, dim is 3"),
    ({"state": {"dim": 3, "mean": [1.0, float("nan"), 0.0]}}, "vla.state.mean must hold finite numbers"),
    ({"state": {"dim": 0}}, "vla.state.dim must be at least 1"),
    ({"state": {"dim": "3"}}, "vla.state must be a mapping with an integer dim"),
    ({"state": {"dim": 3, "scale": 2}}, "bad 'vla' section"),
    ({"cameras": 0}, "vla.cameras must be 1 to 16, got 0"),
    ({"cameras": 2.0}, "vla.cameras must be an integer"),
])
def test_a_bad_observation_in_config_json_is_refused_naming_the_key(observing_model, tmp_path, vla, words):
    import json
    import shutil

    copy_dir = tmp_path / "model"
    shutil.copytree(observing_model, copy_dir)
    config = json.loads((copy_dir / "config.json").read_text())
    config["vla"].update(vla)
    (copy_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=re.escape(words)):
        load_checkpoint(copy_dir)


def test_a_state_projection_and_its_statistics_come_together(observing_model, tmp_path):
    """Without vla.state the projection's input is unknown; without state_proj the state cannot be read."""
    import json
    import shutil

    from vla_edge_ros.model.safetensors_io import read_safetensors, write_safetensors

    no_stats = tmp_path / "no_stats"
    shutil.copytree(observing_model, no_stats)
    config = json.loads((no_stats / "config.json").read_text())
    del config["vla"]["state"]
    (no_stats / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=re.escape("['state_proj.weight', 'state_proj.bias'] project a robot state, "
                                                   "but config.json has no vla.state")):
        load_checkpoint(no_stats)
    no_tensors = tmp_path / "no_tensors"
    shutil.copytree(observing_model, no_tensors, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = {name: t for name, t in read_safetensors(observing_model / "model.safetensors").items()
               if not name.startswith("state_proj.")}
    write_safetensors(no_tensors / "model.safetensors", tensors)  # the copy's file: the source stays mapped
    with pytest.raises(ValueError, match=re.escape("tensor 'state_proj.weight' is missing (expected shape [256, 3])")):
        load_checkpoint(no_tensors)
