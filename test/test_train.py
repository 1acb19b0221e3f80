"""Training: the PyTorch model is the engine's model, its memory parts make the engine's decisions, and
``vla-edge train`` writes a checkpoint every policy runs on, the same bytes for the same seed."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.memory import FifoPolicy, make_policy
from vla_edge_ros.model.checkpoint import CheckpointError, load_checkpoint
from vla_edge_ros.model.memory_tensors import check_aura
from vla_edge_ros.model.init_model import preset
from vla_edge_ros.model.instruction import InstructionTokenizer
from vla_edge_ros.model.vision import resize_frame
from vla_edge_ros.train.demos import perception_samples, record_demo, sample_frames, whole_episode
from vla_edge_ros.train.recipe import load_recipe
from vla_edge_ros.train.spec import AuraSpec, BcSpec, DmsSpec, StageSpec, TrainSpec
from vla_edge_ros.train.stages import (
    aura_actions,
    aura_batches,
    behaviour_cloning,
    cue_pairs,
    fit,
    goal_unmoved,
    make_batch,
    sequence_actions,
    train_aura,
    write_forcing,
    write_labels,
)
from vla_edge_ros.train.torch_model import DmsMask, VlaModel
from vla_edge_ros.train.trainer import export, load_weights, train
from vla_edge_ros.train.wording import DEFAULT_PROMPT, FIXED
from vla_edge_ros.worlds.sim.world import CueReachEnv, TaskSpec

pytestmark = pytest.mark.train
PROMPT = DEFAULT_PROMPT
CONFIG = preset("sim", layers=2)
CHUNKED = replace(CONFIG, action=replace(CONFIG.action, head="mlp", chunk=8, mlp_hidden=48))  # OFT's chunk head
HEADS = {"linear": CONFIG, "mlp": CHUNKED}
SHIPPED = Path(__file__).resolve().parents[1] / "models" / "sim"


def from_shipped(**knobs) -> TrainSpec:
    """A phase from the shipped checkpoint that reads what it was trained to (its templates, the robot's state,
    its head), as the last phase of its recipe did; ``knobs`` set the rest or override."""
    last = load_recipe(SHIPPED / "recipe.yaml").phases[-1].spec
    reads = {"instructions": last.instructions, "state": last.state, "head": last.head, "chunk": last.chunk,
             "mlp_hidden": last.mlp_hidden, "init_from": str(SHIPPED)}
    return TrainSpec(**{**reads, **knobs})


def random_model(seed: int, gate_bias: float = 0.0, config=CONFIG) -> VlaModel:
    """Weights large enough that every part of the forward pass moves the action (HF's 0.02 barely does)."""
    torch.manual_seed(seed)
    model = VlaModel(config, 32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.8, 1.2)
            else:
                param.normal_(0.0, 0.08)
        for layer in model.model.layers:
            layer.self_attn.dms_gate.bias.fill_(gate_bias)
    return model


@pytest.fixture(scope="module")
def demo():
    return record_demo(TaskSpec(name="cue-reach", hold_s=0.3), seed=3, image_size=CONFIG.vision.image_size)


def engine_for(model: VlaModel, tmp_path, policy, capacity: int = 1024) -> VlaEngine:
    export(model, model.c, tmp_path, TrainSpec(dtype="float32"))
    engine = VlaEngine(load_checkpoint(tmp_path), backend="numpy", kv_capacity_tokens=capacity, policy=policy)
    engine.set_prompt(list(PROMPT))
    return engine


def first_frames(demo, count: int):
    """A batch of one sequence: the first ``count`` frames of ``demo``."""
    return make_batch([demo], [np.arange(count)])


@pytest.mark.parametrize("head", HEADS)
def test_the_torch_model_is_the_engine_frame_by_frame(tmp_path, demo, head):
    """Every action of every frame's chunk (one action for the linear head, 8 for the mlp head)."""
    model = random_model(0, config=HEADS[head])
    frames = 12
    with torch.no_grad():
        expected, _ = sequence_actions(model, first_frames(demo, frames))
    engine = engine_for(model, tmp_path, FifoPolicy())
    chunks = np.stack([engine.step(demo.frames[i]).chunk for i in range(frames)])
    assert chunks.shape == (frames, HEADS[head].action.chunk, 2) == expected[0].shape
    assert np.abs(expected[0].numpy()).max() > 0.05  # the comparison is not between two near-zero outputs
    np.testing.assert_allclose(chunks, expected[0].numpy(), atol=2e-5)


@pytest.mark.parametrize("head", HEADS)
def test_aura_training_forward_makes_the_policys_writes_and_actions(tmp_path, demo, head):
    model = random_model(1, config=HEADS[head])
    frames = 14
    with torch.no_grad():  # a gate that both writes and declines, and a read that moves the action
        torch.manual_seed(1)
        model.aura.gate.weight.normal_(0.0, 1.0)
        model.aura.gate.bias.fill_(0.0)
        model.aura.out_proj.weight.normal_(0.0, 0.5)
        expected, writes = aura_actions(model, first_frames(demo, frames), 0.5)
    policy = make_policy("aura", {"kv.aura.beta": 0.5, "kv.aura.use_learned_gate": True})
    engine = engine_for(model, tmp_path, policy)
    actions, written = [], []
    for i in range(frames):
        before = policy.writes
        actions.append(engine.step(demo.frames[i]).chunk)
        written.append(policy.writes > before)
    assert 0 < sum(written) < frames  # the gate both wrote and declined
    np.testing.assert_array_equal(written, writes[0].numpy() > 0.5)
    np.testing.assert_allclose(np.stack(actions), expected[0].numpy(), atol=2e-5)


@pytest.mark.parametrize("head", HEADS)
def test_dms_training_mask_is_the_policys_delayed_eviction(tmp_path, demo, head):
    model = random_model(2, config=HEADS[head])
    frames, window = 10, 32
    mask = DmsMask.for_frames(len(PROMPT), frames, CONFIG.vision.tokens_per_frame, window)
    with torch.no_grad():
        expected, keeps = sequence_actions(model, first_frames(demo, frames), mask)
        full, _ = sequence_actions(model, first_frames(demo, frames))
    kept = torch.stack(keeps)[:, 0, len(PROMPT):] > 0.5
    assert kept.any() and not kept.all()  # the gates both kept and evicted
    policy = make_policy("dms", {"kv.dms.window": window, "kv.dms.use_learned_gate": True, "kv.dms.target_ratio": 0.0,
                                 "kv.dms.threshold": 0.0})
    engine = engine_for(model, tmp_path, policy)
    actions = np.stack([engine.step(demo.frames[i]).chunk for i in range(frames)])
    assert not np.allclose(expected.numpy(), full.numpy(), atol=1e-3)  # evictions changed the actions
    np.testing.assert_allclose(actions, expected[0].numpy(), atol=2e-5)


def test_dms_mask_reads_the_window_and_the_prompt_whatever_was_decided():
    mask = DmsMask.for_frames(prompt_tokens=2, frames=3, tokens_per_frame=2, window=3)
    # tokens: prompt 0-1, frame 0: 2-3, frame 1: 4-5, frame 2: 6-7; frame 2 starts at 6, window covers 3..5
    assert mask.always[6].tolist() == [True, True, False, True, True, True, True, False]
    assert mask.causal[6].tolist() == [True] * 7 + [False]
    assert mask.always[4].tolist() == [True] * 5 + [False] * 3  # frame 1 reads all of frame 0 (window 3)


def test_sampled_frames_keep_order_and_the_start_when_they_keep_the_cue(demo):
    rng = np.random.default_rng(0)
    picks = [sample_frames(demo, rng, 100) for _ in range(200)]
    assert all((np.diff(p) > 0).all() and p[-1] == len(demo.frames) - 1 for p in picks)
    assert any(p.size == len(demo.frames) for p in picks)
    assert any(p[0] > 0 for p in picks)  # sliding windows
    assert any(p[0] == 0 and (np.diff(p) > 1).any() for p in picks)  # start + recent past


def test_strided_frames_end_at_the_last_and_keep_one_stride_per_sequence(demo):
    rng = np.random.default_rng(0)
    picks = [sample_frames(demo, rng, 100, max_stride=5) for _ in range(200)]
    assert all(p[-1] == len(demo.frames) - 1 for p in picks)
    strides = {int(np.diff(p).max()) for p in picks if p.size > 2 and p[0] > 0 and np.ptp(np.diff(p)) == 0}
    assert strides == {1, 2, 3, 4, 5}  # sliding windows, each at one k drawn in [1, 5]
    assert all((np.diff(p) > 5).sum() <= 1 for p in picks)  # the one gap: where the start meets the recent past


def test_strided_aura_episodes_start_at_the_cue_and_keep_one_stride_each(demo):
    """An aura episode as the chunked runtime stores it: frame 0 (the cue, the one write label) and every k-th
    after it; at stride 1 the whole episode, with no draw, so the shipped phases' batches are unchanged."""
    rng = np.random.default_rng(0)
    assert np.array_equal(whole_episode(demo, rng, 100), np.arange(len(demo.frames)))
    assert np.array_equal(whole_episode(demo, rng, 10), np.arange(10))
    assert rng.bit_generator.state == np.random.default_rng(0).bit_generator.state
    picks = [whole_episode(demo, rng, 100, max_stride=12) for _ in range(200)]
    assert all(p[0] == 0 and np.ptp(np.diff(p)) == 0 for p in picks)
    assert {int(p[1]) for p in picks} == set(range(1, 13))
    strided = [p for p in picks if p[1] == 12]
    labels = write_labels(make_batch([demo] * len(strided), strided))
    assert labels.sum(1).eq(1).all() and labels[:, 0].eq(1).all()  # the cue frame is written, whatever the stride
    spec = AuraSpec(3, 2, 1e-3, max_stride=12)
    made = list(aura_batches([demo, demo], spec, np.random.default_rng(1)))
    assert any(batch.valid.sum() < 2 * len(demo.frames) for batch in made)


def test_the_aura_read_probe_tells_a_memory_the_decoder_reads_from_one_it_cannot(tmp_path):
    """bench/aura_read_probe.py on a random model exported with its memory: with the memory's read-out at zero the
    three aura rows are one (nothing the memory holds reaches the action), with it nonzero writing the cue moves
    the error; the whole episode's row never goes through the memory."""
    spec = importlib.util.spec_from_file_location("aura_read_probe", SHIPPED.parents[1] / "bench" / "aura_read_probe.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = {}
    for name, scale in (("mute", 0.0), ("reads", 1.0)):
        model = random_model(4)
        with torch.no_grad():
            model.aura.out_proj.weight.mul_(scale)
        export(model, model.c, tmp_path / name, TrainSpec(dtype="float32"))
        rows[name] = bench.probe(tmp_path / name, (), episodes=2, seed=987654, strides=[1, 12])
    assert [row["stride"] for row in rows["mute"]] == [1, 12]
    for mute, reads in zip(rows["mute"], rows["reads"]):
        assert mute["aura, gate"] == mute["aura, cue written"] == mute["aura, no writes"]
        assert abs(reads["aura, cue written"] - reads["aura, no writes"]) > 1e-3
        assert mute["whole episode"] == pytest.approx(reads["whole episode"]) != mute["aura, no writes"]
        assert 0.0 <= reads["gate writes / frame"] <= 1.0


def test_perception_views_are_labelled_with_the_expert_where_the_robot_stands():
    views = perception_samples(seed=11, image_size=64, count=5)
    frames, commands, where = views.frames, views.commands, views.where
    assert frames.shape == (5, 64, 64, 3) and commands.shape == (5, 2) and where.shape == (5, 4)
    assert views.prompt == DEFAULT_PROMPT
    env = CueReachEnv(TaskSpec(name="reach"), 11)
    assert np.allclose(where[:, 2:], env.targets[env.goal])  # one layout, one goal
    for frame, command, place, state in zip(frames, commands, where, views.states):
        view = env.place_robot(place[:2], state[3:5])
        np.testing.assert_array_equal(state, env.odometry())  # where it stands, at the velocity it was given
        assert np.abs(state[3:5]).max() <= env.spec.max_speed
        np.testing.assert_allclose(command, env.expert_command(), atol=1e-6)
        assert np.abs(frame.astype(int) - resize_frame(view, 64).astype(int)).mean() < 10  # same scene, own noise
    assert len({tuple(np.round(p[:2], 3)) for p in where}) == 5


def test_behaviour_cloning_fits_a_few_demonstrations(demo):
    model = random_model(3)
    with torch.no_grad():
        for name, param in model.named_parameters():  # from HF's init, as training starts
            param.normal_(0.0, 0.02) if not name.endswith("norm.weight") else param.fill_(1.0)
    losses: list[float] = []
    behaviour_cloning(model, [demo, demo], BcSpec(steps=40, batch=2, lr=3e-3, max_frames=16),
                      np.random.default_rng(0), lambda step, figures: losses.append(figures["action"]))
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])


def test_where_head_is_trained_but_not_exported(tmp_path):
    model = random_model(4)
    export(model, CONFIG, tmp_path, TrainSpec(dtype="float32"))
    names = set(load_checkpoint(tmp_path).tensors)
    assert not any(name.startswith(("where_head", "memory_goal_head")) for name in names)
    assert names == set(model.exported_state())


def test_the_aura_stage_trains_the_decoder_only_when_asked(demo):
    """The default aura stage trains aura.* alone; the decoder
    learns with it only under ``AuraSpec.train_decoder``."""
    demos = [demo, record_demo(TaskSpec(name="cue-reach", hold_s=0.3), seed=4, image_size=CONFIG.vision.image_size)]
    for train_decoder in (False, True):
        model = random_model(1)
        before = {name: param.detach().clone() for name, param in model.named_parameters()}
        spec = AuraSpec(2, 2, 1e-2, max_frames=12, train_decoder=train_decoder, bc_batch=2)
        train_aura(model, demos, spec, np.random.default_rng(0), lambda *_: None)
        moved = {name for name, param in model.named_parameters() if not torch.equal(param, before[name])}
        aura = {name for name in before if name.startswith("aura.")}
        assert moved & aura
        assert bool(moved - aura) == train_decoder, sorted(moved - aura)[:5]


def test_train_writes_a_checkpoint_every_policy_runs_on_and_repeats_itself(tmp_path):
    spec = TrainSpec(tasks=("cue-reach",), episodes=4, perception=StageSpec(2, 8, 1e-3),
                     bc=BcSpec(2, 2, 1e-3, max_frames=12), aura=AuraSpec(2, 2, 1e-3, max_frames=12),
                     dms=DmsSpec(2, 2, 1e-3, max_frames=8))
    first = train(spec, tmp_path / "a", "a")
    train(spec, tmp_path / "b", "b")
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert set(first.stages) == {"perception", "bc", "aura", "dms"}
    assert all(len(rows) == 2 for rows in first.stages.values())
    assert first.spec["seed"] == 0 and first.spec["aura"]["max_frames"] == 12
    checkpoint = load_checkpoint(tmp_path / "a")
    assert "aura.gate.weight" in checkpoint.tensors and checkpoint.storage_dtype == "BF16"
    frame = np.zeros((96, 96, 3), np.uint8)
    for policy in (make_policy(name, {"kv.dms.window": 32}) for name in ("fifo", "aura", "dms")):
        engine = VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=256, policy=policy)
        engine.set_prompt(list(PROMPT))
        action = engine.step(frame).action
        assert action.shape == (2,) and np.isfinite(action).all()


def test_a_memory_no_stage_trained_is_left_out_and_a_later_phase_trains_it_fresh(tmp_path):
    """A phase without the aura and dms stages writes neither memory (its gates would be initialisations read
    as learned); a phase that starts from it and runs them carries the rest over and writes both."""
    bc_only = TrainSpec(tasks=("cue-reach",), episodes=2, stages=("bc",), bc=BcSpec(1, 1, 1e-3, max_frames=6))
    train(bc_only, tmp_path / "bc", "bc")
    names = set(load_checkpoint(tmp_path / "bc").tensors)
    assert not any(n.startswith("aura.") or ".dms_gate." in n for n in names) and "action_head.weight" in names
    with pytest.raises(CheckpointError, match="`vla-edge train` learned ones when its recipe runs the aura stage"):
        check_aura(load_checkpoint(tmp_path / "bc"))
    later = replace(bc_only, init_from=str(tmp_path / "bc"), stages=("aura", "dms"),
                    aura=AuraSpec(1, 1, 1e-3, max_frames=6), dms=DmsSpec(1, 1, 1e-3, max_frames=6))
    train(later, tmp_path / "memory", "memory")
    memory = load_checkpoint(tmp_path / "memory")
    assert "aura.gate.weight" in memory.tensors and "model.layers.0.self_attn.dms_gate.weight" in memory.tensors
    assert np.array_equal(memory.float32("action_head.weight"), load_checkpoint(tmp_path / "bc").float32("action_head.weight"))


def test_write_labels_mark_where_the_cue_appears(demo):
    reach = record_demo(TaskSpec(name="reach"), seed=5, image_size=CONFIG.vision.image_size)
    whole = [np.arange(len(demo.frames)), np.arange(len(reach.frames))]
    labels = write_labels(make_batch([demo, reach], whole))
    assert 1 < demo.cue_frames < len(demo.frames) and reach.cue_frames == len(reach.frames)  # the ring: 9 frames / always
    assert labels.sum(1).tolist() == [1.0, 1.0] and labels[:, 0].tolist() == [1.0, 1.0]  # frame 0 of each, only
    after_cue = np.arange(demo.cue_frames, len(demo.frames))
    assert write_labels(make_batch([demo], [after_cue])).sum() == 0  # a window that lost the cue: nothing to write


def test_cue_write_recipe_forces_the_labels_then_hands_the_gate_control(demo):
    spec = AuraSpec(10, 1, 1e-3, train_decoder=True, cue_writes=True, forced_fraction=0.5, label_weight=2.0)
    batch = make_batch([demo], [np.arange(10)])
    forced, weight = write_forcing(spec, 4, 10, batch)
    assert torch.equal(forced, write_labels(batch)) and weight == 2.0
    later = [write_forcing(spec, step, 10, batch) for step in (5, 7, 9)]
    assert all(forced is None for forced, _ in later)
    assert [weight for _, weight in later] == pytest.approx([2.0, 1.0, 0.0])  # annealed away by the last step
    with pytest.raises(ValueError, match="forced_fraction"):
        AuraSpec(10, 1, 1e-3, cue_writes=True, forced_fraction=1.0)


def test_cue_write_training_writes_the_labels_then_the_gate_learns_them(demo):
    """Forced steps write exactly the labelled frames (one per episode here); the write-label loss moves the
    gate toward them, the decoder learns beside it, and the goal is regressed from the memory token of the
    frames after a write (smoke scale)."""
    demos = [demo, record_demo(TaskSpec(name="reach"), seed=6, image_size=CONFIG.vision.image_size)]
    model = random_model(5)
    decoder_before = model.action_head.weight.detach().clone()
    rows: list[dict[str, float]] = []
    spec = AuraSpec(10, 2, 3e-2, max_frames=10, train_decoder=True, bc_batch=0, decoder_lr=1e-3, cue_writes=True,
                    forced_fraction=0.7, label_weight=1.0, memory_goal=1.0, memory_warmup=2)
    train_aura(model, demos, spec, np.random.default_rng(0),
               lambda step, figures: rows.append(figures))
    warmup, rows = rows[:2], rows[2:]
    assert all(set(r) == {"loss", "memory_goal", "skipped"} for r in warmup)  # the memory alone first, no decoder pass
    forced = [r for r in rows if r["forced"]]
    assert len(forced) == 7 and all(r["write_rate"] == pytest.approx(0.1) for r in forced)  # 1 of 10 frames each
    assert rows[-1]["forced"] == 0.0
    assert np.mean([r["write_bce"] for r in forced[-3:]]) < 0.5 * np.mean([r["write_bce"] for r in forced[:3]])
    assert not torch.equal(model.action_head.weight, decoder_before)
    assert all("memory_goal" in r for r in forced) and model.memory_goal_head.weight.abs().sum() > 0


def test_the_memory_warm_up_writes_the_cue_and_learns_where_it_was(demo):
    """The warm-up's pairs are frame 0 (the one write label) and a later frame; on them ``aura.*`` alone
    learns to return the goal's position from the memory token (four layouts: the error must fall well
    below where it starts), and nothing outside the memory moves."""
    demos = [record_demo(TaskSpec(name="cue-reach", hold_s=0.3), seed=s, image_size=CONFIG.vision.image_size)
             for s in (11, 12, 13, 14)]
    pairs = cue_pairs(demos, 8, np.random.default_rng(0))
    assert pairs.frames.shape[1] == 2 and write_labels(pairs)[:, 0].eq(1).all() and write_labels(pairs)[:, 1].eq(0).all()
    model = random_model(7)
    encoder_before = next(model.vision.parameters()).detach().clone()
    rows: list[dict[str, float]] = []
    spec = AuraSpec(0, 2, 1e-2, max_frames=10, train_decoder=True, cue_writes=True, memory_goal=1.0, memory_warmup=30)
    train_aura(model, demos, spec, np.random.default_rng(1),
               lambda step, figures: rows.append(figures))
    assert len(rows) == 30 and all(set(r) == {"loss", "memory_goal", "skipped"} for r in rows)
    assert np.mean([r["memory_goal"] for r in rows[-10:]]) < 0.3 * np.mean([r["memory_goal"] for r in rows[:10]])
    assert torch.equal(next(model.vision.parameters()), encoder_before)


def test_the_memory_is_asked_where_the_goal_is_only_while_it_stays_put(demo):
    """A chase goal moves on after frame 0, so the warm-up never pairs a chase episode and the memory's goal
    regression skips its later frames; a cue-reach goal stays put, every frame counts."""
    chase = record_demo(TaskSpec(name="chase"), seed=4, image_size=CONFIG.vision.image_size)
    batch = make_batch([chase, demo], [np.arange(10), np.arange(10)])
    still = goal_unmoved(batch)
    assert still[0, 0] and not still[0, 1:].any() and still[1].all()
    pairs = cue_pairs([chase, demo], 16, np.random.default_rng(0))
    assert torch.equal(pairs.where[:, 0], pairs.where[:, 0][:1].expand(16, 4))  # every pair is the cue-reach demo
    with pytest.raises(ValueError, match="goal stays put"):
        cue_pairs([chase], 4, np.random.default_rng(0))


def test_the_aura_episodes_come_from_aura_tasks_only(demo, monkeypatch):
    """``aura.tasks`` picks the episodes the memory learns on; a task outside the phase's is refused."""
    import vla_edge_ros.train.stages as stages

    reach = record_demo(TaskSpec(name="reach"), seed=5, image_size=CONFIG.vision.image_size)
    drawn: list[str] = []
    real = stages.make_batch
    monkeypatch.setattr(stages, "make_batch", lambda demos, picks: (drawn.extend(d.task for d in demos),
                                                                    real(demos, picks))[1])
    spec = AuraSpec(3, 1, 1e-2, max_frames=6, tasks=("cue-reach",))
    train_aura(random_model(3), [reach, demo, reach], spec, np.random.default_rng(0), lambda *_: None)
    assert drawn == ["cue-reach"] * 3
    with pytest.raises(ValueError, match="aura.tasks"):
        TrainSpec(tasks=("reach",), aura=replace(spec, tasks=("cue-reach",)))


def test_a_stage_runs_alone_from_a_checkpoint(tmp_path):
    """``init_from: models/sim``, ``stages: [aura]``: the shipped weights are the start, only the aura stage runs,
    and on the frozen decoder every other exported tensor leaves it unchanged."""
    spec = from_shipped(tasks=("cue-reach",), episodes=2, aura=AuraSpec(2, 2, 1e-2, max_frames=12), stages=("aura",))
    log = train(spec, tmp_path, "aura")
    assert set(log.stages) == {"aura"} and log.demos["episodes"] == 2
    shipped, trained = load_checkpoint(SHIPPED), load_checkpoint(tmp_path)
    changed = {name for name in shipped.tensors
               if not np.array_equal(shipped.float32(name), trained.float32(name))}
    assert changed and all(name.startswith("aura.") for name in changed), sorted(changed)[:5]
    export(random_model(0), CONFIG, tmp_path / "small", TrainSpec(dtype="float32"))
    with pytest.raises(ValueError, match="differs from the preset"):
        train(replace(spec, init_from=str(tmp_path / "small")), tmp_path / "never", "never")


def test_the_progress_of_the_aura_stage_counts_its_memory_warm_up(tmp_path):
    """The memory warm-up runs inside the aura stage: progress numbers its steps and the stage's on from 0
    against one total, so a bar ends where the stage does."""
    aura = AuraSpec(2, 2, 1e-2, max_frames=12, train_decoder=True, bc_batch=0, cue_writes=True, memory_goal=1.0,
                    memory_warmup=3)
    spec = from_shipped(tasks=("cue-reach",), episodes=2, aura=aura, stages=("aura",))
    calls: list[tuple[str, int, int]] = []
    log = train(spec, tmp_path, "aura", lambda stage, step, steps, figures: calls.append((stage, step, steps)))
    assert calls == [("aura", step, 5) for step in range(5)] and len(log.stages["aura"]) == 5


def test_a_checkpoint_with_another_aura_layout_starts_the_memory_afresh(tmp_path):
    """An earlier train's ``concat`` memory cannot be carried into the ``hidden`` one: everything else loads,
    the memory keeps its fresh initialisation; ``aura.fresh`` asks for that with a memory of the same layout."""
    from vla_edge_ros.model.init_model import write_model

    export(random_model(0), CONFIG, tmp_path / "hidden", TrainSpec(dtype="float32"))
    stored = load_checkpoint(tmp_path / "hidden")
    arrays = {name: stored.float32(name) for name in stored.tensors}
    concat = CONFIG.hidden_size * CONFIG.vision.tokens_per_frame
    for name in ("aura.k_proj.weight", "aura.v_proj.weight"):
        arrays[name] = np.ones((arrays[name].shape[0], concat), np.float32)
    write_model(tmp_path / "concat", CONFIG, arrays, "float32")
    model = random_model(1)
    fresh = {name: p.detach().clone() for name, p in model.named_parameters() if name.startswith("aura.")}
    load_weights(model, tmp_path / "concat")
    assert all(torch.equal(p, fresh[name]) for name, p in model.named_parameters() if name.startswith("aura."))
    np.testing.assert_array_equal(model.action_head.weight.detach().numpy(), arrays["action_head.weight"])
    model = random_model(1)
    load_weights(model, tmp_path / "hidden", fresh_memory=True)  # the same layout, but a fresh memory asked for
    assert all(torch.equal(p, fresh[name]) for name, p in model.named_parameters() if name.startswith("aura."))
    np.testing.assert_array_equal(model.action_head.weight.detach().numpy(), stored.float32("action_head.weight"))
    load_weights(model, tmp_path / "hidden")  # the same layout: the memory loads too
    np.testing.assert_array_equal(model.aura.k_proj.weight.detach().numpy(), stored.float32("aura.k_proj.weight"))


def test_dagger_fills_half_of_each_aura_batch_with_the_policys_own_episodes(demo):
    """Collections at the start of each round (steps 0 and 2 of 4), aggregated: the second half of every batch
    is drawn from the episodes collected so far, the first from the demonstrations."""
    collected: list[list] = []

    def collect(round_: int) -> list:
        """Each round's episodes: the demonstration with its frames shifted, so every one is told apart."""
        assert round_ == len(collected)
        collected.append([replace(demo, frames=np.roll(demo.frames, 10 * round_ + i + 1, axis=0)) for i in range(2)])
        return collected[-1]

    spec = AuraSpec(4, 2, 1e-3, max_frames=10, dagger_episodes=2, dagger_rounds=2)
    made = list(aura_batches([demo], spec, np.random.default_rng(0), collect))
    assert len(made) == 4 and len(collected) == 2
    for step, batch in enumerate(made):
        pool = [episode for round_ in collected[:1 + step // 2] for episode in round_]
        np.testing.assert_array_equal(batch.frames[0][batch.valid[0]].numpy(), demo.frames[:10])
        own = batch.frames[1][batch.valid[1]].numpy()
        assert any(np.array_equal(own, episode.frames[:10]) for episode in pool)
    with pytest.raises(ValueError, match="need a collection"):
        next(aura_batches([demo], spec, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="half a batch of 8"):  # refused with the spec, before any demonstration
        AuraSpec(500, 8, 3e-3, dagger_episodes=3)


def test_the_aura_stages_dagger_drives_the_aura_policy_on_its_own_tasks(tmp_path):
    """An aura phase with ``dagger_episodes`` hands the trainer's collections to the runtime with the aura
    memory, on ``aura.tasks`` only, worded as their demonstrations, from the weights of the time (exported with
    the memory), and logs each collection as the aura stage's."""
    calls: list[tuple] = []

    def rollouts(name, checkpoint, episodes, dagger, policy):
        calls.append((name, policy, [episode.task for episode in episodes], check_aura(load_checkpoint(checkpoint))))
        return [record_demo(TaskSpec(name=episode.task), episode.seed % 1000, episode.image_size, FIXED,
                            chunk=episode.chunk) for episode in episodes]

    aura = AuraSpec(2, 2, 1e-2, max_frames=8, dagger_episodes=2, dagger_rounds=2, tasks=("cue-reach",))
    spec = TrainSpec(preset="sim", tasks=("reach", "cue-reach"), episodes=4, aura=aura, stages=("aura",),
                     dtype="float32")
    with pytest.raises(ValueError, match="DAgger needs the runtime"):
        train(spec, tmp_path / "never", "p")
    log = train(spec, tmp_path, "p", rollouts=rollouts)
    assert [call[:3] for call in calls] == [("p-aura0", "aura", ["cue-reach"] * 2), ("p-aura1", "aura", ["cue-reach"] * 2)]
    assert [(r["round"], r["episodes"], r["stage"]) for r in log.dagger] == [(0, 2, "aura"), (1, 2, "aura")]
    assert not (tmp_path / "dagger").exists()


TEMPLATES = ("head for the {color} marker, then stop right on it", "{color} one")


@pytest.fixture(scope="module")
def worded(tmp_path_factory):
    """A model that reads its instruction and the robot's odometry, its tokenizer, and a lang-reach and a reach
    demonstration worded by it (prompts of different lengths: the batch pads one)."""
    from vla_edge_ros.model.tokenizer_files import write_tokenizer
    from vla_edge_ros.train.demos import odometry_statistics
    from vla_edge_ros.train.wording import Wording, corpus

    config = replace(CONFIG, state=odometry_statistics(TaskSpec()))
    directory = tmp_path_factory.mktemp("worded")
    write_tokenizer(directory, corpus(TEMPLATES), config.vocab_size)
    wording = Wording(TEMPLATES, DEFAULT_PROMPT, InstructionTokenizer.load(directory, config.vocab_size))
    demos = [record_demo(TaskSpec(name=name), seed=seed, image_size=config.vision.image_size, wording=wording)
             for name, seed in (("lang-reach", 8), ("reach", 10))]
    torch.manual_seed(0)
    model = VlaModel(config, 32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.uniform_(0.8, 1.2) if name.endswith("norm.weight") else param.normal_(0.0, 0.08)
        for layer in model.model.layers:
            layer.self_attn.dms_gate.bias.fill_(0.0)
        model.aura.gate.weight.normal_(0.0, 1.0)
        model.aura.out_proj.weight.normal_(0.0, 0.5)
    export(model, config, directory, TrainSpec(dtype="float32"))
    return model, directory, demos


@pytest.mark.parametrize("policy_name", ["fifo", "aura", "dms"])
def test_a_model_that_reads_words_and_state_is_the_engine_in_a_padded_batch(worded, policy_name):
    """Each row of a batch whose prompts differ in length (positions continue after each one's own prompt, no
    query reads a pad) is what the engine computes for that prompt and those odometry states alone."""
    model, directory, demos = worded
    frames, window = 10, 24
    roles = InstructionTokenizer.load(directory, model.c.vocab_size).tokenizer.encode("user").ids
    assert len(roles) == 1  # the chat template's words are in the tokenizer's corpus
    lengths = [len(demo.prompt) for demo in demos]
    assert lengths[0] != lengths[1] and demos[0].prompt != DEFAULT_PROMPT
    assert np.abs(demos[0].states[1:, 3:5]).max() > 0  # the robot moved: velocities are in the states
    batch = make_batch(demos, [np.arange(frames)] * 2)
    knobs = {"kv.aura.beta": 0.5, "kv.aura.use_learned_gate": True, "kv.dms.window": window,
             "kv.dms.use_learned_gate": True, "kv.dms.target_ratio": 0.0, "kv.dms.threshold": 0.0}
    with torch.no_grad():
        if policy_name == "aura":
            expected, _ = aura_actions(model, batch, 0.5)
        else:
            mask = (DmsMask.for_frames(batch.prompts.width, frames, model.c.observation_tokens, window)
                    if policy_name == "dms" else None)
            expected, _ = sequence_actions(model, batch, mask)
    for row, demo in enumerate(demos):
        engine = VlaEngine(load_checkpoint(directory), backend="numpy", kv_capacity_tokens=1024,
                           policy=make_policy(policy_name, knobs))
        engine.set_prompt(list(demo.prompt))
        actions = np.stack([engine.step(demo.frames[i], state=demo.states[i]).chunk for i in range(frames)])
        np.testing.assert_allclose(actions, expected[row].numpy(), atol=3e-5)
    assert not torch.allclose(expected[0], expected[1], atol=1e-3)


def test_a_phase_that_starts_reading_the_state_keeps_everything_else(tmp_path, worded):
    """From a checkpoint without a state token: the decoder loads, the state projection and the aura memory (its
    query widened by the state token) start afresh; a checkpoint of another shape is still refused."""
    export(random_model(0), CONFIG, tmp_path / "plain", TrainSpec(dtype="float32"))
    model, _, _ = worded
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    load_weights(model, tmp_path / "plain")
    plain = load_checkpoint(tmp_path / "plain")
    np.testing.assert_array_equal(model.action_head.weight.detach().numpy(), plain.float32("action_head.weight"))
    for name, param in model.named_parameters():
        if name.startswith(("state_proj.", "aura.")):
            assert torch.equal(param, before[name]), name
    with torch.no_grad():  # the module fixture's model is shared: give it its weights back
        for name, param in model.named_parameters():
            param.copy_(before[name])


# --- chunks: the mlp head, its labels, a phase that changes the head --------------------------------------------

def replayed(spec: TaskSpec, seed: int, tick: int, where: np.ndarray, state: np.ndarray) -> CueReachEnv:
    """The world of ``seed`` at step ``tick`` with the robot where a recorded frame had it, moving as it did."""
    env = CueReachEnv(spec, seed)
    env.set_step(tick)
    env.place_robot(where[:2], state[3:5])
    return env


@pytest.mark.parametrize("task", ["chase", "cue-reach"])
def test_each_frame_is_labelled_with_the_experts_chunk_for_the_state_it_shows(task):
    """Demonstrations (noisy, so the robot moves as the expert would not) and perception views alike: a frame's
    label is ``expert_chunk`` of the world in that state (one formula), its first action the expert's command."""
    spec = TaskSpec(name=task, hold_s=0.3)
    demo = record_demo(spec, seed=7, image_size=64, chunk=12)
    assert demo.chunks.shape == (len(demo.frames), 12, 2) and demo.success
    for i in range(0, len(demo.frames), 5):
        env = replayed(spec, 7, i, demo.where[i], demo.states[i])
        np.testing.assert_allclose(demo.chunks[i], env.expert_chunk(12), atol=1e-5)
        np.testing.assert_allclose(demo.commands[i], env.expert_command(), atol=1e-5)
    assert np.abs(np.diff(demo.chunks[5:], axis=1)).max() > 0.01  # the chunks are not one command repeated


def test_chase_views_put_the_goal_on_its_path_and_label_the_experts_chunk():
    views = perception_samples(seed=4, image_size=64, count=6, task="chase", chunk=10)
    env = CueReachEnv(TaskSpec(name="chase"), 4)
    path = env.goal_position(np.arange(TaskSpec(name="chase").frames(8.0)))
    goals = views.where[:, 2:]
    assert len({tuple(np.round(g, 4)) for g in goals}) >= 4  # one goal, in several places on its path
    for k in range(6):
        ticks = np.flatnonzero(np.linalg.norm(path - goals[k], axis=1) < 1e-6)  # where its path has it (maybe twice)
        chunks = [replayed(TaskSpec(name="chase"), 4, int(t), views.where[k], views.states[k]).expert_chunk(10)
                  for t in ticks]
        assert any(np.allclose(views.chunks[k], chunk, atol=1e-5) for chunk in chunks), k
    reach = perception_samples(seed=4, image_size=64, count=6)  # a head of one action: the labels as before
    assert reach.chunks.shape == (6, 1, 2) and np.allclose(reach.where[:, 2:], reach.where[0, 2:])


def test_the_mlp_head_is_trained_on_the_l1_error_of_the_whole_chunk():
    from vla_edge_ros.train.stages import action_error

    predicted, target = torch.zeros(1, 2, 8, 2), torch.zeros(1, 2, 8, 2)
    target[0, 0, 7] = torch.tensor([0.5, -0.5])  # the last action of frame 0's chunk: it counts, as L1
    target[0, 1] = 3.0  # frame 1 is not valid (padding)
    valid = torch.tensor([[True, False]])
    assert float(action_error(random_model(0, config=CHUNKED), predicted, target, valid)) == pytest.approx(1.0 / 8)
    linear = random_model(0)
    assert float(action_error(linear, predicted[:, :, :1], target[:, :, 7:], valid)) == pytest.approx(0.5)  # MSE


def test_a_phase_that_changes_the_head_keeps_everything_else(tmp_path):
    """From a linear-head checkpoint into an mlp-head model: the decoder, encoder and memory load, the chunk
    head keeps its fresh initialisation; a chunk of 8 needs the mlp head."""
    linear = random_model(0)
    export(linear, CONFIG, tmp_path / "linear", TrainSpec(dtype="float32"))
    model = random_model(1, config=CHUNKED)
    fresh = {name: p.detach().clone() for name, p in model.named_parameters() if name.startswith("action_head.")}
    load_weights(model, tmp_path / "linear")
    stored = load_checkpoint(tmp_path / "linear")
    for name, param in model.exported_state().items():
        if name.startswith("action_head."):
            assert torch.equal(param, fresh[name]), name
        else:
            np.testing.assert_array_equal(param.numpy(), stored.float32(name), err_msg=name)
    with pytest.raises(ValueError, match="needs head: mlp"):
        TrainSpec(chunk=8)


def test_a_chunked_phase_on_chase_writes_a_checkpoint_the_engine_decodes_chunks_from(tmp_path):
    """``head: mlp, chunk: 6`` from models/sim (a chunk of 24, so the head starts afresh): config.json declares
    the chunk, every policy decodes [6, 2], and the losses are the chunk's."""
    spec = from_shipped(tasks=("reach", "chase"), episodes=4, head="mlp", chunk=6, mlp_hidden=32,
                        stages=("perception", "bc"), perception=StageSpec(2, 8, 1e-3), bc=BcSpec(2, 2, 1e-3, 12))
    log = train(spec, tmp_path, "chunk")
    assert set(log.stages) == {"perception", "bc"} and log.demos["episodes"] == 4
    checkpoint = load_checkpoint(tmp_path)
    assert (checkpoint.config.action.head, checkpoint.config.action.chunk, checkpoint.config.action.mlp_hidden) == (
        "mlp", 6, 32)
    assert checkpoint.tensors["action_head.fc2.weight"].shape == (12, 32)
    assert (log.spec["head"], log.spec["chunk"], log.spec["mlp_hidden"]) == ("mlp", 6, 32)
    assert all(np.isfinite(row["action"]) for rows in log.stages.values() for row in rows)
    for policy in (make_policy(name, {"kv.dms.window": 32}) for name in ("fifo", "aura", "dms")):
        engine = VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=256, policy=policy)
        engine.set_prompt(list(PROMPT))
        chunk = engine.step(np.zeros((96, 96, 3), np.uint8), state=np.zeros(6, np.float32)).chunk
        assert chunk.shape == (6, 2) and np.isfinite(chunk).all()


def _sqrt_at_zero(weight: torch.nn.Parameter, bad: set[int]) -> Callable[[int], tuple[torch.Tensor, dict[str, float]]]:
    """A loss that is finite at every step, whose gradient is not at the steps in ``bad`` (d sqrt(x)/dx at 0):
    how an aura stage of models/sim once turned every memory weight NaN at step 1,377 of 1,600."""
    def loss_of(step: int) -> tuple[torch.Tensor, dict[str, float]]:
        loss = (weight - 3).pow(2).sum()
        return (loss + torch.sqrt(weight[0] * 0) if step in bad else loss), {}
    return loss_of


def test_a_step_whose_gradient_is_not_finite_is_skipped_and_counted():
    weight, figures = torch.nn.Parameter(torch.zeros(2)), []
    fit([weight], StageSpec(steps=20, batch=1, lr=0.1), range(20), _sqrt_at_zero(weight, {5, 12}),
        lambda step, row: figures.append(row))
    assert torch.isfinite(weight).all() and float(weight.detach().min()) > 1  # it went on learning after both
    assert [row["skipped"] for row in figures] == [float(step in {5, 12}) for step in range(20)]
    assert all(np.isfinite(row["loss"]) for row in figures)


def test_a_run_of_non_finite_gradients_stops_the_stage_with_the_reason():
    weight = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="training diverged: 4 of 6 steps had a non-finite gradient"):
        fit([weight], StageSpec(steps=20, batch=1, lr=0.1), range(20), _sqrt_at_zero(weight, {2, 3, 4, 5}),
            lambda step, row: None)
