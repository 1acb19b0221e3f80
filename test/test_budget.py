"""The memory plan adds up, and a configuration over budget is refused before anything loads."""

from __future__ import annotations

import pytest

from vla_edge_ros.config import parse_settings
from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.model.budget import BudgetError
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.runtime.loader import load_engine, plan_for


def _settings(model_dir, **params):
    base = {"model_dir": str(model_dir), "backend": "numpy"}
    return parse_settings({"reasoning": {"ros__parameters": {**base, **params}}}, "test.yaml")


@pytest.mark.parametrize("weights", ["auto", "float32", "bfloat16", "int8", "int4"])
def test_plan_matches_what_the_numpy_engine_allocates(tiny_model, weights):
    plan, checkpoint = plan_for(_settings(tiny_model, kv_capacity_tokens=256, weights=weights, weights_group=32))
    engine = VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=256)
    backend_weights, backend_kv = engine.backend.state_bytes()
    assert plan.kv_arena_bytes == backend_kv
    c = checkpoint.config
    assert plan.kv_bytes_per_token == 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4
    # the plan counts matrices in their format and every other tensor widened to fp32; the decoder share of it
    # is what the backend holds (the frame encoder and the aura memory's projections live beside it)
    beside = sum(t.array.size for n, t in checkpoint.tensors.items() if n.startswith(("vision.", "aura."))) * 4
    assert plan.weight_bytes - beside == backend_weights
    assert plan.total_bytes == plan.weight_bytes + plan.kv_arena_bytes + plan.workspace_bytes
    narrower = {"int8": 3.5, "int4": 4.5}.get(weights)  # matrices are most of the bytes (int4: token tables int8)
    if narrower:
        fp32, _ = plan_for(_settings(tiny_model, kv_capacity_tokens=256, weights="float32"))
        assert fp32.weight_bytes > narrower * plan.weight_bytes


def test_qwen_shape_kv_bytes_per_token():
    from vla_edge_ros.model.init_model import preset
    from vla_edge_ros.model.layout import kv_bytes_per_token

    c = preset("qwen2.5-1.5b-shape")
    assert (c.num_hidden_layers, c.num_key_value_heads, c.head_dim) == (28, 2, 128)  # Qwen2.5-1.5B's shape
    # 2 (key and value) x 28 layers x 2 KV heads x 128 head_dim x bytes per value: 28,672 B per token in
    # bf16 (2 B); the arena keeps fp32 (4 B), twice that
    assert kv_bytes_per_token(c) == 2 * 28 * 2 * 128 * 4 == 2 * 28_672


def test_over_budget_is_refused_with_the_breakdown(tiny_model):
    settings = _settings(tiny_model, budget_bytes=2 ** 20, kv_capacity_tokens=4096)
    with pytest.raises(BudgetError) as info:
        load_engine(settings)
    text = str(info.value)
    assert "DOES NOT FIT" in text and "kv arena" in text and "weights" in text


def test_load_engine_prefills_the_prompt(tiny_model):
    engine, plan, store, *_ = load_engine(_settings(tiny_model, prompt_token_ids=[5, 6, 7]))
    assert plan.fits and engine.arena.used == 3 and store is None


def test_prompt_ids_beyond_the_vocabulary_are_refused(tiny_model):
    with pytest.raises(ValueError, match="vocab_size"):
        load_engine(_settings(tiny_model, prompt_token_ids=[5, 99999]))


def test_checkpoint_header_only(tiny_model):
    checkpoint = load_checkpoint(tiny_model)
    assert checkpoint.weight_bytes() < (tiny_model / "model.safetensors").stat().st_size


def test_load_engine_caps_blas_threads(tiny_model):
    from threadpoolctl import threadpool_info

    load_engine(_settings(tiny_model, blas_threads=1))
    blas = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
    assert blas and all(pool["num_threads"] == 1 for pool in blas)


def test_plan_counts_the_pages_of_a_pool_smaller_than_the_dense_size(tiny_model):
    settings = _settings(tiny_model, kv_capacity_tokens=256, kv_page_tokens=8, kv_pool_pages=80, **{"kv.policy": "dms"})
    plan, checkpoint = plan_for(settings)
    engine = load_engine(settings, policies=("dms",)).engine
    c = checkpoint.config
    assert plan.kv_pages == 80 and plan.kv_arena_bytes == 80 * 2 * 8 * c.head_dim * 4 == engine.backend.state_bytes()[1]
    assert "80 pages" in plan.table()
    load_engine(settings)  # every policy's knobs are checked, and the pool against the configured one
    fifo = _settings(tiny_model, kv_capacity_tokens=256, kv_page_tokens=8, kv_pool_pages=80)
    with pytest.raises(ValueError, match="only dms runs on a smaller pool"):
        load_engine(fifo)


@pytest.mark.parametrize("backend", ["numpy", "cuda"])
@pytest.mark.parametrize("weights", ["auto", "int8", "int4"])
def test_the_plan_counts_the_decoder_bytes_each_backend_holds(tiny_model, backend, weights):
    """Tensor by tensor, the plan's bytes are what the backend uploads or keeps (cuda under the simulator:
    the uploads are real, only the kernels are simulated)."""
    from vla_edge_ros.model.arena import KVArena
    from vla_edge_ros.model.backends import make_backend
    from vla_edge_ros.model.checkpoint import language_model_shapes

    checkpoint = load_checkpoint(tiny_model, weights=weights, weights_group=32)
    held = make_backend(backend, checkpoint, KVArena(64)).state_bytes()[0]
    assert sum(checkpoint.held_bytes(name, backend) for name in language_model_shapes(checkpoint.config)) == held
