"""The VLA engine: frames in, actions out, on a bounded arena whose positions never run away."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest

from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.config import ActionConfig
from vla_edge_ros.model.init_model import preset, write_random_model
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
