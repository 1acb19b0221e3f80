"""The mlp chunk head against a plain torch module built here, on every backend, and the checkpoint's rules.

The reference is torch's own Linear -> GELU -> Linear -> tanh over the checkpoint's tensors, then the q01/q99
mapping written out in torch: nothing of ours computes it. The decoder's hidden state comes from transformers'
Qwen2 over the same input embeddings, so the whole chain (frame in, chunk out) is held against torch.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.model.arena import KVArena
from vla_edge_ros.model.backends import make_backend
from vla_edge_ros.model.checkpoint import MLP_HEAD, load_checkpoint
from vla_edge_ros.model.config import ActionConfig, ModelConfigError
from vla_edge_ros.model.config_error import ModelConfigError as ConfigErrorBase
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.worlds.synthetic import SyntheticCamera

PROMPT = [3, 4, 9]
ACTION = ActionConfig(head="mlp", dof=3, chunk=4, mlp_hidden=24, q01=(-2.0, 0.0, -1.0), q99=(2.0, 4.0, 1.0),
                      normalize_mask=(True, True, False))


def micro(action: ActionConfig = ACTION):
    """A model small enough for the CUDA simulator (its kernels run every GPU thread as a Python thread)."""
    return replace(preset("tiny", layers=1), hidden_size=16, intermediate_size=24, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=8, vocab_size=256,
                   vision=replace(preset("tiny").vision, image_size=16, patch_size=4, tokens_per_frame=4),
                   action=action)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def chunk_model(request, tmp_path_factory):
    """The micro model with a random mlp head (stored fp32, and bf16 as real checkpoints are)."""
    return write_random_model(tmp_path_factory.mktemp("chunk") / request.param, micro(), seed=3, dtype=request.param)


def torch_head(checkpoint, hidden: np.ndarray) -> np.ndarray:
    """The chunk [H, dof] by torch: nn.Linear, nn.GELU() (exact), nn.Linear, tanh, then [-1, 1] -> [q01, q99]
    where normalize_mask says so."""
    torch = pytest.importorskip("torch")
    action = checkpoint.config.action
    fc1, b1, fc2, b2 = (torch.from_numpy(checkpoint.float32(name)) for name in MLP_HEAD)
    module = torch.nn.Sequential(torch.nn.Linear(fc1.shape[1], fc1.shape[0]), torch.nn.GELU(),
                                 torch.nn.Linear(fc2.shape[1], fc2.shape[0]))
    with torch.no_grad():
        for layer, weight, bias in ((module[0], fc1, b1), (module[2], fc2, b2)):
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
        normalized = torch.tanh(module(torch.from_numpy(hidden.astype(np.float32)))).reshape(action.chunk, action.dof)
        q01, q99 = torch.tensor(action.q01), torch.tensor(action.q99)
        scaled = 0.5 * (normalized + 1.0) * (q99 - q01) + q01
        return torch.where(torch.tensor(action.normalize_mask), scaled, normalized).numpy()


@pytest.mark.parametrize("backend", ["numpy", "cuda"])
def test_each_backend_s_head_equals_torch_on_the_same_hidden_state(chunk_model, backend):
    checkpoint = load_checkpoint(chunk_model)
    engine = VlaEngine(checkpoint, backend=backend, kv_capacity_tokens=12)
    hidden = np.random.default_rng(5).standard_normal(16).astype(np.float32) * 2
    chunk = engine.head.from_preactivation(engine.backend.action_mlp(hidden))
    assert chunk.shape == (4, 3)
    np.testing.assert_allclose(chunk, torch_head(checkpoint, hidden), rtol=1e-5, atol=1e-6)


def test_a_cycle_s_chunk_equals_transformers_decoder_then_the_torch_head(chunk_model):
    """Frame in, chunk out: our decoder and head against transformers' Qwen2 over the same input embeddings
    (the prompt's rows of the table, then the frame encoder's tokens) and the torch head."""
    torch = pytest.importorskip("torch")
    from vla_edge_ros.tools.parity import load_reference

    checkpoint = load_checkpoint(chunk_model)
    engine = VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=12)
    engine.set_prompt(PROMPT)
    frame = SyntheticCamera(height=16, width=16, seed=6).frame()
    result = engine.step(frame)
    model = load_reference(chunk_model)
    table = model.get_input_embeddings().weight.detach().numpy()
    sequence = np.concatenate([table[PROMPT], engine.encoder.encode(frame)])
    with torch.no_grad():
        hidden = model.model(inputs_embeds=torch.from_numpy(sequence[None])).last_hidden_state[0, -1].numpy()
    assert result.tokens == [] and result.chunk.shape == (4, 3)
    np.testing.assert_array_equal(result.action, result.chunk[0])
    np.testing.assert_allclose(result.chunk, torch_head(checkpoint, hidden), rtol=1e-4, atol=1e-5)


def test_the_backends_hold_the_head_s_bytes_the_plan_counts(chunk_model):
    checkpoint = load_checkpoint(chunk_model)
    for backend in ("numpy", "cuda"):
        held = make_backend(backend, checkpoint, KVArena(12)).state_bytes()[0]
        decoder = make_backend(backend, load_checkpoint(chunk_model), KVArena(12))
        decoder.head = None  # the same backend without its head
        assert held - decoder.state_bytes()[0] == sum(checkpoint.held_bytes(name, backend) for name in MLP_HEAD)


def test_a_head_without_a_chunk_is_asked_for_one_and_says_so(tiny_model):
    backend = make_backend("numpy", load_checkpoint(tiny_model), KVArena(64))
    with pytest.raises(ValueError, match="action head is 'bins', not 'mlp'"):
        backend.action_mlp(np.zeros(256, np.float32))


# --- bins decoded in parallel (H > 1) -------------------------------------------------------------------------

BINS = ActionConfig(head="bins", dof=2, chunk=3, q01=(-2.0, 0.0), q99=(2.0, 4.0))


@pytest.fixture(scope="module")
def parallel_model(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("parallel") / "m", micro(BINS), seed=4, dtype="float32")


def _parallel_cycle(model_dir, backend: str):
    engine = VlaEngine(load_checkpoint(model_dir), backend=backend, kv_capacity_tokens=16)
    engine.set_prompt(PROMPT)
    frame = SyntheticCamera(height=16, width=16, seed=6).frame()
    return engine, frame, engine.add_frame(frame)


def test_parallel_bins_equal_transformers_argmax_over_zero_placeholders(parallel_model):
    """H x dof zero embeddings after the observation, in one forward: each position's logits over the bins
    equal transformers' Qwen2 over the same input embeddings, and so does each bin, token by token."""
    torch = pytest.importorskip("torch")
    from vla_edge_ros.tools.parity import load_reference

    engine, frame, prefill = _parallel_cycle(parallel_model, "numpy")
    used = engine.arena.used
    steps: list[object] = []
    chunk, tokens = engine.decode_action(prefill, admit=lambda: steps.append("admit") or True, done=steps.append)
    assert steps == ["admit", True] and engine.arena.used == used  # one admitted step; placeholders were scratch
    model = load_reference(parallel_model)
    table = model.get_input_embeddings().weight.detach().numpy()
    count = BINS.chunk * BINS.dof
    sequence = np.concatenate([table[PROMPT], engine.encoder.encode(frame), np.zeros((count, 16), np.float32)])
    with torch.no_grad():
        logits = model(inputs_embeds=torch.from_numpy(sequence[None])).logits[0, -count:].numpy()
    rows = engine.head.bin_rows
    ours = engine.backend.logits(engine.backend.forward(  # the same pass again, to read its logits
        prefill.next_position + np.arange(count, dtype=np.int32), engine.arena.allocate(count),
        embeddings=np.zeros((count, 16), np.float32)).hidden, rows)
    np.testing.assert_allclose(ours, logits[:, rows], rtol=1e-4, atol=1e-5)
    expected = np.argmax(logits[:, rows], axis=1)
    assert tokens == [engine.head.first_bin_token + int(b) for b in expected]
    assert chunk.shape == (3, 2)
    np.testing.assert_array_equal(chunk, engine.head.from_bins(expected))


def test_a_refused_parallel_step_leaves_no_placeholder_behind(parallel_model):
    engine, _, prefill = _parallel_cycle(parallel_model, "numpy")
    used = engine.arena.used
    assert engine.decode_action(prefill, admit=lambda: False) is None and engine.arena.used == used


@pytest.mark.slow  # the simulated CUDA prefill and placeholder pass take ~10 s
def test_parallel_bins_are_the_same_on_cuda(parallel_model):
    decoded = {backend: _parallel_cycle(parallel_model, backend) for backend in ("numpy", "cuda")}
    results = {backend: engine.decode_action(prefill) for backend, (engine, _, prefill) in decoded.items()}
    assert results["cuda"][1] == results["numpy"][1]


# --- what a checkpoint may declare ---------------------------------------------------------------------------

@pytest.mark.parametrize("action, message", [
    (dict(head="linear", chunk=2), "the 'linear' head gives one action a cycle"),
    (dict(head="mlp", chunk=0, mlp_hidden=8), "chunk must be an integer from 1 to 1024, got 0"),
    (dict(head="mlp", chunk=True, mlp_hidden=8), "chunk must be an integer from 1 to 1024, got True"),
    (dict(head="mlp", chunk=2.5, mlp_hidden=8), "chunk must be an integer from 1 to 1024, got 2.5"),
    (dict(head="mlp", chunk="8", mlp_hidden=8), "chunk must be an integer"),
    (dict(head="mlp", chunk=2000, mlp_hidden=8), "from 1 to 1024, got 2000"),
    (dict(head="mlp", chunk=4), "mlp_hidden .* must be set for the 'mlp' head and only for it"),
    (dict(head="bins", mlp_hidden=8), "must be set for the 'mlp' head and only for it"),
    (dict(head="diffusion"), "head must be one of \\['bins', 'linear', 'mlp'\\], got 'diffusion'"),
])
def test_a_bad_chunk_or_head_in_config_json_is_refused_naming_the_key(tmp_path, action, message):
    out = write_random_model(tmp_path / "ok", micro(ActionConfig(head="linear", dof=3)), seed=0)
    raw = json.loads((out / "config.json").read_text())
    raw["vla"]["action"] = {"dof": 3, **action}
    (out / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigErrorBase, match=message):
        load_checkpoint(out)
    assert ModelConfigError is ConfigErrorBase


def test_a_missing_or_misshapen_head_tensor_is_named(tmp_path):
    from vla_edge_ros.model.safetensors_io import read_safetensors, write_safetensors

    source = write_random_model(tmp_path / "m", micro(), seed=0, dtype="float32")
    out = tmp_path / "lacking"
    out.mkdir()
    (out / "config.json").write_text((source / "config.json").read_text())
    tensors = read_safetensors(source / "model.safetensors")
    del tensors["action_head.fc2.bias"]
    write_safetensors(out / "model.safetensors", tensors)
    with pytest.raises(ValueError, match="action_head.fc2.bias"):
        load_checkpoint(out)


def test_init_model_writes_random_chunked_checkpoints_and_refuses_a_linear_chunk(tmp_path, capsys):
    from vla_edge_ros.cli import main

    assert main(["init-model", "--out", str(tmp_path / "m"), "--layers", "1", "--head", "mlp", "--chunk", "8"]) == 0
    assert "mlp head, 8 actions of 7 a cycle" in capsys.readouterr().out
    action = load_checkpoint(tmp_path / "m").config.action
    assert (action.head, action.chunk, action.dof, action.mlp_hidden) == ("mlp", 8, 7, 256)
    assert main(["init-model", "--out", str(tmp_path / "b"), "--preset", "sim", "--chunk", "8"]) == 2
    err = capsys.readouterr().err
    assert "a chunk needs the 'mlp' or 'bins' head" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()
    assert main(["init-model", "--out", str(tmp_path / "p"), "--layers", "1", "--chunk", "4"]) == 0
    assert "bins head, 4 actions of 7 a cycle" in capsys.readouterr().out
