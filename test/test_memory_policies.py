"""KV memory policies: exact hand-built cases, then the real engine under each policy."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from vla_edge_ros.config import AuraKnobs, ConfigError, parse_settings
from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.memory import POLICIES, AuraPolicy, CosinePolicy, FifoPolicy, FrameTokens, MemoryContext, make_policy
from vla_edge_ros.memory.aura_gate import WriteGate, WriteOffer
from vla_edge_ros.model.arena import KVArena
from vla_edge_ros.model.checkpoint import Checkpoint, load_checkpoint
from vla_edge_ros.model.config import ActionConfig, ModelConfig, StateConfig, VisionConfig
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.model.layout import arena_capacity, kv_page_bytes, kv_pages_for
from vla_edge_ros.model.safetensors_io import StoredTensor
from vla_edge_ros.tools.aura_gates import baseline_gate
from vla_edge_ros.worlds.synthetic import SyntheticCamera

TPF = 2  # tokens per frame in the hand-built cases


def fake_context(frames: int, prompt: int = 1, dim: int = 3) -> MemoryContext:
    """Just what a frame-window policy reads: an arena sized for ``frames`` frames, a model's shapes, no weights."""
    config = ModelConfig(hidden_size=dim, intermediate_size=dim, num_hidden_layers=1, num_attention_heads=1,
                         num_key_value_heads=1, vocab_size=8, head_dim=dim + dim % 2,
                         vision=VisionConfig(tokens_per_frame=TPF), action=ActionConfig(head="linear", dof=1))
    arena = KVArena(prompt + frames * TPF)
    arena.pinned = arena.allocate(prompt)
    arena.commit(arena.pinned, np.arange(prompt, dtype=np.int32))
    return MemoryContext(Checkpoint(Path("fake"), config, {}, True), arena, read_kv=None, device="numpy")


def aura_policy(gate: WriteGate | None = None, **knobs) -> AuraPolicy:
    """An aura policy with ``kv.aura.<name>`` knobs by short name (the rest: the schema's defaults); ``gate``
    decides its writes (None: the surprise gate)."""
    return AuraPolicy(AuraKnobs.of({f"kv.aura.{name}": value for name, value in knobs.items()}), gate)


def cosine_policy(**knobs) -> CosinePolicy:
    return make_policy("cosine", {f"kv.cosine.{name}": value for name, value in knobs.items()})


def offer(policy, context, embedding) -> np.ndarray:
    """Make room for and add one frame whose tokens all carry ``embedding``; return its slots."""
    policy.make_room(TPF)
    slots = context.arena.allocate(TPF)
    start = context.arena.next_position()
    positions = np.arange(start, start + TPF, dtype=np.int32)
    context.arena.commit(slots, positions)
    embeddings = np.tile(np.asarray(embedding, dtype=np.float32), (TPF, 1))
    policy.add_frame(FrameTokens(slots, positions, embeddings, np.empty(0, np.int32)))
    return slots


def kept(policy, named: dict[str, np.ndarray]) -> list[str]:
    """Names of the kept frames, oldest first."""
    by_slot = {int(slots[0]): name for name, slots in named.items()}
    return [by_slot[int(slots[0])] for slots in policy.frames]


def test_fifo_evicts_the_oldest_frame():
    engine = fake_context(frames=3)
    policy = FifoPolicy()
    policy.attach(engine)
    policy.reset()
    named = {}
    for name in "abcde":
        named[name] = offer(policy, engine, [1, 0, 0])
    assert kept(policy, named) == ["c", "d", "e"]
    stats = policy.stats()
    assert (stats.frames_seen, stats.frames_kept, stats.evictions, stats.writes) == (5, 3, 2, 5)
    assert stats.kv_tokens == 1 + 3 * TPF and stats.kv_bytes == stats.kv_tokens * 2 * 4 * 4  # K, V; fp32; D 4


def cosine(frames: int, protect: int) -> tuple[CosinePolicy, MemoryContext]:
    engine = fake_context(frames=frames)
    policy = cosine_policy(signature="embeddings", protect_recent_frames=protect)
    policy.attach(engine)
    policy.reset()
    return policy, engine


def test_cosine_evicts_the_most_redundant_frame_and_the_older_of_a_tie():
    policy, engine = cosine(frames=4, protect=1)
    named = {"cue": offer(policy, engine, [0, 0, 1])}
    for name in ("empty1", "empty2", "other"):
        named[name] = offer(policy, engine, [1, 0, 0] if name.startswith("empty") else [0, 1, 0.2])
    # empty1 and empty2 are identical (similarity 1, a tie): the older one goes; the cue survives
    named["new"] = offer(policy, engine, [1, 1, 0])
    assert kept(policy, named) == ["cue", "empty2", "other", "new"]
    assert policy.evictions == 1


@pytest.mark.parametrize("protect, survivors", [(1, ["a", "c", "d"]), (2, ["b", "c", "d"])])
def test_cosine_never_evicts_the_protected_recent_frames(protect, survivors):
    policy, engine = cosine(frames=3, protect=protect)
    named = {name: offer(policy, engine, vector) for name, vector in
             (("a", [1, 0, 0]), ("b", [0, 1, 0]), ("c", [0, 1, 0]))}  # b and c are twins
    # room for d is made before d arrives: protect 1 shields c, so b (c's twin) goes;
    # protect 2 shields b and c, so a goes although it is unique
    named["d"] = offer(policy, engine, [0, 0, 1])
    assert kept(policy, named) == survivors


def test_cosine_protected_window_must_leave_a_frame_evictable():
    with pytest.raises(ValueError, match="protect_recent_frames=3 must be in \\[0, 2\\]"):
        cosine(frames=3, protect=3)


def test_cosine_cached_neighbours_match_a_brute_force_recomputation():
    rng = np.random.default_rng(4)
    policy, engine = cosine(frames=6, protect=1)
    signatures = {}
    for _ in range(60):
        vector = rng.standard_normal(3).astype(np.float32)
        if rng.random() < 0.4:  # near-duplicates of a kept frame make the ranking interesting
            vector = signatures[int(policy.frames[rng.integers(len(policy.frames))][0])] + 0.01 * vector \
                if policy.frames else vector
        slots = offer(policy, engine, vector)
        signatures[int(slots[0])] = vector
        kept_vectors = np.stack([signatures[int(s[0])] for s in policy.frames])
        unit = kept_vectors / np.linalg.norm(kept_vectors, axis=1, keepdims=True)
        sims = unit @ unit.T
        np.fill_diagonal(sims, -np.inf)
        expected = sims.max(axis=1)
        np.testing.assert_allclose(policy.redundancy(), expected, rtol=1e-5, atol=1e-6)


def test_policy_names_and_bad_knobs_are_reported():
    assert POLICIES == ("fifo", "cosine", "aura", "dms")
    with pytest.raises(ValueError, match="kv.policy must be one of"):
        make_policy("lru")
    with pytest.raises(ValueError, match="kv.cosine.signature must be one of"):
        cosine_policy(signature="pixels")
    with pytest.raises(ValueError, match="kv.aura.beta"):
        aura_policy(beta=0.0)
    with pytest.raises(ConfigError, match="kv.policy must be one of"):
        parse_settings({"reasoning": {"ros__parameters": {"kv": {"policy": "lru"}}}}, "x.yaml")
    settings = parse_settings({"reasoning": {"ros__parameters": {"kv": {"policy": "aura", "aura": {"beta": 0.25}}}}},
                              "x.yaml")
    assert settings["reasoning"]["kv.policy"] == "aura" and settings["reasoning"]["kv.aura.beta"] == 0.25
    with pytest.raises(ConfigError, match="unknown key reasoning.kv.aura.betta"):
        parse_settings({"reasoning": {"ros__parameters": {"kv": {"aura": {"betta": 0.25}}}}}, "x.yaml")


# --- the real engine -------------------------------------------------------------------------------------


def micro_config(layers: int = 2, **overrides):
    """A model small enough to stream 100,000 frames through in about a minute."""
    shape = dict(hidden_size=64, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                 vocab_size=512, vision=VisionConfig(image_size=16, patch_size=4, tokens_per_frame=4))
    return replace(preset("tiny", layers=layers), **{**shape, **overrides})


@pytest.fixture(scope="module")
def micro_model(tmp_path_factory):
    return load_checkpoint(write_random_model(tmp_path_factory.mktemp("micro") / "m", micro_config(), seed=3))


def micro_engine(checkpoint, policy, capacity: int = 48, backend: str = "numpy") -> VlaEngine:
    engine = VlaEngine(checkpoint, backend=backend, kv_capacity_tokens=capacity, policy=policy)
    engine.set_prompt([5, 6, 7])
    return engine


def frames(count: int, seed: int = 0):
    camera = SyntheticCamera(height=16, width=16, seed=seed)
    return [camera.frame() for _ in range(count)]


def test_aura_state_is_4224_bytes_forever_and_the_cache_holds_prompt_memory_token_and_frame(micro_model):
    engine = micro_engine(micro_model, aura_policy())
    sizes = set()
    for image in frames(30):
        engine.step(image)
        stats = engine.memory_stats()
        sizes.add((stats.state_bytes, stats.kv_tokens, engine.arena.next_position()))
    assert sizes == {((32 * 32 + 32) * 4, 3 + 1 + 4, 3 + 1 + 4)}
    assert engine.memory_stats().state_bytes == 4224 and 1 <= engine.memory_stats().writes <= 30


def test_aura_writes_a_repeated_frame_once_and_a_novel_frame_again(micro_model):
    engine = micro_engine(micro_model, aura_policy(threshold=0.1, beta=0.5))
    still, novel = frames(1, seed=1)[0], np.full((16, 16, 3), 255, dtype=np.uint8)
    for _ in range(5):
        engine.add_frame(still)
    # beta 0.5 from zero, unit k: W k + b = 0.5 v (k.k) + 0.5 v = v, so the repeat is no surprise at all
    assert engine.policy.writes == 1 and engine.policy.last_surprise == pytest.approx(0.0, abs=1e-5)
    engine.add_frame(novel)
    assert engine.policy.writes == 2


def test_aura_threshold_rises_until_writes_meet_the_target_rate(micro_model):
    policy = aura_policy(threshold=0.01, beta=0.9, target_write_rate=0.2)
    engine = micro_engine(micro_model, policy)
    images = frames(400, seed=2)
    for image in images[:200]:
        engine.add_frame(image)
    early_writes = policy.writes
    for image in images[200:]:
        engine.add_frame(image)
    late_rate = (policy.writes - early_writes) / 200
    assert policy.effective_threshold > policy.knobs.threshold  # it had to rise: nearly every frame surprised it
    assert late_rate <= 0.2 + 0.05


def with_aura_gate(checkpoint, weight: np.ndarray, bias: float):
    """The checkpoint plus a learned aura gate (in memory: the module's model stays gate-free)."""
    gate = {"aura.gate.weight": StoredTensor("F32", np.asarray(weight, np.float32).reshape(1, 64)),
            "aura.gate.bias": StoredTensor("F32", np.array([bias], np.float32))}
    return replace(checkpoint, tensors={**checkpoint.tensors, **gate})


@pytest.mark.parametrize("bias, threshold, use_learned_gate, writes", [
    (-10.0, 0.0, True, 0),  # the gate says no, the surprise would say yes on every frame
    (10.0, 1e6, True, 20),  # the gate says yes, the surprise would never
    (-10.0, 0.0, False, 20),  # the gate switched off: the threshold decides
    (10.0, 1e6, False, 0),
])
def test_the_learned_gate_alone_decides_when_it_is_used(micro_model, bias, threshold, use_learned_gate, writes):
    policy = aura_policy(threshold=threshold, use_learned_gate=use_learned_gate)
    engine = micro_engine(with_aura_gate(micro_model, np.zeros(64), bias), policy)
    for image in frames(20, seed=4):
        engine.add_frame(image)
    assert policy.writes == writes
    assert policy.last_surprise > 0  # reported whichever source decides
    if writes == 0:  # an empty memory predicts 0: the surprise is ||v|| / ||v||
        assert policy.last_surprise == pytest.approx(1.0)


def test_target_write_rate_lowers_the_learned_gate_toward_it(micro_model):
    weight = np.random.default_rng(0).standard_normal(64) * 2
    checkpoint = with_aura_gate(micro_model, weight, 3.0)  # fires on nearly every frame unadapted
    images = frames(400, seed=2)
    late_rates = []
    for target in (0.0, 0.2):
        policy = aura_policy(threshold=0.0, beta=0.9, target_write_rate=target)  # threshold 0 would write always
        engine = micro_engine(checkpoint, policy)
        for image in images[:200]:
            engine.add_frame(image)
        early_writes = policy.writes
        for image in images[200:]:
            engine.add_frame(image)
        late_rates.append((policy.writes - early_writes) / 200)
    assert late_rates[0] > 0.9
    assert late_rates[1] == pytest.approx(0.2, abs=0.05)


def test_aura_needs_its_checkpoint_tensors(tmp_path):
    from vla_edge_ros.model.checkpoint import CheckpointError
    from vla_edge_ros.model.safetensors_io import read_safetensors, write_safetensors

    directory = write_random_model(tmp_path / "m", micro_config(layers=1), seed=0)
    tensors = {k: v for k, v in read_safetensors(directory / "model.safetensors").items() if not k.startswith("aura.")}
    write_safetensors(directory / "stripped.safetensors", tensors)  # not in place: the old file is memory-mapped
    (directory / "stripped.safetensors").replace(directory / "model.safetensors")
    with pytest.raises(CheckpointError, match="kv.policy aura needs tensors"):
        micro_engine(load_checkpoint(directory), aura_policy())


@pytest.mark.parametrize("name", POLICIES)
def test_memory_state_round_trip_resumes_exactly(micro_model, name):
    engine = micro_engine(micro_model, make_policy(name, {"kv.cosine.protect_recent_frames": 2, "kv.dms.window": 8}))
    images = frames(16, seed=5)
    for image in images[:12]:
        engine.step(image)
    state = engine.memory_state()
    expected = [engine.step(image).action for image in images[12:]]
    expected_stats = engine.memory_stats()
    engine.set_prompt([5, 6, 7])  # scramble: a new episode
    engine.step(images[0])
    engine.load_memory_state(state)
    again = engine.memory_state()  # what the KV store would save again: byte for byte the same
    assert again.keys() == state.keys() and all(np.array_equal(again[k], state[k]) for k in state)
    for image, action in zip(images[12:], expected):
        np.testing.assert_array_equal(engine.step(image).action, action)
    assert engine.memory_stats() == expected_stats


def test_memory_state_of_another_policy_is_refused(micro_model):
    state = micro_engine(micro_model, FifoPolicy()).memory_state()
    with pytest.raises(ValueError, match="memory state is of policy 'fifo'"):
        micro_engine(micro_model, aura_policy()).load_memory_state(state)


def test_switching_policy_starts_a_new_episode(micro_model):
    engine = micro_engine(micro_model, FifoPolicy())
    for image in frames(5):
        engine.step(image)
    engine.set_policy(cosine_policy(protect_recent_frames=1))
    assert engine.policy.name == "cosine" and engine.arena.used == 3 and engine.memory_stats().frames_seen == 0


@pytest.fixture(scope="module")
def nano_model(tmp_path_factory):
    """For the CUDA simulator, which runs every GPU thread as a Python thread: one layer, a linear head."""
    config = micro_config(layers=1, hidden_size=32, intermediate_size=48, head_dim=16, vocab_size=64,
                          action=ActionConfig(head="linear", dof=3))
    return load_checkpoint(write_random_model(tmp_path_factory.mktemp("nano") / "m", config, seed=4))


# 30-50 s per policy on 2 cores: `make test-slow`. The default suite keeps the CUDA backend end to end in
# test_engine.py and test_parity.py, and every memory kernel against its NumPy twin (test_kernels_memory.py).
@pytest.mark.slow
@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_runs_through_the_cuda_simulator_like_numpy(nano_model, name):
    results = {}
    for backend in ("numpy", "cuda"):
        engine = micro_engine(nano_model, make_policy(name, {"kv.cosine.protect_recent_frames": 1, "kv.dms.window": 4}),
                              capacity=20, backend=backend)
        actions = [engine.step(image).action for image in frames(6, seed=6)]
        stats = engine.memory_stats()
        assert stats.evictions >= 1
        results[backend] = (np.stack(actions), stats, engine.memory_state())
    (cuda_actions, cuda_stats, cuda_state), (numpy_actions, numpy_stats, numpy_state) = results["cuda"], results["numpy"]
    np.testing.assert_allclose(cuda_actions, numpy_actions, rtol=1e-4, atol=1e-5)
    assert cuda_stats == numpy_stats  # same evictions and writes: the kernels decided as the twins did
    for key in ("slots", "positions"):
        np.testing.assert_array_equal(cuda_state[key], numpy_state[key])
    np.testing.assert_allclose(cuda_state["keys"], numpy_state["keys"], rtol=1e-4, atol=1e-5)


def stream(engine: VlaEngine, count: int, budget_bytes: int) -> tuple[float, float]:
    """Push ``count`` frames; check positions and bytes every frame; median frame cost early vs late (ms of
    CPU time: what the frame's work costs, which other processes on a busy machine hardly change)."""
    camera = SyntheticCamera(height=16, width=16, seed=8)
    images = [camera.frame() for _ in range(64)]
    times = np.empty(count)
    top = engine.arena.capacity
    for index in range(count):
        started = time.process_time_ns()
        prefill = engine.add_frame(images[index % 64])
        times[index] = (time.process_time_ns() - started) / 1e6
        assert engine.arena.positions.max() < top and prefill.next_position + engine.scratch_tokens <= top
        assert engine.memory_stats().memory_bytes <= budget_bytes
    window = max(50, count // 20)
    return float(np.median(times[window:2 * window])), float(np.median(times[-window:]))


def _long_stream(micro_model, name: str, count: int) -> None:
    engine = micro_engine(micro_model, make_policy(name), capacity=64)
    budget = engine.arena.capacity * engine.kv_bytes_per_token + 4224
    early, late = stream(engine, count, budget)
    assert engine.memory_stats().frames_seen == count
    # no per-frame cost may grow with the episode (CPU time, so another process's load is not counted; 3x
    # still leaves room for what load does to caches)
    assert late < 3 * early + 0.5, f"{name}: median frame {early:.3f} ms early, {late:.3f} ms late"


@pytest.mark.parametrize("name", POLICIES)
def test_a_2k_frame_episode_stays_bounded(micro_model, name):
    """The default suite's share of the soak below: every position re-base and eviction path many times over."""
    _long_stream(micro_model, name, 2_000)


@pytest.mark.soak
@pytest.mark.parametrize("name", POLICIES)
def test_a_100k_frame_episode_stays_bounded(micro_model, name):
    _long_stream(micro_model, name, 100_000)


def _paged_stream(micro_model, count: int) -> None:
    """dms in a pool of pages smaller than every head holding every slot: the pool is the memory bound."""
    config, page = micro_model.config, 4
    pool = 2 * kv_pages_for(config, arena_capacity(config, 3, 1, 8), page)  # twice what prompt + window + frame take
    policy = make_policy("dms", {"kv.dms.window": 8})
    engine = VlaEngine(micro_model, backend="numpy", kv_capacity_tokens=128, policy=policy, kv_page_tokens=page,
                       kv_pool_pages=pool)
    engine.set_prompt([5, 6, 7])
    assert engine.backend.state_bytes()[1] == pool * kv_page_bytes(config, page)
    early, late = stream(engine, count, pool * kv_page_bytes(config, page))
    assert engine.arena.pages.pages_in_use() <= pool and policy.compression().forced_evictions > 0
    assert late < 3 * early + 0.5, f"median frame {early:.3f} ms early, {late:.3f} ms late"


def test_dms_in_a_small_pool_stays_within_its_pages_over_1k_frames(micro_model):
    _paged_stream(micro_model, 1_000)


@pytest.mark.soak
def test_dms_in_a_small_pool_stays_within_its_pages_over_100k_frames(micro_model):
    _paged_stream(micro_model, 100_000)


class ScriptedGate(WriteGate):
    """Writes the frames it is told to, and keeps what it was offered."""

    def __init__(self, writes: set[int]) -> None:
        self.writes, self.offers, self.resets = writes, [], 0

    def reset(self) -> None:
        self.resets += 1

    def decide(self, offer: WriteOffer) -> tuple[float, bool]:
        self.offers.append(offer)
        return float("inf"), offer.frame in self.writes


def test_the_policy_writes_what_its_gate_decides_and_nothing_else(micro_model):
    """The gate is the policy's only say on writes: the frames it picks are written even when nothing
    surprises (threshold 1e6), and a new episode restarts it."""
    gate = ScriptedGate({2, 5})
    policy = aura_policy(gate, threshold=1e6)
    engine = micro_engine(micro_model, policy)
    assert gate.resets == 1  # the first episode, started by set_prompt
    written = []
    for image in frames(6, seed=9):
        before = policy.writes
        engine.add_frame(image)
        written.append(policy.writes - before)
    assert written == [0, 1, 0, 0, 1, 0]
    assert [o.frame for o in gate.offers] == [1, 2, 3, 4, 5, 6]
    last = gate.offers[-1]
    np.testing.assert_array_equal(last.value, policy.last_value)
    assert last.scale == pytest.approx(float(np.linalg.norm(policy.last_value)))
    assert last.threshold == 1e6 and last.learned is None and last.tightening == 0.0
    engine.set_prompt([5, 6, 7])
    assert gate.resets == 2 and policy.writes == 0


# --- evaluation's baseline gates (tools/aura_gates.py), plugged into the policy -------------------------


@pytest.mark.parametrize("gate", ["periodic", "random"])
def test_baseline_gates_write_at_their_rate_whatever_the_frames_say(micro_model, gate):
    policy = aura_policy(baseline_gate(gate, 0.25, seed=11), threshold=0.0)
    engine = micro_engine(micro_model, policy)
    still = frames(1)[0]
    written = []
    for _ in range(40):
        before = policy.writes
        engine.add_frame(still)
        written.append(policy.writes - before)
    if gate == "periodic":
        first = written.index(1)
        assert first < 4 and written == [int(i >= first and (i - first) % 4 == 0) for i in range(40)]
    else:
        assert 4 <= sum(written) <= 18  # binomial(40, 0.25): mean 10, sd 2.7
    engine.set_prompt([5, 6, 7])  # a new episode replays the same seeded decisions
    again = []
    for _ in range(40):
        before = policy.writes
        engine.add_frame(still)
        again.append(policy.writes - before)
    assert again == written


@pytest.mark.parametrize("rate", [0.657, 0.15, 1 / 3])
def test_a_periodic_gate_writes_at_its_rate_when_the_period_is_not_whole(micro_model, rate):
    """A whole period (round(1 / 0.657) = 2) wrote at 0.5; the gate must write at the rate it is given."""
    policy = aura_policy(baseline_gate("periodic", rate, seed=5), threshold=0.0)
    engine = micro_engine(micro_model, policy)
    still = frames(1)[0]
    written = []
    for _ in range(300):
        before = policy.writes
        engine.add_frame(still)
        written.append(policy.writes - before)
    assert abs(sum(written) - rate * 300) <= 1
    gaps = np.diff(np.flatnonzero(written))
    assert gaps.max() - gaps.min() <= 1  # spread as evenly as whole frames allow


def test_a_baseline_gate_is_one_of_the_three_at_a_rate_it_can_keep():
    for name, rate in (("never", 0.5), ("surprise", 0.5), ("random", 0.0), ("periodic", 1.5)):
        with pytest.raises(ValueError, match="random.*periodic.*no-write|write rate must be in"):
            baseline_gate(name, rate)


def test_the_no_write_gate_keeps_the_memory_empty_and_reads_zero(micro_model):
    policy = aura_policy(baseline_gate("no-write"), threshold=0.0)
    engine = micro_engine(micro_model, policy)
    for frame in frames(6):
        engine.add_frame(frame)
    weights, bias = policy.memory.get()
    assert policy.writes == 0 and not weights.any() and not bias.any()
    assert not policy.frame_prefix(np.ones((16, engine.config.hidden_size), np.float32)).any()


def test_aura_feature_layouts_follow_the_projections_widths():
    from vla_edge_ros.memory.aura import query_feature, write_feature
    from vla_edge_ros.model.checkpoint import CheckpointError
    from vla_edge_ros.model.memory_tensors import feature_layout

    config = preset("tiny")
    hidden, tokens = config.hidden_size, config.hidden_size * config.vision.tokens_per_frame
    assert feature_layout(config, hidden, hidden) == "mean"
    assert feature_layout(config, tokens, tokens) == "concat"
    assert feature_layout(config, tokens, hidden) == "hidden"
    with pytest.raises(CheckpointError, match=r"\(query, write\) = \(257, 257\)"):
        feature_layout(config, hidden + 1, hidden + 1)
    with pytest.raises(CheckpointError, match="hidden"):
        feature_layout(config, hidden, tokens)  # queries from the hidden state: it does not exist before the frame
    embeddings = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(query_feature(embeddings, "mean"), [2.0, 3.0])
    np.testing.assert_array_equal(query_feature(embeddings, "concat"), np.arange(6))
    np.testing.assert_array_equal(query_feature(embeddings, "hidden"), np.arange(6))
    frame = FrameTokens(np.empty(0, np.int32), np.empty(0, np.int32), embeddings, np.empty(0, np.int32),
                        hidden=np.array([7.0, 8.0], np.float32))
    np.testing.assert_array_equal(write_feature(frame, "hidden"), [7.0, 8.0])
    np.testing.assert_array_equal(write_feature(frame, "concat"), np.arange(6))
    with pytest.raises(RuntimeError, match="last hidden state"):
        write_feature(replace(frame, hidden=None), "hidden")


def hidden_layout_model(checkpoint: Checkpoint, seed: int = 0) -> Checkpoint:
    """``checkpoint`` with aura's key and value projections reading the hidden state (the ``hidden`` layout)."""
    config = checkpoint.config
    query = checkpoint.float32("aura.q_proj.weight").shape[0]
    rng = np.random.default_rng(seed)
    q_proj = rng.normal(0, 0.02, (query, config.hidden_size * config.vision.tokens_per_frame)).astype(np.float32)
    projections = {"aura.k_proj.weight": rng.normal(0, 0.5, (query, config.hidden_size)),
                   "aura.v_proj.weight": rng.normal(0, 0.5, (query, config.hidden_size)), "aura.q_proj.weight": q_proj}
    return replace(checkpoint, tensors={**checkpoint.tensors, **{
        name: StoredTensor("F32", np.asarray(value, np.float32)) for name, value in projections.items()}})


def test_the_hidden_layout_writes_what_the_decoder_made_of_the_frame(micro_model):
    """Key and value come from the final-norm hidden state the action is decoded from, after the frame's
    forward; the next frame reads them back (beta 0.5 from zero: W k + b = v for the frame written)."""
    checkpoint = hidden_layout_model(micro_model)
    policy = aura_policy(threshold=0.0, beta=0.5)  # an empty memory is surprised by the first frame
    engine = micro_engine(checkpoint, policy)
    assert policy.layout == "hidden"
    prefill = engine.add_frame(frames(1, seed=5)[0])
    v_proj, k_proj = checkpoint.float32("aura.v_proj.weight"), checkpoint.float32("aura.k_proj.weight")
    np.testing.assert_allclose(policy.last_value, v_proj @ prefill.hidden, rtol=1e-5, atol=1e-6)
    assert policy.writes == 1
    key = k_proj @ prefill.hidden
    np.testing.assert_allclose(policy.memory.read(key / np.linalg.norm(key)), policy.last_value, rtol=1e-4, atol=1e-5)
    second = engine.add_frame(frames(1, seed=6)[0])
    assert not np.allclose(second.hidden, prefill.hidden)  # a different frame, a different state to write




def test_a_non_finite_hidden_state_is_not_written(micro_model):
    """A frame whose forward diverged (NaN in the hidden state the hidden layout writes) leaves the memory as
    it was and reports a NaN surprise; the next finite frame writes as usual."""
    policy = aura_policy(threshold=0.0)  # any surprise writes
    engine = micro_engine(hidden_layout_model(micro_model), policy)
    engine.add_frame(frames(1, seed=7)[0])
    before = [a.copy() for a in policy.memory.get()]
    hidden = np.full(engine.config.hidden_size, np.nan, np.float32)
    policy.frame_prefix(np.zeros((4, engine.config.hidden_size), np.float32))
    policy.add_frame(FrameTokens(np.empty(0, np.int32), np.empty(0, np.int32), np.zeros((4, 64), np.float32),
                                 np.empty(0, np.int32), hidden=hidden))
    assert all(np.array_equal(a, b) for a, b in zip(policy.memory.get(), before))
    assert policy.writes == 1 and np.isnan(policy.last_surprise)
    engine.add_frame(frames(1, seed=8)[0])
    assert policy.writes == 2 and np.isfinite(policy.memory.get()[0]).all()


# --- observations of several cameras and a state: the unit every policy keeps or evicts ---------------------

OBSERVATION_TOKENS = 2 * 4 + 1  # two cameras of 4 tokens, then the state token


@pytest.fixture(scope="module")
def observing_micro(tmp_path_factory):
    """The micro model seeing two cameras and a 2-value state per observation."""
    config = replace(micro_config(), cameras=2, state=StateConfig(2))
    return load_checkpoint(write_random_model(tmp_path_factory.mktemp("observing") / "m", config, seed=4))


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_keeps_or_evicts_whole_observations(observing_micro, name):
    engine = micro_engine(observing_micro, make_policy(name, {"kv.cosine.protect_recent_frames": 1,
                                                              "kv.dms.window": 8}))
    assert engine.observation_tokens == observing_micro.config.observation_tokens == OBSERVATION_TOKENS
    front, wrist = frames(14, seed=1), frames(14, seed=2)
    steps = [(front[i], (wrist[i],), np.float32([i, -i]) / 10) for i in range(14)]
    for step in steps[:12]:
        engine.step(*step)
        stats = engine.memory_stats()
        if name in ("fifo", "cosine"):  # 4 observations fit beside the prompt (3) and the action scratch (7)
            assert all(slots.size == OBSERVATION_TOKENS for slots in engine.policy.frames)
            assert engine.arena.used == 3 + OBSERVATION_TOKENS * stats.frames_kept <= 3 + 4 * OBSERVATION_TOKENS
        elif name == "aura":  # the prompt, the memory token and the current observation, whole
            assert engine.arena.used == 3 + 1 + OBSERVATION_TOKENS
        else:  # dms: decisions per token, but a token belongs to its observation
            assert all(engine.policy.slots_of_frame(frame).size <= OBSERVATION_TOKENS
                       for frame in engine.policy.frames_held())
    assert stats.frames_seen == 12
    if name != "dms":
        assert stats.tokens_seen == 12 * (OBSERVATION_TOKENS + int(name == "aura"))
    state = engine.memory_state()  # a kept observation saves and restores as a whole
    expected = [engine.step(*step).action for step in steps[12:]]
    engine.load_memory_state(state)
    for step, action in zip(steps[12:], expected):
        np.testing.assert_array_equal(engine.step(*step).action, action)


def test_aura_concat_features_span_the_whole_observation(observing_micro):
    from vla_edge_ros.model.memory_tensors import feature_sizes

    config = observing_micro.config
    assert feature_sizes(config, "concat") == (OBSERVATION_TOKENS * 64, OBSERVATION_TOKENS * 64)
    assert feature_sizes(config, "hidden") == (OBSERVATION_TOKENS * 64, 64)
