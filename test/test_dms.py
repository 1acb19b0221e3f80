"""dms: per-KV-head delayed eviction. Hand-built cases with exact answers, then the real engine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from vla_edge_ros.config import ConfigError, DmsKnobs, MemoryKnobs, parse_settings
from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.kernels import reference as ref
from vla_edge_ros.memory import DmsPolicy, FifoPolicy, MemoryContext, make_policy
from vla_edge_ros.memory.dms_scores import LearnedGate
from vla_edge_ros.memory.dms_threshold import HISTORY_TOKENS
from vla_edge_ros.model.arena import KVArena
from vla_edge_ros.model.checkpoint import Checkpoint, CheckpointError, load_checkpoint
from vla_edge_ros.model.config import ActionConfig, ModelConfig, VisionConfig
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.model.memory_tensors import dms_gate_names
from vla_edge_ros.model.pages import PageTable
from vla_edge_ros.model.safetensors_io import StoredTensor, read_safetensors, write_safetensors
from vla_edge_ros.numerics import ops
from vla_edge_ros.runtime.loader import load_engine
from vla_edge_ros.tools.memory_bench.attention import probe_frame
from vla_edge_ros.worlds.synthetic import SyntheticCamera

KEEP, EVICT = 1.0, -1.0  # keep scores against the fixed threshold 0


# --- the arena's head masks and attention per KV head ----------------------------------------------------


def test_a_slot_is_released_only_when_every_head_has_stopped_reading_it():
    arena = KVArena(4)
    arena.set_layout((2, 2), per_head=True)
    arena.commit(np.array([0, 1], np.int32), np.array([0, 1], np.int32))
    assert arena.holds(np.arange(4))[:, :, :2].all() and not arena.holds(np.arange(4))[:, :, 2:].any()
    one_head = np.zeros((2, 2, 1), bool)
    one_head[1, 0] = True
    assert arena.hide(np.array([1], np.int32), one_head).size == 0  # layer 1 head 0 stops; the others read on
    assert arena.valid[1] and not arena.holds(np.array([1]))[1, 0, 0] and arena.holds(np.array([1]))[0, 0, 0]
    assert arena.pages.lengths.tolist() == [[2, 2], [1, 2]]
    freed = arena.hide(np.array([1], np.int32), np.ones((2, 2, 1), bool))
    assert freed.tolist() == [1] and not arena.valid[1] and arena.positions[1] == -1 and arena.used == 1


def test_numpy_attention_with_a_bias_per_kv_head_matches_the_paged_kernel_twin():
    rng = np.random.default_rng(0)
    k, v = rng.standard_normal((2, 2, 9, 8), dtype=np.float32)  # [kv_heads, slots, head_dim]
    q = rng.standard_normal((3, 4, 8), dtype=np.float32)  # 3 tokens, 2 query heads per KV head
    slot_pos, q_pos = np.arange(9, dtype=np.int32), np.array([6, 7, 8], np.int32)
    masks = np.ones((2, 9), bool)
    masks[0, [1, 4, 5]] = False
    masks[1, [0, 2]] = False
    table = PageTable((1, 2), capacity=9, page_tokens=2, per_head=True)  # the same heads, as pages
    table.add(np.arange(9, dtype=np.int32))
    table.remove(np.arange(9, dtype=np.int32), ~masks[None])
    k_pool, v_pool = np.zeros((2, table.num_pages * 2, 8), np.float32)
    rows = table.rows(np.arange(9))[0]
    k_pool[rows[masks]], v_pool[rows[masks]] = k[masks], v[masks]
    paged = (k_pool.reshape(-1, 2, 8), v_pool.reshape(-1, 2, 8), table.block_table[0], table.lengths[0],
             table.entry_slot)
    visible = masks[:, None, :] & (slot_pos[None, None, :] <= q_pos[None, :, None])  # [kv_heads, T, S]
    got = ops.gqa_attention(q, k, v, ops.attention_bias(visible), 0.35).reshape(3, 4, 8)
    np.testing.assert_allclose(got, ref.attention(q, *paged, slot_pos, q_pos, 0.35), rtol=1e-5, atol=1e-6)
    weights = ops.attention_weights(q[-1], k, ops.attention_bias(visible[:, -1]), 0.35)
    assert np.all(weights[:2, [1, 4, 5]] == 0) and np.all(weights[2:, [0, 2]] == 0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)


# --- the policy on a hand-built arena (scores given, no model) -------------------------------------------


def fake_engine(capacity: int, layers: int = 1, heads: int = 2, prompt: int = 1, page_tokens: int | None = None,
                pool_pages: int = 0) -> MemoryContext:
    """What dms reads of an engine, with no model: an arena with pages per head and a pinned prompt, keys of zeros."""
    arena = KVArena(capacity, page_tokens, pool_pages)
    arena.set_layout((layers, heads), per_head=True)
    arena.pinned = arena.allocate(prompt)
    arena.commit(arena.pinned, np.arange(prompt, dtype=np.int32))
    config = ModelConfig(hidden_size=4, intermediate_size=4, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=heads, vocab_size=8, head_dim=4, vision=VisionConfig(tokens_per_frame=1),
                         action=ActionConfig(head="linear", dof=1))

    def read_kv(slots):
        zeros = np.zeros((layers, heads, len(slots), 4), np.float32)
        return zeros, zeros

    return MemoryContext(Checkpoint(Path("fake"), config, {}, True), arena, read_kv, device="numpy")


def dms_knobs(**knobs) -> DmsKnobs:
    """``kv.dms.<name>`` knobs by short name; the rest take the schema's defaults."""
    return DmsKnobs.of({f"kv.dms.{name}": value for name, value in knobs.items()})


def dms(engine, **knobs) -> DmsPolicy:
    policy = DmsPolicy(dms_knobs(**{"target_ratio": 0.0, **knobs}))
    policy.attach(engine)
    policy.reset()
    return policy


def offer(policy: DmsPolicy, engine, *scores: list[float]) -> np.ndarray:
    """Make room for, place and admit one token per ``scores`` row ([layers * kv_heads] keep scores)."""
    scores_arr = np.asarray(scores, dtype=np.float32).reshape(len(scores), engine.config.num_hidden_layers,
                                                               engine.config.num_key_value_heads)
    policy.make_room(len(scores))
    slots = engine.arena.allocate(len(scores))
    start = engine.arena.next_position()
    engine.arena.commit(slots, np.arange(start, start + len(scores), dtype=np.int32))
    policy.admit(slots, scores_arr, frame=0)
    return slots


def test_a_token_is_read_by_every_head_inside_the_window_and_gone_from_the_evicting_head_after():
    engine = fake_engine(capacity=16)
    policy = dms(engine, window=3)
    token = offer(policy, engine, [EVICT, KEEP])  # head 0 evicts it, head 1 keeps it
    for _ in range(3):  # the window: three newer tokens may still read it through both heads
        assert engine.arena.holds(token)[0, :, 0].all()
        offer(policy, engine, [KEEP, KEEP])
    assert policy.pending_slots().tolist() == [2, 3, 4]  # the token left the window: its decision applied
    assert engine.arena.holds(token)[0, :, 0].tolist() == [False, True]
    assert engine.arena.valid[token] and policy.evictions == 0  # head 1 still reads it: the slot stays


def test_a_token_every_head_evicts_frees_its_slot_when_it_leaves_the_window():
    engine = fake_engine(capacity=16)
    policy = dms(engine, window=2)
    token = offer(policy, engine, [EVICT, EVICT])
    offer(policy, engine, [KEEP, KEEP], [KEEP, KEEP])  # one forward of two tokens: the window moves by two
    assert not engine.arena.valid[token] and policy.evictions == 1 and engine.arena.used == 1 + 2


def test_per_head_lengths_differ_and_the_compression_is_measured():
    engine = fake_engine(capacity=64, layers=2)
    policy = dms(engine, window=4)
    for i in range(20):  # layer 0: head 0 keeps every token, head 1 every other; layer 1 keeps none
        offer(policy, engine, [KEEP, KEEP if i % 2 == 0 else EVICT, EVICT, EVICT])
    report = policy.compression()
    # 16 decided tokens left the window; the window's 4 are read by every head
    assert report.tokens_seen == 20 and report.decided == 16
    assert report.held_per_head.tolist() == [[20, 8 + 4], [4, 4]]
    assert report.kept_per_head.tolist() == [[16, 8], [0, 0]]
    np.testing.assert_allclose(report.ratio_per_head, [[1.0, 20 / 12], [5.0, 5.0]])
    assert report.ratio == pytest.approx(20 * 4 / 40) and report.decision_ratio == pytest.approx(16 * 4 / 24)
    assert report.slots_held == 20 and report.slot_ratio == 1.0  # layer 0 head 0 holds every slot


def test_the_pinned_prompt_is_never_evicted_nor_forced_out():
    engine = fake_engine(capacity=8, prompt=3)
    policy = dms(engine, window=2)
    for _ in range(30):  # every head evicts everything, and the arena is too small to keep anything long
        offer(policy, engine, [EVICT, EVICT])
        offer(policy, engine, [KEEP, KEEP], [KEEP, KEEP], [KEEP, KEEP])
    assert engine.arena.holds(np.arange(3)).all() and np.array_equal(engine.arena.positions[:3], [0, 1, 2])
    assert policy.compression().forced_evictions > 0


def test_room_is_forced_by_the_lowest_best_head_score_ties_to_the_older_never_from_the_window():
    engine = fake_engine(capacity=1 + 5)
    policy = dms(engine, window=2)
    # best over heads: a 0.5, b 3.0, c 0.5 (a tie with a, younger); the window then holds d, e
    a, b, c = (offer(policy, engine, scores) for scores in ([0.5, 0.2], [0.1, 3.0], [0.5, 0.5]))
    d, e = offer(policy, engine, [KEEP, KEEP]), offer(policy, engine, [KEEP, KEEP])
    assert engine.arena.used == 6
    assert policy.make_room(1) == 1 and not engine.arena.valid[a] and engine.arena.valid[c]
    assert policy.make_room(2) == 1 and not engine.arena.valid[c]  # one more was free already
    assert policy.make_room(3) == 1 and not engine.arena.valid[b]
    assert engine.arena.valid[d] and engine.arena.valid[e]
    with pytest.raises(RuntimeError, match="do not fit beside the prompt and the 2-token window"):
        policy.make_room(4)


@pytest.mark.parametrize("scores", [[KEEP, KEEP], [KEEP, EVICT]], ids=["both-keep", "one-keeps"])
def test_a_pool_smaller_than_the_dense_size_forces_tokens_out_when_its_pages_run_short(scores):
    engine = fake_engine(capacity=64, prompt=1, page_tokens=2, pool_pages=8)  # 16 entries for 2 heads and 64 slots
    policy = dms(engine, window=3)
    longest = 0
    for _ in range(60):
        offer(policy, engine, scores)
        assert engine.arena.pages.pages_in_use() <= 8  # never more than the pool, whatever the heads keep
        longest = max(longest, int(engine.arena.pages.lengths.max()))
    assert policy.compression().forced_evictions > 0 and engine.arena.used < 64  # pages ran short, not slots
    assert engine.arena.holds(engine.arena.pinned).all() and engine.arena.holds(policy.pending_slots()).all()
    if scores[1] == EVICT:  # head 1 holds the prompt, the window and the newest token (3 pages): head 0 the rest
        assert longest == 10 > 16 // 2
    else:
        assert longest <= 8


def test_a_pool_too_small_for_the_prompt_the_window_and_a_frame_is_refused_and_so_is_fifo_on_it():
    with pytest.raises(ValueError, match="kv_pool_pages=5 must be at least 6"):
        dms(fake_engine(capacity=64, prompt=1, page_tokens=2, pool_pages=5), window=3)
    site = fake_engine(capacity=64, page_tokens=2, pool_pages=8).site()
    with pytest.raises(ValueError, match="only dms runs on a smaller pool"):
        site.check_pool("fifo", per_kv_head=False)
    site.check_pool("dms", per_kv_head=True)
    with pytest.raises(ValueError, match="only dms"):
        KVArena(64, 2, 8).set_layout((1, 2), per_head=False)


def test_a_fixed_threshold_keeps_only_scores_above_it():
    engine = fake_engine(capacity=16)
    policy = dms(engine, window=1, threshold=0.25)
    (token,) = offer(policy, engine, [0.25, 0.2500001])  # equal is not above
    offer(policy, engine, [KEEP, KEEP])
    assert engine.arena.holds([token])[0, :, 0].tolist() == [False, True]


def test_a_target_ratio_sets_the_threshold_to_the_quantile_of_recent_scores():
    rng = np.random.default_rng(3)
    engine = fake_engine(capacity=4096, layers=2)
    policy = dms(engine, window=8, target_ratio=8.0)
    history = []
    for step in range(400):
        scores = rng.standard_normal((3, 4)).astype(np.float32) + np.float32(step % 7)  # drifting scores
        offer(policy, engine, *scores)
        before = np.stack(history[-HISTORY_TOKENS:]) if history else scores  # the first frame: its own quantile
        assert policy.limits.current == pytest.approx(np.quantile(before, 1 - 1 / 8), rel=1e-6)
        history.extend(scores.reshape(3, 2, 2))
    report = policy.compression()
    assert report.decision_ratio == pytest.approx(8.0, rel=0.15)
    assert report.held_per_head.min() < report.held_per_head.max()  # one threshold: heads keep different amounts


def test_target_ratio_one_keeps_everything():
    engine = fake_engine(capacity=64)
    policy = dms(engine, window=2, target_ratio=1.0)
    for value in np.linspace(-5, 5, 20):
        offer(policy, engine, [value, -value])
    assert policy.compression().ratio == 1.0 and policy.evictions == 0


def test_the_policy_state_round_trips_and_decides_on_exactly_as_before():
    rng = np.random.default_rng(5)
    scores = rng.standard_normal((60, 2)).astype(np.float32)
    engine = fake_engine(capacity=24)
    policy = dms(engine, window=5, target_ratio=3.0)
    for row in scores[:40]:
        offer(policy, engine, row)
    state = policy.snapshot()
    counts, rows = engine.arena.pages.held()  # the arena's part, as the engine's memory state keeps it
    slots = np.flatnonzero(engine.arena.valid).astype(np.int32)
    arena = (slots, engine.arena.positions[slots].copy(), counts, engine.arena.pages.entry_slot.reshape(-1)[rows])
    for row in scores[40:]:
        offer(policy, engine, row)
    expected = (engine.arena.holds(np.arange(24)), policy.compression())

    twin_engine = fake_engine(capacity=24)
    twin = dms(twin_engine, window=5, target_ratio=3.0)
    twin_engine.arena.release(twin_engine.arena.pinned)
    twin_engine.arena.restore_entries(*arena)
    twin.restore(state)
    assert all(np.array_equal(value, twin.snapshot()[key]) for key, value in state.items())
    for row in scores[40:]:
        offer(twin, twin_engine, row)
    np.testing.assert_array_equal(twin_engine.arena.holds(np.arange(24)), expected[0])
    got, want = twin.compression(), expected[1]
    assert (got.tokens_seen, got.decided, got.forced_evictions, got.threshold) == \
           (want.tokens_seen, want.decided, want.forced_evictions, want.threshold)
    np.testing.assert_array_equal(got.kept_per_head, want.kept_per_head)
    with pytest.raises(ValueError, match="window"):
        dms(fake_engine(capacity=24), window=2).restore(state)


def test_bad_knobs_are_refused_with_the_knob_named():
    with pytest.raises(ValueError, match="kv.dms.window=0 is below the minimum 1"):
        dms_knobs(window=0)
    with pytest.raises(ValueError, match="kv.dms.target_ratio must be 0"):
        make_policy("dms", {"kv.dms.target_ratio": 0.5})
    with pytest.raises(ValueError, match="kv.dms.threshold must be a finite number"):
        dms_knobs(threshold=float("nan"))
    with pytest.raises(ValueError, match="kv.dms.target_ratio"):  # a live change is checked before it exists
        MemoryKnobs.of({"kv.dms.threshold": 1.0, "kv.dms.target_ratio": 0.9})
    with pytest.raises(ValueError, match=r"kv.dms.window=15 must be in \[1, 14\]"):
        dms(fake_engine(capacity=16), window=15)
    with pytest.raises(ConfigError, match="kv.dms.window=0 is below the minimum"):
        parse_settings({"reasoning": {"ros__parameters": {"kv": {"dms": {"window": 0}}}}}, "x.yaml")
    settings = parse_settings({"reasoning": {"ros__parameters": {"kv": {"policy": "dms", "dms": {
        "window": 8, "target_ratio": 8}}}}}, "x.yaml")
    policy = make_policy("dms", settings["reasoning"])
    assert (policy.knobs.window, policy.knobs.target_ratio, policy.knobs.use_learned_gate) == (8, 8.0, True)


def test_a_bad_dms_knob_is_refused_at_load_even_when_another_policy_runs(tiny_model):
    with pytest.raises(ConfigError, match="robot.yaml: reasoning: kv.dms.target_ratio must be 0"):
        parse_settings({"reasoning": {"ros__parameters": {
            "model_dir": str(tiny_model), "backend": "numpy", "kv": {"policy": "fifo", "dms": {"target_ratio": 0.5}}}}},
            "robot.yaml")
    settings = parse_settings({"reasoning": {"ros__parameters": {  # a window the arena cannot hold beside a frame
        "model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 64,
        "kv": {"dms": {"window": 40}, "cosine": {"protect_recent_frames": 1}}}}},
        "robot.yaml")
    with pytest.raises(ValueError, match=r"robot.yaml: reasoning: kv.dms.window=40 must be in \[1, 35\]"):
        load_engine(settings)


# --- the real engine ---------------------------------------------------------------------------------------


def micro_config(**overrides):
    shape = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, vocab_size=512,
                 vision=VisionConfig(image_size=16, patch_size=4, tokens_per_frame=4))
    return replace(preset("tiny"), **{**shape, **overrides})


@pytest.fixture(scope="module")
def micro_dir(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("dms") / "m", micro_config(), seed=7)


def with_gate(directory, tmp_path, weight, bias):
    """A copy of the checkpoint with dms gate tensors (weight(layer), bias(layer) give the values)."""
    tensors = read_safetensors(directory / "model.safetensors")
    tensors = {name: StoredTensor(t.dtype, np.array(t.array)) for name, t in tensors.items()}
    for layer in range(2):
        w, b = dms_gate_names(layer)
        tensors[w] = StoredTensor("F32", np.asarray(weight(layer), np.float32))
        tensors[b] = StoredTensor("F32", np.asarray(bias(layer), np.float32))
    out = tmp_path / "gated"
    out.mkdir()
    (out / "config.json").write_text((directory / "config.json").read_text())
    write_safetensors(out / "model.safetensors", tensors)
    return load_checkpoint(out)


def engine_with(checkpoint, policy, capacity: int = 96, backend: str = "numpy") -> VlaEngine:
    engine = VlaEngine(checkpoint, backend=backend, kv_capacity_tokens=capacity, policy=policy)
    engine.set_prompt([5, 6, 7])
    return engine


def images(count: int, seed: int = 0) -> list[np.ndarray]:
    camera = SyntheticCamera(height=16, width=16, seed=seed)
    return [camera.frame() for _ in range(count)]


def test_a_learned_gate_decides_per_head_and_attention_stops_reading_what_a_head_evicted(micro_dir, tmp_path):
    # eviction logits: layer 0 head 1 and layer 1 head 0 evict every token (alpha +10), the other heads keep all
    bias = {0: [-10.0, 10.0], 1: [10.0, -10.0]}
    checkpoint = with_gate(micro_dir, tmp_path, lambda layer: np.zeros((2, 64)), lambda layer: bias[layer])
    engine = engine_with(checkpoint, make_policy("dms", {"kv.dms.window": 4, "kv.dms.target_ratio": 0.0}))
    first = engine.add_frame(images(1)[0])
    assert isinstance(engine.policy.source, LearnedGate)
    _, attention = probe_frame(engine, images(2, seed=1)[1])  # the first frame is still in the window
    assert np.all(attention[..., first.slots].sum(-1) > 0)
    _, attention = probe_frame(engine, images(3, seed=2)[2])  # now it has left the window
    read = attention[..., first.slots].sum(-1)  # [layers, q_heads]: q heads 0-1 read KV head 0, 2-3 head 1
    assert np.all(read[0, :2] > 0) and np.all(read[0, 2:] == 0)
    assert np.all(read[1, :2] == 0) and np.all(read[1, 2:] > 0)
    held = engine.policy.compression().held_per_head
    assert held.tolist() == [[12, 4], [4, 12]] and engine.arena.used == 3 + 12


def test_a_head_that_evicts_gives_its_pages_back_and_the_memory_counts_pages(micro_dir, tmp_path):
    bias = {0: [-10.0, 10.0], 1: [10.0, -10.0]}  # as above: two heads keep every token, two keep none
    checkpoint = with_gate(micro_dir, tmp_path, lambda layer: np.zeros((2, 64)), lambda layer: bias[layer])
    policy = make_policy("dms", {"kv.dms.window": 4, "kv.dms.target_ratio": 0.0})
    engine = VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=96, policy=policy, kv_page_tokens=4)
    engine.set_prompt([5, 6, 7])
    for image in images(6, seed=3):
        engine.add_frame(image)
    report = engine.policy.compression()
    # keepers read the prompt + 24 tokens (7 pages of 4); evicters the prompt + the window's 4 (2 pages)
    assert report.held_per_head.tolist() == [[24, 4], [4, 24]]
    assert report.pages_per_head.tolist() == [[7, 2], [2, 7]]
    page_bytes = 2 * 4 * checkpoint.config.head_dim * 4
    assert engine.memory_stats().kv_bytes == 18 * page_bytes  # the pages held, not every head's copy of every token
    assert report.byte_ratio == pytest.approx(24 * 4 / (18 * 4 - 3 * 4))
    np.testing.assert_allclose(report.byte_ratio_per_layer, [24 * 2 / (9 * 4 - 3 * 2)] * 2)


def test_the_learned_gate_reads_the_layer_input_after_its_rms_norm(micro_dir, tmp_path):
    rng = np.random.default_rng(1)
    weights = {layer: rng.standard_normal((2, 64)).astype(np.float32) for layer in range(2)}
    checkpoint = with_gate(micro_dir, tmp_path, weights.__getitem__, lambda layer: [0.5, -0.5])
    gate = LearnedGate(checkpoint)
    inputs = [rng.standard_normal((3, 64)).astype(np.float32) * 7 for _ in range(2)]
    scores = gate.scores(None, np.arange(3), inputs)
    for layer in range(2):
        norm = checkpoint.float32(f"model.layers.{layer}.input_layernorm.weight")
        x = inputs[layer].astype(np.float64)
        normed = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * norm
        np.testing.assert_allclose(scores[:, layer], -(normed @ weights[layer].T + [0.5, -0.5]), rtol=1e-4, atol=1e-5)


def test_an_incomplete_gate_is_refused_and_use_learned_gate_false_ignores_a_gate(micro_dir, tmp_path):
    checkpoint = with_gate(micro_dir, tmp_path, lambda layer: np.zeros((2, 64)), lambda layer: [0.0, 0.0])
    policy = make_policy("dms", {"kv.dms.use_learned_gate": False, "kv.dms.window": 4})
    assert not isinstance(engine_with(checkpoint, policy).policy.source, LearnedGate)
    del checkpoint.tensors[dms_gate_names(1)[1]]
    with pytest.raises(CheckpointError, match="dms gate tensors are incomplete"):
        engine_with(checkpoint, make_policy("dms", {"kv.dms.window": 4}))


def test_key_novelty_is_zero_for_a_repeated_frame_in_the_first_layer(micro_dir):
    engine = engine_with(load_checkpoint(micro_dir), make_policy("dms", {"kv.dms.window": 16}))
    image = images(1)[0]
    scores = []
    engine.policy.limits.update = lambda batch: scores.append(batch.copy()) or 0.0  # record what is decided
    engine.add_frame(image)
    engine.add_frame(image)
    first, repeat = scores
    # layer 0 keys depend on the frame alone: the repeat's keys (RoPE undone) equal the first copy's
    np.testing.assert_allclose(repeat[:, 0], 0.0, atol=1e-5)
    assert np.all(first[:, 0] > 1e-3) and np.all((first >= 0) & (first <= 2))


def test_decoded_action_tokens_stay_as_dms_decides_and_leave_under_fifo(micro_dir):
    checkpoint = load_checkpoint(micro_dir)
    dof = checkpoint.config.action.dof
    fifo = engine_with(checkpoint, FifoPolicy())
    fifo.step(images(1)[0])
    assert fifo.arena.used == 3 + 4
    engine = engine_with(checkpoint, make_policy("dms", {"kv.dms.window": 16, "kv.dms.target_ratio": 1.0}))
    result = engine.step(images(1)[0])
    assert engine.arena.used == 3 + 4 + dof - 1 and engine.policy.compression().tokens_seen == 4 + dof - 1
    decoded = np.flatnonzero(engine.arena.positions >= 3 + 4)
    np.testing.assert_array_equal(np.sort(engine.arena.positions[decoded]), 3 + 4 + np.arange(dof - 1))
    assert len(result.tokens) == dof


def test_an_abandoned_decode_keeps_what_was_decoded_and_frees_the_rest(micro_dir):
    engine = engine_with(load_checkpoint(micro_dir), make_policy("dms", {"kv.dms.window": 16}))
    prefill = engine.add_frame(images(1)[0])
    answers = iter([True, True, False])
    assert engine.decode_action(prefill, admit=lambda: next(answers)) is None
    assert engine.arena.used == 3 + 4 + 2 and engine.policy.pending_slots().size == 4 + 2


def test_the_measured_compression_approaches_the_target_in_a_long_stream(micro_dir):
    checkpoint = load_checkpoint(micro_dir)
    frames = images(64, seed=4)
    for target in (4.0, 8.0):
        engine = engine_with(checkpoint, make_policy("dms", {"kv.dms.window": 16, "kv.dms.target_ratio": target}),
                             capacity=3 + 300 * 4 + 7)
        for index in range(300):
            engine.add_frame(frames[index % 64])
        report = engine.policy.compression()
        assert report.forced_evictions == 0  # the arena never ran out: what is kept is what the heads chose
        assert report.tokens_seen == 300 * 4 and report.decision_ratio == pytest.approx(target, rel=0.15)
        # the window is read by every head on top of what they keep: tokens seen / kept is a little lower
        assert 0.85 * target <= report.ratio <= report.decision_ratio
        assert report.slot_ratio <= report.ratio  # the union of what the heads keep
        # pages: each head holds its own tokens (and the prompt's) with less than a page to spare
        held = report.held_per_head + report.prompt_tokens
        assert (held <= report.pages_per_head * report.page_tokens).all()
        assert (report.pages_per_head * report.page_tokens < held + report.page_tokens).all()
        kept = report.held_per_head.sum()  # so the bytes freed trail the tokens by less than a page per head
        assert report.byte_ratio > report.ratio * kept / (kept + held.size * report.page_tokens)


@pytest.fixture(scope="module")
def nano_bins(tmp_path_factory):
    """For the CUDA simulator: one layer, two KV heads, a 3-token bins head (so decoded tokens enter dms)."""
    config = micro_config(num_hidden_layers=1, hidden_size=32, intermediate_size=48, num_attention_heads=2,
                          head_dim=16, vocab_size=300, action=ActionConfig(head="bins", dof=3))
    return load_checkpoint(write_random_model(tmp_path_factory.mktemp("nano") / "m", config, seed=9))


@pytest.mark.slow  # the simulator spends ~10 s per decoded token on GEMV threads; without decoding, the
# default suite runs dms on the simulator in test_memory_policies.py
def test_dms_generation_with_decoded_tokens_runs_through_the_cuda_simulator_like_numpy(nano_bins):
    results = {}
    for backend in ("numpy", "cuda"):
        engine = engine_with(nano_bins, make_policy("dms", {"kv.dms.window": 6}), capacity=24, backend=backend)
        actions = [engine.step(image).action for image in images(4, seed=6)]
        report = engine.policy.compression()
        results[backend] = (np.stack(actions), engine.memory_stats(), engine.memory_state(), report)
    (cuda_actions, cuda_stats, cuda_state, cuda_report), (np_actions, np_stats, np_state, np_report) = \
        results["cuda"], results["numpy"]
    np.testing.assert_array_equal(cuda_actions, np_actions)  # bins: the same tokens were decoded
    assert cuda_stats == np_stats and cuda_stats.evictions >= 1
    heads = np.split(np_state["entry_slots"], np.cumsum(np_state["entry_counts"].reshape(-1))[:-1])
    assert set(heads[0]) != set(heads[1])  # the two KV heads read different tokens: the per-head pages mattered
    np.testing.assert_array_equal(cuda_report.held_per_head, np_report.held_per_head)
    for key in ("slots", "positions", "entry_counts", "entry_slots", "policy.pending_slots"):
        np.testing.assert_array_equal(cuda_state[key], np_state[key])
    np.testing.assert_allclose(cuda_state["keys"], np_state["keys"], rtol=1e-4, atol=1e-5)
