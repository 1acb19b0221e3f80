"""A new instruction that keeps the episode memory: the new prompt is prefilled in front, reading only itself,
and the kept tokens move behind it with their keys rotated exactly."""

from __future__ import annotations

import numpy as np
import pytest

from vla_edge_ros.config import MemoryKnobs
from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.memory import build_policy
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.model.vl.frames import with_frame_geometry
from vla_edge_ros.numerics import ops
from vla_edge_ros.worlds.synthetic import SyntheticCamera

OLD, NEW = [11, 402, 77, 1030, 6], [21, 5, 900, 14, 77, 3, 8, 1200, 44]


def _engine(checkpoint, policy: str = "fifo", capacity: int = 128) -> VlaEngine:
    engine = VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=capacity,
                       policy=build_policy(MemoryKnobs.of({"kv.policy": policy})))
    engine.set_prompt(OLD)
    return engine


def _frames(engine: VlaEngine, count: int) -> None:
    camera = SyntheticCamera(height=48, width=64, seed=3)
    for _ in range(count):
        engine.step(camera.frame())


@pytest.fixture(scope="module")
def checkpoint(tiny_model):
    return load_checkpoint(tiny_model)


def test_the_new_prompt_is_what_a_fresh_prefill_gives_and_the_kept_keys_are_rotated_exactly(checkpoint):
    engine = _engine(checkpoint)
    _frames(engine, 3)
    kept = engine.arena.slots_in_order()[len(OLD):]
    before_keys, before_values = engine.backend.read_kv(kept)
    before_positions = engine.arena.positions[kept].copy()
    assert engine.replace_prompt(NEW) == 0  # room enough: nothing let go
    fresh = _engine(checkpoint)
    fresh.set_prompt(NEW)
    mine, theirs = engine.prompt_kv(), fresh.prompt_kv()
    assert mine["token_ids"].tolist() == NEW and mine["positions"].tolist() == list(range(len(NEW)))
    np.testing.assert_allclose(mine["keys"], theirs["keys"], atol=1e-6)
    np.testing.assert_allclose(mine["values"], theirs["values"], atol=1e-6)
    after_keys, after_values = engine.backend.read_kv(kept)
    shift = len(NEW) - len(OLD)
    assert engine.arena.positions[kept].tolist() == (before_positions + shift).tolist()
    cos, sin = ops.rope_cos_sin(np.full(kept.size, shift, np.int32), engine.backend.inv_freq)
    rotated = np.stack([ops.apply_rope(layer.transpose(1, 0, 2), cos, sin).transpose(1, 0, 2)
                        for layer in before_keys])
    np.testing.assert_allclose(after_keys, rotated, atol=1e-5)
    np.testing.assert_array_equal(after_values, before_values)
    assert engine.policy.frames_kept() == 3
    assert np.isfinite(engine.step(SyntheticCamera(height=48, width=64, seed=9).frame()).action).all()


def test_a_longer_prompt_in_a_full_arena_lets_the_oldest_frames_go(checkpoint):
    engine = _engine(checkpoint, capacity=len(OLD) + 4 * 16 + 2)  # the old prompt, four frames, two slots
    _frames(engine, 6)
    kept, free = engine.policy.frames_kept(), engine.arena.capacity - engine.arena.used
    longer = NEW + [7] * (len(OLD) + free + 1 - len(NEW))  # one token more than the old prompt and the free slots
    assert engine.replace_prompt(longer) == 1 and engine.policy.frames_kept() == kept - 1
    order = engine.arena.slots_in_order()
    assert engine.arena.positions[order].tolist() == list(range(order.size))  # no gap, prompt first
    assert order[:len(longer)].tolist() == engine.prompt_slots.tolist()


@pytest.mark.parametrize("policy", ["cosine", "aura", "dms"])
def test_every_policy_keeps_its_memory_across_a_new_prompt(checkpoint, policy):
    engine = _engine(checkpoint, policy)
    _frames(engine, 4)
    stats = engine.memory_stats()
    engine.replace_prompt(NEW)
    assert engine.memory_stats().frames_seen == stats.frames_seen  # the episode goes on
    order = engine.arena.slots_in_order()
    assert engine.arena.positions[engine.prompt_slots].tolist() == list(range(len(NEW)))
    assert (engine.arena.positions[order[len(NEW):]] >= len(NEW)).all()
    assert np.isfinite(engine.step(SyntheticCamera(height=48, width=64, seed=9).frame()).action).all()


def test_a_vl_checkpoint_re_packs_the_kept_images_behind_the_new_prompt(tmp_path):
    checkpoint = with_frame_geometry(load_checkpoint(write_random_model(tmp_path / "vl", preset("qwen2-vl-tiny"),
                                                                        seed=0)), 56 * 56)
    engine = VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=512)
    engine.set_prompt(OLD)
    camera = SyntheticCamera(height=56, width=56, seed=3)
    for _ in range(2):
        engine.step(camera.frame())
    engine.replace_prompt(NEW)
    order = engine.arena.slots_in_order()
    rope = engine.arena.rope_positions[:, order]
    assert rope[:, :len(NEW)].tolist() == [list(range(len(NEW)))] * 3  # text ids 0..n-1 for the prompt
    assert rope[0, len(NEW)] == len(NEW)  # the first kept image right behind it
    assert np.isfinite(engine.step(camera.frame()).action).all()
