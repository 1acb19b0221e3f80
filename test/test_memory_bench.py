"""The cue scenes and the memory benchmark: deterministic scenes, a tiny sweep, provable fifo outcomes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vla_edge_ros.cli import main
from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.memory import make_policy
from vla_edge_ros.model.arena import KVArena
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.model.numpy_backend import NumpyBackend
from vla_edge_ros.tools.memory_bench import AURA_GATES, SCHEMA, BenchSpec, format_table, run_bench
from vla_edge_ros.tools.memory_bench.attention import last_token_attention, probe_frame
from vla_edge_ros.worlds.scenes import MAX_CLASSES, CueScene
from vla_edge_ros.worlds.synthetic import SyntheticCamera

ROW_KEYS = {"policy", "gate", "gate_rate", "signature", "target_ratio", "distractors", "budget_frames",
            "kv_capacity_tokens", "protect_recent_frames", "episodes", "cue_kept", "cue_entries_kept", "cue_centre_kept",
            "cue_attention",
            "uniform_attention", "readout_accuracy", "chance", "compression", "forced_evictions", "writes_per_frame",
            "evictions", "memory_bytes", "kv_bytes", "state_bytes"}


def mean_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float32) - b.astype(np.float32)).mean())


def test_same_seed_same_bytes_other_seed_other_scene():
    first, again, other = (CueScene(seed).episode(1, 5) for seed in (7, 7, 8))
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first, again))
    assert first[0].shape == (64, 64, 3) and first[0].dtype == np.uint8 and len(first) == 7
    assert mean_abs(first[1], other[1]) > 5


def test_cue_classes_differ_and_bad_classes_are_refused():
    scene = CueScene(3, classes=MAX_CLASSES, noise_sigma=0.0)
    cues = [scene.cue_frame(c) for c in range(MAX_CLASSES)]
    assert min(mean_abs(a, b) for i, a in enumerate(cues) for b in cues[i + 1:]) > 2
    with pytest.raises(ValueError, match="cue class must be in"):
        CueScene(0, classes=2).cue_frame(2)
    for classes in (0, MAX_CLASSES + 1):
        with pytest.raises(ValueError, match="cue classes"):
            CueScene(0, classes=classes)


@pytest.mark.parametrize("seed", range(5))
def test_distractors_are_near_duplicates_unlike_the_cue_frame_around_the_cue(seed):
    scene = CueScene(seed)
    cue, *distractors = scene.episode(seed % 4, 6)
    pairs = [(a, b) for i, a in enumerate(distractors) for b in distractors[i + 1:]]
    assert max(mean_abs(a, b) for a, b in pairs) < 0.1 * 255  # noise and a 1-2 px jitter: slight
    cy, cx, radius = scene.cue_region(seed % 4)
    box = (slice(int(cy - radius), int(cy + radius)), slice(int(cx - radius), int(cx + radius)))
    around_cue = min(mean_abs(cue[box], d[box]) for d in distractors)
    assert around_cue > 1.5 * max(mean_abs(a[box], b[box]) for a, b in pairs)


@pytest.fixture(scope="module")
def one_layer_model(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("bench") / "m", preset("tiny", layers=1), seed=1)


@pytest.fixture(scope="module")
def report(one_layer_model):
    spec = BenchSpec(episodes=4, distractors=(3, 6), budgets=(2, 8), classes=2, prototypes_per_class=1,
                     overhead_arena_frames=4, overhead_frames=5, dms_targets=(1.0, 4.0), dms_window=8,
                     dms_lead_in=2, compression_frames=24)
    return run_bench(spec, one_layer_model)


def test_report_schema(report):
    assert report["schema"] == SCHEMA
    assert {"config", "rows", "aura_readout_ceiling", "dms_compression", "overhead", "claims",
            "runtime_s"} <= report.keys()
    assert all(row.keys() == ROW_KEYS for row in report["rows"])
    # N x (fifo x F + cosine x 3 signatures x F + aura gates + dms x 2 targets x F)
    assert len(report["rows"]) == 2 * (2 + 3 * 2 + len(AURA_GATES) + 2 * 2)
    assert {r["signature"] for r in report["rows"] if r["policy"] == "cosine"} == {"keys", "values", "embeddings"}
    assert [o["policy"] for o in report["overhead"]] == ["fifo", "cosine", "aura", "dms"]
    assert all(o["policy_ms"] > 0 and o["add_frame_ms"] >= o["policy_ms"] for o in report["overhead"])
    assert [c["id"] for c in report["claims"]] == ["1", "2a", "2b", "3", "4", "4c", "4b"]
    assert all(c["verdict"] in ("holds", "fails", "not tested") for c in report["claims"])
    assert "claim 2a" in format_table(report) and "dms target 4x over 24 frames" in format_table(report)


def test_dms_compression_is_measured_per_target_and_judged_from_the_numbers(report):
    keep_all, four = report["dms_compression"]
    assert (keep_all["target_ratio"], keep_all["frames"], keep_all["tokens_seen"]) == (1.0, 24, 24 * 16)
    # target 1 keeps every token in every head: nothing compressed, nothing forced
    assert keep_all["compression"] == keep_all["slot_compression"] == 1.0 and keep_all["forced_evictions"] == 0
    assert four["forced_evictions"] == 0 and four["slot_compression"] <= four["compression"] <= \
        four["decision_compression"]
    assert len(four["held_per_head"]) == 1 and len(four["held_per_head"][0]) == 2  # 1 layer x 2 KV heads
    claim = report["claims"][4]
    assert claim["evidence"] == report["dms_compression"]
    reached = all(c["compression"] >= 0.95 * c["target_ratio"] for c in report["dms_compression"])
    assert claim["verdict"] == ("holds" if reached else "fails")
    # bytes: target 1 holds the prompt (8) and every token (24 x 16) in every head: 24.5 pages of 16, so 25
    per_token = report["config"]["kv_bytes_per_token"]  # both heads' keys and values
    assert keep_all["kv_bytes_dense"] == (24 * 16 + 8) * per_token and keep_all["page_tokens"] == 16
    assert keep_all["byte_compression"] == pytest.approx(24 * 16 / (25 * 16 - 8))
    assert keep_all["pages_per_head"] == [[25, 25]]
    assert keep_all["kv_bytes_held"] == keep_all["kv_bytes_dense"] + 8 * per_token  # half of each last page empty
    assert four["byte_compression"] > 1 and len(four["byte_compression_per_layer"]) == 1
    frees = report["claims"][5]
    assert frees["id"] == "4c" and frees["verdict"] == ("holds" if all(
        c["byte_compression"] >= 0.85 * c["compression"] for c in report["dms_compression"]) else "fails")
    for row in (r for r in report["rows"] if r["policy"] == "dms"):
        assert 0 <= row["cue_entries_kept"] <= 1 and row["cue_kept"] >= (row["cue_entries_kept"] > 0)
        assert 0 <= row["cue_centre_kept"] <= 1 and (row["cue_centre_kept"] == 0 or row["cue_kept"] > 0)
        assert row["compression"] >= 1 and row["uniform_attention"] <= 1
        if row["target_ratio"] == 1.0 and row["forced_evictions"] == 0:  # nothing left: the cue is whole
            assert row["cue_entries_kept"] == row["cue_centre_kept"] == 1.0


def test_fifo_keeps_exactly_the_last_budget_frames(report):
    # episode = cue + N distractors + query; fifo holds the last F frames, so the cue survives iff N + 2 <= F
    for row in (r for r in report["rows"] if r["policy"] == "fifo"):
        if row["distractors"] + 2 > row["budget_frames"]:
            assert row["cue_kept"] == 0 and row["cue_attention"] == 0, row
        else:
            assert row["cue_kept"] == 1 and row["cue_attention"] > 0, row


# cue_attention of the report's cells where the cue is read (policy, target ratio, N, F), as the probe measured
# it from inside the forward pass before it moved out of the runtime (be538ac)
ATTENTION_BEFORE = {
    ("fifo", None, 3, 8): 0.1816958747804165, ("fifo", None, 6, 8): 0.1187774259597063,
    ("dms", 1.0, 3, 2): 0.04878342431038618, ("dms", 1.0, 3, 8): 0.13367001712322235,
    ("dms", 4.0, 3, 2): 0.04999185772612691, ("dms", 4.0, 3, 8): 0.08206377178430557,
    ("dms", 1.0, 6, 2): 0.048722376115620136, ("dms", 1.0, 6, 8): 0.09011643007397652,
    ("dms", 4.0, 6, 2): 0.04963076766580343, ("dms", 4.0, 6, 8): 0.07077432237565517,
}


def test_the_attention_figures_are_those_of_the_probe_inside_the_forward(report):
    got = {(r["policy"], r["target_ratio"], r["distractors"], r["budget_frames"]): r["cue_attention"]
           for r in report["rows"] if r["policy"] in ("fifo", "dms") and r["cue_attention"]}
    assert got == pytest.approx(ATTENTION_BEFORE, rel=1e-6, abs=0)


def camera_frames(count: int, seed: int = 0) -> list[np.ndarray]:
    camera = SyntheticCamera(height=64, width=64, seed=seed)
    return [camera.frame() for _ in range(count)]


def bench_engine(model_dir, policy: str) -> VlaEngine:
    engine = VlaEngine(load_checkpoint(model_dir), backend="numpy", kv_capacity_tokens=160,
                       policy=make_policy(policy, {"kv.dms.window": 8}))
    engine.set_prompt([5, 6, 7])
    return engine


def test_the_probe_is_a_distribution_over_what_the_frame_may_read(one_layer_model):
    engine = bench_engine(one_layer_model, "fifo")
    first = engine.add_frame(camera_frames(1)[0])
    second, weights = probe_frame(engine, camera_frames(2, seed=3)[1])
    config = engine.config
    assert weights.shape == (config.num_hidden_layers, config.num_attention_heads, engine.arena.capacity)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-5)
    readable = np.zeros(engine.arena.capacity, dtype=bool)
    readable[np.concatenate([engine.prompt_slots, first.slots, second.slots])] = True
    assert np.all(weights[..., ~readable] == 0) and np.all(weights[..., first.slots].sum(-1) > 0)


@pytest.mark.parametrize("policy", ["fifo", "dms"])
def test_probing_a_frame_changes_nothing_the_engine_computes(one_layer_model, policy):
    """The same frames with and without the probe on the last: the same hidden state, cache and memory, bit for
    bit, and the backend's own forward back in place."""
    images = camera_frames(12, seed=5)
    plain, probed = bench_engine(one_layer_model, policy), bench_engine(one_layer_model, policy)
    for image in images[:-1]:
        plain.add_frame(image)
        probed.add_frame(image)
    expected = plain.add_frame(images[-1])
    got, _ = probe_frame(probed, images[-1])
    assert np.array_equal(got.hidden, expected.hidden) and np.array_equal(got.slots, expected.slots)
    assert np.array_equal(probed.backend.k_rows, plain.backend.k_rows)
    assert np.array_equal(probed.backend.v_rows, plain.backend.v_rows)
    assert probed.memory_stats() == plain.memory_stats()
    assert "forward" not in vars(probed.backend)


def test_the_probe_matches_huggingface_attention_weights(tmp_path):
    """An independent judge: transformers' eager attention returns the weights; the probe must agree."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hf_models import write_hf_model

    model_dir = write_hf_model(tmp_path / "hf", "gqa2_tied")  # 2 layers, 4 query heads over 2 KV heads
    backend = NumpyBackend(load_checkpoint(model_dir, require_vla=False), KVArena(16))
    ids = [3, 17, 25, 9, 32, 19, 7, 12, 36, 5, 31]
    positions = np.arange(len(ids), dtype=np.int32)
    out = backend.forward(positions, positions, token_ids=np.asarray(ids), collect_layers=True)
    ours = last_token_attention(backend, out.layer_hidden, positions, None)
    model = transformers.Qwen2ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                          attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False).attentions
    assert len(theirs) == ours.shape[0] == 2
    for layer, weights in enumerate(theirs):
        np.testing.assert_allclose(ours[layer, :, :len(ids)], weights[0, :, -1].numpy(), rtol=1e-4, atol=1e-6)
    assert not ours[..., len(ids):].any()


def test_aura_state_is_the_same_size_for_every_n_and_gates_share_one_budget(report):
    aura = [r for r in report["rows"] if r["policy"] == "aura"]
    assert {r["state_bytes"] for r in aura} == {4224} and report["claims"][1]["verdict"] == "holds"
    for n in (3, 6):
        gates = {r["gate"]: r for r in aura if r["distractors"] == n}
        assert gates["every_frame"]["writes_per_frame"] == 1.0
        assert gates["random"]["gate_rate"] == gates["periodic"]["gate_rate"] == pytest.approx(
            gates["surprise"]["writes_per_frame"])


def test_cli_writes_the_json(one_layer_model, tmp_path, capsys):
    args = ["memory-bench", "--model", str(one_layer_model), "--episodes", "2", "--distractors", "6",
            "--budgets", "2,4", "--classes", "2", "--policies", "fifo,aura", "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr()
    data = json.loads((tmp_path / "memory_bench.json").read_text())
    assert data["config"]["policies"] == ["fifo", "aura"] and data["config"]["distractors"] == [6]
    assert {r["cue_kept"] for r in data["rows"] if r["policy"] == "fifo"} == {0.0}
    assert data["claims"][0]["verdict"] == "not tested"  # no cosine, nothing to compare
    assert "memory_bench.json" in out.out and "N=6" in out.err


@pytest.mark.parametrize("bad", [["--distractors", ""], ["--budgets", "0,4"], ["--policies", "fifo,lru"], ["--cosine-signatures", "pixels"],
                                 ["--episodes", "-1"], ["--classes", "9"], ["--seed", "x"]])
def test_bad_cli_values_exit_2(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["memory-bench", *bad])
    assert exc.value.code == 2 and "error" in capsys.readouterr().err
