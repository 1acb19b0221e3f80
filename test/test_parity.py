"""Our numpy forward pass against HuggingFace transformers on the same weights."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_models import VARIANTS, write_hf_model  # noqa: E402
from vla_edge_ros.model.arena import KVArena  # noqa: E402
from vla_edge_ros.model.checkpoint import load_checkpoint  # noqa: E402
from vla_edge_ros.model.numpy_backend import NumpyBackend  # noqa: E402
from vla_edge_ros.parity import Agreement, load_reference, reference_forward, run_parity  # noqa: E402

TOKENS = [3, 17, 250, 9, 42, 199, 7, 120, 64, 5, 31]


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def hf_model(request, tmp_path_factory):
    return write_hf_model(tmp_path_factory.mktemp(request.param), request.param)


def test_logits_and_every_layer_match_huggingface(hf_model):
    report = run_parity(hf_model, TOKENS, "numpy")
    assert report.logits.cosine >= 0.99999, report.logits
    assert len(report.layers) == load_checkpoint(hf_model, require_vla=False).config.num_hidden_layers + 1
    for index, layer in enumerate(report.layers):
        assert layer.cosine >= 0.99999, (index, layer)
    assert report.incremental.cosine >= 0.99999
    assert report.incremental.max_abs_error < 1e-3


def _hf_logits_with_mask(model_dir, ids: list[int], visible: np.ndarray) -> np.ndarray:
    """HF logits where query t may read token s only if visible[t, s] (a custom 4-D attention mask)."""
    import torch

    model = load_reference(model_dir)
    mask = torch.from_numpy(visible)[None, None]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), attention_mask={"full_attention": mask}, use_cache=False)
    return out.logits[0].numpy()


EVICTED = [2, 3, 6]


def test_attention_over_cache_with_evicted_middle_tokens_matches_hf_with_them_masked(hf_model):
    """Prefill everything, evict middle tokens, decode: the new token must not see the evicted ones."""
    checkpoint = load_checkpoint(hf_model, require_vla=False)
    arena = KVArena(16)
    backend = NumpyBackend(checkpoint, arena)
    count = len(TOKENS)
    positions = np.arange(count, dtype=np.int32)
    backend.forward(positions, positions, token_ids=np.asarray(TOKENS))
    arena.release(np.asarray(EVICTED, dtype=np.int32))
    new_token = 77
    hidden = backend.forward(np.array([count]), arena.allocate(1), token_ids=np.array([new_token])).hidden
    ours = backend.logits(hidden)[-1]

    visible = np.tril(np.ones((count + 1, count + 1), dtype=bool))
    visible[-1, EVICTED] = False
    reference = _hf_logits_with_mask(hf_model, TOKENS + [new_token], visible)[-1]
    assert Agreement.of(ours, reference).cosine >= 0.99999
    # the eviction was honoured: attending over everything gives something else
    full = _hf_logits_with_mask(hf_model, TOKENS + [new_token], np.tril(visible | True))[-1]
    assert Agreement.of(ours, full).cosine < 0.99999


def test_cache_holding_kept_tokens_matches_hf_forward_over_them_at_original_positions(hf_model):
    """A cache whose tokens sit at gappy positions equals HF's forward with those position ids."""
    checkpoint = load_checkpoint(hf_model, require_vla=False)
    kept = [i for i in range(len(TOKENS)) if i not in EVICTED]
    ids = [TOKENS[i] for i in kept] + [77]
    positions = kept + [len(TOKENS)]
    backend = NumpyBackend(checkpoint, KVArena(16))
    prefix = np.asarray(positions[:-1], dtype=np.int32)
    backend.forward(prefix, np.arange(prefix.size, dtype=np.int32), token_ids=np.asarray(ids[:-1]))
    hidden = backend.forward(np.array(positions[-1:]), np.array([prefix.size]), token_ids=np.array(ids[-1:])).hidden
    reference, _ = reference_forward(load_reference(hf_model), ids, positions)
    assert Agreement.of(backend.logits(hidden)[-1], reference[-1]).cosine >= 0.99999


def test_rerotated_key_equals_key_computed_at_the_new_position(hf_model):
    checkpoint = load_checkpoint(hf_model, require_vla=False)
    moved, direct = (NumpyBackend(checkpoint, KVArena(4)) for _ in range(2))
    token = np.array([TOKENS[4]])
    moved.forward(np.array([3]), np.array([0]), token_ids=token)
    moved.rotate_keys(np.array([0]), np.array([37 - 3]))
    direct.forward(np.array([37]), np.array([0]), token_ids=token)
    np.testing.assert_allclose(moved.k_cache[:, :, 0], direct.k_cache[:, :, 0], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(moved.v_cache, direct.v_cache)
