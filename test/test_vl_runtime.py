"""The runtime on a Qwen2-VL checkpoint: frames as image segments, M-RoPE ids kept exact through evictions."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from vla_edge_ros.cli import main
from vla_edge_ros.config import DmsKnobs, parse_settings
from vla_edge_ros.engine.vla_engine import EncodedFrame, VlaEngine
from vla_edge_ros.memory import DmsPolicy, FifoPolicy, make_policy
from vla_edge_ros.memory.base import FrameTokens
from vla_edge_ros.model.arena import KVArena, repack_rope_ids
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.config import ActionConfig, ModelConfigError
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.model.known_models import KNOWN_MODELS, known_model, weight_values
from vla_edge_ros.model.numpy_backend import NumpyBackend
from vla_edge_ros.model.vl.config import VisionTowerConfig, VlConfig
from vla_edge_ros.model.vl.frames import frame_side, text_rope_ids, with_frame_geometry
from vla_edge_ros.model.vl.positions import rope_index
from vla_edge_ros.model.vision import FrameError
from vla_edge_ros.model.vl.preprocess import ImageProcessing
from vla_edge_ros.numerics import ops
from vla_edge_ros.runtime.admission import BlockKind, Decision, Verdict
from vla_edge_ros.runtime.block_costs import parse_cost
from vla_edge_ros.runtime.clock import NS_PER_MS, VirtualClock
from vla_edge_ros.runtime.driver import Driver
from vla_edge_ros.runtime.loader import load_engine
from vla_edge_ros.worlds.synthetic import SyntheticCamera

PROMPT = [11, 402, 77, 1030, 6]
CAP = 112 * 112  # 112 x 112 frames: 4 x 4 merged tokens + start and end = 18 tokens per frame
IMAGE, START, END = 1700, 1701, 1702


@pytest.fixture(scope="module")
def vl_model(tmp_path_factory):
    """qwen2-vl-tiny cut to 2 decoder layers (the mechanics under test do not need more)."""
    return write_random_model(tmp_path_factory.mktemp("vl") / "vl", preset("qwen2-vl-tiny", layers=2), seed=0)


def _qwen25(layers: int):
    """qwen2-vl-tiny's decoder under a small Qwen2.5-VL tower: RMSNorm, SwiGLU, 2 x 2 windows but in block 1."""
    config = preset("qwen2-vl-tiny", layers=layers)
    return replace(config, vl=VlConfig(VisionTowerConfig(
        family="qwen2_5_vl", depth=2, embed_dim=64, num_heads=4, mlp_dim=96, out_hidden_size=256, window_size=56,
        fullatt_block_indexes=(1,), hidden_act="silu"), (8, 12, 12), IMAGE, START, END))


@pytest.fixture(scope="module")
def vl25_model(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("vl") / "vl25", _qwen25(2), seed=0)


@pytest.fixture(scope="module")
def micro_model(tmp_path_factory):
    """A VL model small enough to stream thousands of frames: 1 layer of width 64, a 1-block tower."""
    config = preset("qwen2-vl-tiny", layers=1)
    vl = replace(config.vl, vision=replace(config.vl.vision, depth=1, embed_dim=32, num_heads=2, mlp_dim=64,
                                           out_hidden_size=64, fullatt_block_indexes=(0,)), mrope_section=(4, 6, 6))
    config = replace(config, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                     head_dim=32, vl=vl)
    return write_random_model(tmp_path_factory.mktemp("vl") / "micro", config, seed=1)


def _engine(model, capacity: int, policy=None, cap: int = CAP, backend: str = "numpy") -> VlaEngine:
    engine = VlaEngine(with_frame_geometry(load_checkpoint(model), cap), backend=backend,
                       kv_capacity_tokens=capacity, policy=policy)
    engine.set_prompt(PROMPT)
    return engine


def _layout(segments: int, side_tokens: int) -> np.ndarray:
    """Token ids of the prompt and ``segments`` frame segments, as transformers' prompt would hold them."""
    frame = [START] + [IMAGE] * side_tokens ** 2 + [END]
    return np.array(PROMPT + frame * segments)


def _kept_rope_ids(engine: VlaEngine) -> np.ndarray:
    slots = engine.arena.slots_in_order()
    return engine.arena.rope_positions[:, slots]


# -- the ids ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("grid", [(1, 8, 8), (1, 8, 12), (1, 14, 4)])
def test_repacking_equals_get_rope_index_of_the_kept_sequence(grid):
    """Evicting whole segments (and a text token between them), then re-packing, gives the ids
    transformers' get_rope_index (vl.positions.rope_index, tested against it) gives the kept sequence."""
    n = grid[1] * grid[2] // 4
    pieces = [PROMPT, [START] + [IMAGE] * n + [END], [9], [START] + [IMAGE] * n + [END], [START] + [IMAGE] * n + [END],
              [8, 7]]
    ids = np.concatenate([np.asarray(p) for p in pieces])
    full = rope_index(ids, np.array([grid] * 3), image_token_id=IMAGE, spatial_merge_size=2)
    owner = np.concatenate([np.full(len(p), i) for i, p in enumerate(pieces)])
    for dropped in ({1}, {1, 2}, {3}, {1, 3, 4}):
        keep = ~np.isin(owner, list(dropped))
        images = 3 - len(dropped & {1, 3, 4})
        expected = rope_index(ids[keep], np.array([grid] * images), image_token_id=IMAGE, spatial_merge_size=2)
        np.testing.assert_array_equal(repack_rope_ids(full[:, keep]), expected)


def test_repacking_a_thinned_image_moves_its_tokens_together():
    """dms drops tokens one by one: what is left of an image keeps its rows and columns relative to its base,
    and the next token follows the highest id left."""
    ids = rope_index(_layout(2, 4), np.array([(1, 8, 8)] * 2), image_token_id=IMAGE, spatial_merge_size=2)
    keep = np.ones(ids.shape[1], dtype=bool)
    keep[[3, 4, 5, 6, 7]] = False  # two prompt tokens, the first segment's start marker and first two tokens
    keep[6 + 12:6 + 16] = False  # and the last row of its 4 x 4 merged tokens (the image is ids[:, 6:22])
    kept = np.flatnonzero(keep)
    new = repack_rope_ids(ids[:, keep])
    delta = new - ids[:, keep]
    image = (kept >= 6) & (kept < 22)
    assert (delta[:, image] == delta[0, image][0]).all()  # one delta, one rotation, for what is left of the image
    np.testing.assert_array_equal(new[:, :3], text_rope_ids(0, 3))
    assert new[0, image][0] == 3  # its base follows the three prompt tokens left
    # rows 0..2 and columns 0..3 are left: the highest id is base + 3, so the end marker takes base + 4
    assert (new[:, np.flatnonzero(kept == 22)[0]] == 3 + 4).all()
    with pytest.raises(ValueError, match="cache order"):
        repack_rope_ids(ids[:, ::-1])


def test_an_mrope_arena_needs_ids_with_every_token():
    arena = KVArena(8, mrope=True)
    with pytest.raises(ValueError, match="M-RoPE ids"):
        arena.commit(np.array([0]), np.array([0]))
    arena.commit(np.array([0, 1]), np.array([0, 1]), np.array([[0, 1], [0, 3], [0, 2]]))
    assert arena.next_rope_position() == 4
    arena.release(np.array([1]))
    assert arena.next_rope_position() == 1 and (arena.rope_positions[:, 1] == -1).all()


# -- frames ----------------------------------------------------------------------------------------------


def test_frame_geometry_follows_the_pixel_cap(vl_model):
    processing = ImageProcessing.load(vl_model)
    assert [frame_side(processing, cap) for cap in (CAP, 224 * 224, 112 * 112 - 1, 56 * 56)] == [112, 224, 84, 56]
    with pytest.raises(ModelConfigError, match="=3000 .* min_pixels \\(3136\\); raise it to at least 3136"):
        frame_side(processing, 3000)
    config = with_frame_geometry(load_checkpoint(vl_model), 224 * 224).config
    assert (config.vision.image_size, config.vision.tokens_per_frame) == (224, 8 * 8 + 2)
    with pytest.raises(ModelConfigError, match="not a VL frame geometry"):
        VlaEngine(load_checkpoint(vl_model), backend="numpy", kv_capacity_tokens=200)


def test_a_frame_is_one_image_segment(vl_model):
    engine = _engine(vl_model, 96)
    prefill = engine.add_frame(SyntheticCamera(height=48, width=64, seed=1).frame())
    slots = prefill.slots
    assert slots.size == engine.tokens_per_frame == 18
    ids = engine.arena.rope_positions[:, engine.arena.slots_in_order()]
    np.testing.assert_array_equal(ids, rope_index(_layout(1, 4), np.array([(1, 8, 8)]), image_token_id=IMAGE,
                                                  spatial_merge_size=2))
    keys, _ = engine.backend.read_kv(slots[[0, -1]])
    fresh = _fresh_layer0_keys(engine, engine.backend.embeddings(np.array([START, END])), ids[:, [5, 22]])
    np.testing.assert_allclose(keys[0], fresh, rtol=1e-5, atol=1e-5)  # the markers' own embeddings
    assert prefill.next_rope_position == 5 + 1 + 4 + 1  # start, 4 ids of the 4 x 4 image, end: then text
    state = engine.memory_state()
    for bad in (np.zeros((48, 64), np.uint8), np.zeros((0, 64, 3), np.uint8), np.zeros((48, 64, 3), np.float32)):
        with pytest.raises(FrameError):
            engine.add_frame(bad)
    assert all(np.array_equal(v, engine.memory_state()[k]) for k, v in state.items())  # refused: nothing changed


def test_an_observation_of_two_cameras_and_a_state_is_two_segments_then_a_text_like_token(tmp_path):
    """Each camera's segment from one past the highest id before it, as get_rope_index numbers two images, then the
    state token as text after them; the memory keeps and evicts the 37 tokens whole."""
    model = write_random_model(tmp_path / "m", preset("qwen2-vl-tiny", layers=1, cameras=2, state_dim=2), seed=0)
    engine = _engine(model, 96, FifoPolicy())
    assert engine.observation_tokens == 2 * 18 + 1
    camera = SyntheticCamera(height=48, width=64, seed=3)
    prefill = engine.add_frame(camera.frame(), (camera.frame(),), np.float32([0.5, -0.5]))
    assert prefill.slots.size == 37
    ids = engine.arena.rope_positions[:, engine.arena.slots_in_order()]
    layout = np.r_[_layout(2, 4), 0]  # the state token: any text id
    np.testing.assert_array_equal(ids, rope_index(layout, np.array([(1, 8, 8)] * 2), image_token_id=IMAGE,
                                                  spatial_merge_size=2))
    assert prefill.next_rope_position == int(ids.max()) + 1
    for _ in range(3):  # 96 slots hold two observations beside the prompt: the third evicts the first, whole
        engine.step(camera.frame(), (camera.frame(),), np.float32([0.1, 0.2]))
    assert [slots.size for slots in engine.policy.frames] == [37, 37] and engine.arena.used == 5 + 2 * 37


@pytest.mark.parametrize("model_fixture, count", [("vl_model", 2), ("vl25_model", 1)])
def test_steps_match_transformers_greedy_decoding(request, model_fixture, count):
    """Frames without eviction: the bins decoded equal transformers' Qwen2-VL / Qwen2.5-VL greedy bins over the same
    prompt, frames (as image segments) and action tokens, the frames' pixels preprocessed by transformers itself."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model_dir = request.getfixturevalue(model_fixture)
    engine = _engine(model_dir, 96)
    camera = SyntheticCamera(height=48, width=64, seed=2)
    frames = [camera.frame() for _ in range(count)]
    for frame in frames[:-1]:
        engine.step(frame)
    prefill = engine.add_frame(frames[-1])
    ours = engine.backend.logits(prefill.hidden[None])[0]
    _, decoded = engine.decode_action(prefill)
    model = transformers.AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(str(model_dir))
    images = processor(images=[engine.encoder.square(f) for f in frames], return_tensors="pt")
    assert images["image_grid_thw"].tolist() == [[1, 8, 8]] * count
    ids = list(_layout(count, 4))
    tokens = []
    with torch.no_grad():
        for _ in range(engine.config.action.dof):
            input_ids = torch.tensor([ids])
            logits = model(input_ids=input_ids, mm_token_type_ids=(input_ids == IMAGE).int(),
                           pixel_values=images["pixel_values"],
                           image_grid_thw=images["image_grid_thw"]).logits[0, -1].numpy()
            if not tokens:  # the frame's last token: every logit, not only the argmax
                np.testing.assert_allclose(ours, logits, rtol=0, atol=1e-5 * np.abs(logits).max())
            tokens.append(engine.head.first_bin_token + int(np.argmax(logits[engine.head.bin_rows])))
            ids.append(tokens[-1])
    assert decoded == tokens


# -- evictions stay exact --------------------------------------------------------------------------------


def _fresh_layer0_keys(engine: VlaEngine, inputs: np.ndarray, rope: np.ndarray) -> np.ndarray:
    """Layer-0 keys [kv_heads, n, D] of ``inputs`` prefilled afresh at M-RoPE ids ``rope`` (depend on nothing else)."""
    arena = KVArena(inputs.shape[0], mrope=True)
    backend = NumpyBackend(engine.checkpoint, arena)
    slots = np.arange(inputs.shape[0], dtype=np.int32)
    backend.forward(slots, slots, embeddings=inputs, rope_positions=rope)
    return backend.read_kv(slots)[0][0]


def _recording_inputs(engine: VlaEngine) -> dict[int, np.ndarray]:
    """slot -> the input vector of the token it now holds: the prompt's, then recorded at every forward."""
    inputs = {int(s): row for s, row in zip(engine.prompt_slots, engine.backend.embeddings(engine.prompt_ids))}
    forward = engine.backend.forward

    def recorded(positions, slots, *, token_ids=None, embeddings=None, **kwargs):
        x = engine.backend.embeddings(token_ids) if token_ids is not None else embeddings
        inputs.update({int(s): row.copy() for s, row in zip(slots, x)})
        return forward(positions, slots, token_ids=token_ids, embeddings=embeddings, **kwargs)

    engine.backend.forward = recorded
    return inputs


def _unrotated(engine: VlaEngine, keys: np.ndarray, rope: np.ndarray) -> np.ndarray:
    """Keys [n, heads, D] turned back from M-RoPE ids ``rope`` [3, n] to 0."""
    c = engine.config
    cos, sin = ops.mrope_cos_sin(-rope, ops.rope_inv_freq(c.head_dim, c.rope_theta), c.vl.mrope_section)
    return ops.apply_rope(keys, cos, sin)


@pytest.mark.parametrize("policy", ["fifo", "dms"])
def test_evictions_re_pack_ids_and_keys_exactly(vl_model, policy):
    """Compaction after evictions: every kept token's M-RoPE ids become get_rope_index's for the kept sequence
    (fifo: whole segments), its layer-0 key is a fresh prefill's at those ids, and every layer's key is the one
    it was computed as, moved from its old ids to its new ones."""
    knobs = DmsKnobs.of({"kv.dms.window": 20, "kv.dms.target_ratio": 0.0, "kv.dms.threshold": 0.9})
    engine = _engine(vl_model, 5 + 3 * 18 + 7, FifoPolicy() if policy == "fifo" else DmsPolicy(knobs))
    inputs = _recording_inputs(engine)
    camera = SyntheticCamera(height=48, width=64, seed=3)
    for _ in range(6):
        engine.step(camera.frame())
    assert engine.policy.evictions > 0  # frames (fifo), tokens every head dropped (dms)
    if policy == "fifo":
        engine.arena.release(engine.policy.frames.pop(0))  # the hole the next frame's make_room would leave
    else:
        assert not engine.arena.holds(engine.arena.slots_in_order()).all()  # and tokens only some heads dropped
    slots = engine.arena.slots_in_order()
    held = engine.arena.pages.rows(slots)  # [layers, kv_heads, n]: where each head holds each slot
    old_rope = engine.arena.rope_positions[:, slots].copy()
    old_keys = {(l, h): engine.backend.read_rows(held[l, h][held[l, h] >= 0])[0]
                for l in range(held.shape[0]) for h in range(held.shape[1])}
    engine.compact_positions()
    rope = engine.arena.rope_positions[:, slots]
    assert (rope != old_rope).any()
    np.testing.assert_array_equal(engine.arena.slots_in_order(), slots)
    np.testing.assert_array_equal(engine.arena.positions[slots], np.arange(slots.size))
    np.testing.assert_array_equal(rope, repack_rope_ids(old_rope))
    if policy == "fifo":
        kept = (slots.size - len(PROMPT)) // 18
        np.testing.assert_array_equal(rope, rope_index(_layout(kept, 4), np.array([(1, 8, 8)] * kept),
                                                       image_token_id=IMAGE, spatial_merge_size=2))
    fresh = _fresh_layer0_keys(engine, np.stack([inputs[int(s)] for s in slots]), rope)
    held = engine.arena.pages.rows(slots)
    for layer in range(held.shape[0]):
        for head in range(held.shape[1]):
            rows = held[layer, head]
            keys = engine.backend.read_rows(rows[rows >= 0])[0]
            if layer == 0:
                np.testing.assert_allclose(keys, fresh[head][rows >= 0], rtol=1e-4, atol=1e-4)
            was = _unrotated(engine, old_keys[(layer, head)][:, None], old_rope[:, rows >= 0])[:, 0]
            np.testing.assert_allclose(_unrotated(engine, keys[:, None], rope[:, rows >= 0])[:, 0], was,
                                       rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("policy, frames", [("fifo", 600), ("dms", 300),
                                             pytest.param("fifo", 3000, marks=pytest.mark.slow)])
def test_positions_stay_bounded_over_a_long_stream(micro_model, policy, frames):
    engine = _engine(micro_model, 48, make_policy(policy, {"kv.dms.window": 12, "kv.dms.target_ratio": 2.0}),
                     cap=56 * 56)
    assert engine.tokens_per_frame == 2 * 2 + 2
    camera = SyntheticCamera(height=32, width=32, seed=4)
    encoded = [engine.encode_frame(camera.frame()) for _ in range(5)]
    for index in range(frames):
        prefill = engine.prefill_frame(encoded[index % 5])
        if policy == "dms":
            engine.decode_action(prefill)
        assert engine.arena.positions.max() < engine.arena.capacity
        assert engine.arena.rope_positions.max() < engine.arena.capacity
    rope = _kept_rope_ids(engine)
    np.testing.assert_array_equal(engine.arena.positions[engine.prompt_slots], np.arange(len(PROMPT)))
    np.testing.assert_array_equal(rope[:, :len(PROMPT)], text_rope_ids(0, len(PROMPT)))
    assert engine.policy.frames_seen == frames


# -- memory snapshots ------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["fifo", "dms"])
def test_memory_state_round_trip_is_byte_exact(vl_model, policy):
    build = lambda: make_policy(policy, {"kv.dms.window": 20, "kv.dms.target_ratio": 2.0})  # noqa: E731
    engine = _engine(vl_model, 5 + 3 * 18 + 7, build())
    camera = SyntheticCamera(height=48, width=64, seed=5)
    for _ in range(4):
        engine.step(camera.frame())
    state = engine.memory_state()
    assert state["rope_positions"].shape == (3, state["slots"].size)
    other = _engine(vl_model, 5 + 3 * 18 + 7, build())
    other.load_memory_state(state)
    again = other.memory_state()
    assert set(again) == set(state)
    for name, value in state.items():
        assert again[name].dtype == value.dtype and again[name].tobytes() == value.tobytes(), name
    frame = camera.frame()
    assert other.step(frame).tokens == engine.step(frame).tokens
    with pytest.raises(ValueError, match="lacks the M-RoPE ids"):
        other.load_memory_state({k: v for k, v in state.items() if k != "rope_positions"})
    larger = _engine(vl_model, 5 + 3 * 66 + 7, build(), cap=224 * 224)
    with pytest.raises(ValueError, match="frames of \\[18\\] tokens, this engine's are 66"):
        larger.load_memory_state(state)


@pytest.mark.slow
def test_the_cuda_backend_decodes_the_same_actions_through_evictions(micro_model):
    """The cuda backend (simulated here) with its tower and M-RoPE: the same bins, ids and keys as numpy while
    fifo evicts and compaction re-packs."""
    engines = [_engine(micro_model, 5 + 6 + 7, cap=56 * 56, backend=name) for name in ("numpy", "cuda")]
    camera = SyntheticCamera(height=32, width=32, seed=10)
    for _ in range(3):  # an arena of one frame: the second and third evict the one before
        frame = camera.frame()
        results = [engine.step(frame) for engine in engines]
        assert results[0].tokens == results[1].tokens
    assert engines[1].policy.evictions == 2
    slots = [engine.arena.slots_in_order() for engine in engines]
    np.testing.assert_array_equal(*(e.arena.rope_positions[:, s] for e, s in zip(engines, slots)))
    np.testing.assert_allclose(*(e.backend.read_kv(s)[0] for e, s in zip(engines, slots)), rtol=1e-3, atol=1e-4)


def test_vl_config_round_trips_through_config_json(tmp_path):
    for model in (preset("qwen2-vl-tiny"), _qwen25(4)):
        loaded = load_checkpoint(write_random_model(tmp_path / model.vl.family, model, seed=0)).config
        assert loaded.vl == model.vl and replace(loaded, vision=model.vision) == model


# -- the gate, the loader, init-model ---------------------------------------------------------------------


def _vl_settings(model, **reasoning):
    return parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(model), "backend": "numpy", "kv_capacity_tokens": 128,
                                          "vision_max_pixels": CAP, "warmup_cycles": 1, **reasoning}},
        "action_publisher": {"ros__parameters": {"command_type": "float32_multi_array"}}}, "test.yaml")


def test_the_vision_encode_is_its_own_gated_block(vl_model):
    settings = _vl_settings(vl_model, deadline_ms=60.0)
    loaded = load_engine(settings)
    assert loaded.engine.tokens_per_frame == 18 and loaded.plan.kv_capacity_tokens == 128
    with pytest.raises(ValueError, match="lacks vision"):
        Driver(loaded.engine, settings, VirtualClock(0), parse_cost("fixed:encode=4ms,decode=1ms"), (48, 64))
    driver = Driver(loaded.engine, settings, VirtualClock(0), parse_cost("fixed:encode=4ms,vision=9ms,decode=1ms"),
                    (48, 64))
    gate = driver.gate
    asked: list[BlockKind] = []
    admit = gate.admit

    def spy(kind, deadline_ns, *, within):
        asked.append(BlockKind(kind))
        return admit(kind, deadline_ns, within=within)

    gate.admit = spy
    camera = SyntheticCamera(height=48, width=64, seed=6)
    driver.camera(camera.frame(), stamp_ns=0, arrival_ns=0)
    cycle = driver.reason()
    assert asked == [BlockKind.VISION_ENCODE, BlockKind.ENCODE_PREFILL] + [BlockKind.DECODE] * 6
    assert cycle.result.ready_ns == (9 + 4 + 6 * 1) * NS_PER_MS == driver.clock()  # vision, prefill, 6 decode steps
    kinds = gate.snapshot().kinds
    assert (kinds["vision_encode"].completed, kinds["vision_encode"].mean_ms) == (1, 9.0)  # learned apart
    assert (kinds["encode_prefill"].completed, kinds["encode_prefill"].mean_ms) == (1, 4.0)
    # a refused vision encode: nothing runs, the frame never enters the memory
    gate.admit = lambda kind, deadline_ns, *, within: Decision(BlockKind(kind), Verdict.REFUSED, 0, deadline_ns, 9e6)
    driver.camera(camera.frame(), stamp_ns=1, arrival_ns=driver.clock())
    before = driver.clock()
    cycle = driver.reason()
    assert cycle.result.refused_block is BlockKind.VISION_ENCODE and cycle.result.action is None
    assert driver.clock() == before and loaded.engine.policy.frames_seen == 1


def test_init_model_writes_a_deterministic_checkpoint_transformers_loads(tmp_path):
    for name in ("a", "b"):
        assert main(["init-model", "--preset", "qwen2-vl-tiny", "--layers", "1", "--out", str(tmp_path / name)]) == 0
    for file in ("config.json", "preprocessor_config.json", "model.safetensors"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForImageTextToText.from_pretrained(str(tmp_path / "a"))
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    assert type(transformers.AutoImageProcessor.from_pretrained(str(tmp_path / "a"))).__name__.startswith("Qwen2VL")
    ours = load_checkpoint(tmp_path / "a")
    theirs = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    np.testing.assert_array_equal(ours.float32("visual.blocks.0.attn.qkv.weight"),
                                  theirs["model.visual.blocks.0.attn.qkv.weight"])
    np.testing.assert_array_equal(ours.float32("model.layers.0.mlp.up_proj.weight"),
                                  theirs["model.language_model.layers.0.mlp.up_proj.weight"])


# -- plan ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, params, tower", [("qwen2-vl-2b", 2_208_985_600, 665_271_296),
                                                 ("qwen2.5-vl-3b", 3_754_622_976, 668_684_288)])
def test_known_models_have_transformers_shapes(name, params, tower):
    """The public configs give the parameter counts transformers builds from them (on the meta device)."""
    config, processing = known_model(name)
    decoder_values, tower_values = weight_values(config)
    assert (decoder_values + tower_values, tower_values) == (params, tower)
    assert (processing.min_pixels, processing.max_pixels, processing.factor) == (3136, 12845056, 28)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    raw = dict(KNOWN_MODELS[name])
    hf_config = transformers.AutoConfig.for_model(**raw)
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(hf_config)
    assert sum(p.numel() for p in model.parameters()) == params
    assert sum(p.numel() for p in model.model.visual.parameters()) == tower


def test_plan_by_name_against_edge_memory(tmp_path, capsys):
    config = tmp_path / "robot.yaml"
    config.write_text("reasoning:\n  ros__parameters:\n    vision_max_pixels: 50176\n    kv_capacity_tokens: 1024\n")
    assert main(["plan", "--known-model", "qwen2-vl-2b", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "224x224 (reasoning.vision_max_pixels 50176): 66 tokens each, 3,784,704 B of KV" in out  # 66 x 57,344
    assert "vision tower 1,330,542,592 B" in out and "4,417,971,200 B" in out  # bf16
    assert "Jetson AGX Orin 64GB" in out and "8 GB (Jetson Orin Nano / NX 8GB)" in out
    assert main(["plan", "--known-model", "qwen2.5-vl-3b", "--config", str(config)]) == 1  # over the 5 GB budget
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out.split("against edge memory")[0]
    assert "88.5% fits         room for 218 observations of KV" in out  # but an 8 GB Orin holds it, barely


@pytest.mark.parametrize("policy", ["cosine", "aura"])
def test_every_policy_keeps_keys_at_their_ids(vl_model, policy):
    """cosine (signatures of keys with M-RoPE undone) and aura (a text-like memory token before each frame):
    after evictions every cached layer-0 key is a fresh prefill's at the ids the arena holds for it."""
    knobs = {"kv.cosine.protect_recent_frames": 1, "kv.cosine.signature": "keys"}
    engine = _engine(vl_model, 5 + 3 * 18 + 7 + 1, make_policy(policy, knobs))
    inputs = _recording_inputs(engine)
    camera = SyntheticCamera(height=48, width=64, seed=7)
    for _ in range(6):
        engine.step(camera.frame())
    assert engine.policy.evictions > 0 or policy == "aura"
    slots = engine.arena.slots_in_order()
    rope = engine.arena.rope_positions[:, slots]
    assert (np.diff(rope[0]) > 0).sum() == np.count_nonzero(np.diff(rope[0]))  # temporal ids never go back
    fresh = _fresh_layer0_keys(engine, np.stack([inputs[int(s)] for s in slots]), rope)
    np.testing.assert_allclose(engine.backend.read_kv(slots)[0][0], fresh, rtol=1e-4, atol=1e-4)
    if policy == "cosine":  # a frame's signature does not depend on where its keys sit
        frame = engine.policy.frames[-1]
        signature = engine.policy.signature_of(FrameTokens(frame, engine.arena.positions[frame], np.zeros((18, 256)),
                                                           np.empty(0, np.int32)))
        engine.compact_positions()
        engine.backend.rotate_keys(slots, np.full(slots.size, 7, dtype=np.int32))
        engine.arena.rope_positions[:, slots] += 7
        moved = engine.policy.signature_of(FrameTokens(frame, engine.arena.positions[frame], np.zeros((18, 256)),
                                                       np.empty(0, np.int32)))
        np.testing.assert_allclose(moved, signature, rtol=1e-4, atol=1e-5)


def test_the_linear_action_head_reads_the_segment_s_last_hidden_state(tmp_path):
    config = replace(preset("qwen2-vl-tiny", layers=1), action=ActionConfig(head="linear", dof=3))
    engine = _engine(write_random_model(tmp_path / "linear", config, seed=2), 5 + 2 * 18)
    prefill = engine.add_frame(SyntheticCamera(height=48, width=64, seed=8).frame())
    chunk, tokens = engine.decode_action(prefill)
    assert tokens == [] and chunk.shape == (1, 3)
    np.testing.assert_array_equal(chunk, engine.head.from_hidden(prefill.hidden))
    assert engine.step(SyntheticCamera(height=48, width=64, seed=9).frame()).action.shape == (3,)


def test_a_restarted_vl_engine_restores_its_episode_from_the_encrypted_store(vl_model, tmp_path):
    from vla_edge_ros.kv_store import save_memory

    key = tmp_path / "kv.key"
    assert main(["kv-store", "keygen", "--out", str(key)]) == 0
    store = {"kv_store.dir": str(tmp_path / "store"), "kv_store.key_file": str(key)}
    first = load_engine(_vl_settings(vl_model, **store))
    camera = SyntheticCamera(height=48, width=64, seed=11)
    for _ in range(8):  # past the arena's 6 frames: evictions and re-packed ids
        first.engine.step(camera.frame())
    save_memory(first.engine, first.store, "episode")
    second = load_engine(_vl_settings(vl_model, **store))
    assert (second.prompt_from_store, second.memory_restored) == (True, True)
    saved, restored = first.engine.memory_state(), second.engine.memory_state()
    assert all(saved[name].tobytes() == restored[name].tobytes() for name in saved)
    frame = camera.frame()
    assert second.engine.step(frame).tokens == first.engine.step(frame).tokens
    # another pixel cap: the stored episode's frames do not fit, it starts afresh (and says so in the store)
    other = load_engine(_vl_settings(vl_model, vision_max_pixels=84 * 84, **store))
    assert (other.prompt_from_store, other.memory_restored) == (True, False)
