"""Qwen2-VL / Qwen2.5-VL: config parsing (both layouts), tensor loading (both key layouts, shards, refusals)
and the NumPy vision tower against transformers' ``model.visual`` on checkpoints it wrote itself."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hf_vl_models import (VARIANTS, copy_model, load_hf_vl_model, reshard, write_hf_vl_model, write_legacy_layout,
                          write_module_key_layout)
from vla_edge_ros.model.checkpoint import CheckpointError, load_checkpoint, vl_shapes
from vla_edge_ros.model.config import ModelConfigError, load_model_config
from vla_edge_ros.model.safetensors_io import StoredTensor, read_safetensors, write_safetensors
from vla_edge_ros.model.vl.vision import VisionTower
from vla_edge_ros.model.vl.vision_layout import (VisionInputError, frame_bounds, merged_token_counts, vision_layout,
                                                vision_positions, window_order)
from vla_edge_ros.numerics import ops

TINY = ("qwen2_vl_tiny", "qwen2_5_vl_tiny")


@pytest.fixture(scope="module")
def vl_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both tiny variants as transformers 5 saves them (``name``: nested config, hub keys), in the hub's flat
    config (``name/legacy``) and with transformers 4.52's module keys (``name/modules``)."""
    root = tmp_path_factory.mktemp("vl")
    dirs = {}
    for name in TINY:
        dirs[name] = write_hf_vl_model(root / name, name, seed=1)
        dirs[f"{name}/legacy"] = write_legacy_layout(dirs[name], root / f"{name}_legacy")
        dirs[f"{name}/modules"] = write_module_key_layout(dirs[name], root / f"{name}_modules")
    return dirs


def _patches(rng: np.random.Generator, grid: list[list[int]], patch_dim: int) -> np.ndarray:
    return rng.standard_normal((int(np.prod(grid, axis=1).sum()), patch_dim)).astype(np.float32)


def _hf_tower(model, patches: np.ndarray, grid: list[list[int]]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model.model.visual(torch.from_numpy(patches), grid_thw=torch.tensor(grid)).pooler_output.numpy()


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b)))


# -- config ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TINY)
def test_both_config_layouts_parse_to_the_same_config(vl_dirs, name):
    nested, flat = load_model_config(vl_dirs[name]), load_model_config(vl_dirs[f"{name}/legacy"])
    assert nested == flat
    spec = VARIANTS[name]
    assert (nested.hidden_size, nested.intermediate_size, nested.num_attention_heads, nested.num_key_value_heads,
            nested.vocab_size) == tuple(spec["text"][k] for k in ("hidden_size", "intermediate_size",
                                                                    "num_attention_heads", "num_key_value_heads",
                                                                    "vocab_size"))
    assert nested.rope_theta == 1e6 and nested.rms_norm_eps == 1e-6
    assert nested.tie_word_embeddings == spec["tie_word_embeddings"]
    vl = nested.vl
    assert vl.family == spec["family"] and list(vl.mrope_section) == spec["text"]["mrope_section"]
    assert (vl.image_token_id, vl.vision_start_token_id, vl.vision_end_token_id) == (5, 3, 4)
    tower = vl.vision
    assert tower.depth == spec["vision"]["depth"] and tower.out_hidden_size == nested.hidden_size
    if tower.family == "qwen2_vl":
        assert tower.embed_dim == 24 and tower.mlp_dim == 72 and tower.fullatt_block_indexes == (0, 1)
    else:
        assert tower.embed_dim == 24 and tower.mlp_dim == 44 and tower.window_units == 2
        assert tower.fullatt_block_indexes == (1,) and tower.windowed(0) and not tower.windowed(1)
    assert tower.patch_dim == 3 * 2 * spec["vision"]["patch_size"] ** 2


@pytest.mark.parametrize("name", TINY)
def test_to_hf_dict_round_trips_and_transformers_builds_the_same_tower(vl_dirs, tmp_path, name):
    from hf_vl_models import hf_classes

    config = load_model_config(vl_dirs[name])
    (tmp_path / "config.json").write_text(json.dumps(config.to_hf_dict()))
    assert load_model_config(tmp_path) == config
    config_class, model_class = hf_classes(config.vl.family)
    state = model_class(config_class.from_pretrained(str(tmp_path))).state_dict()
    tower = {k.removeprefix("model."): tuple(v.shape) for k, v in state.items() if k.startswith("model.visual.")}
    assert tower == vl_shapes(config)


def test_a_plain_qwen2_checkpoint_has_no_vl_part(tiny_model):
    assert load_model_config(tiny_model).vl is None


def _edit(config: dict, path: str, value) -> None:
    *parents, key = path.split(".")
    for part in parents:
        config = config[part]
    if value is None:
        del config[key]
    else:
        config[key] = value


@pytest.mark.parametrize("name, edit, value, message", [
    ("qwen2_vl_tiny", "rope_scaling.type", "yarn", r"rope_scaling.type 'yarn' is not supported"),
    ("qwen2_vl_tiny", "rope_scaling.mrope_section", None, "rope_scaling.mrope_section must be 3 integers"),
    ("qwen2_vl_tiny", "rope_scaling.mrope_section", [2, 2, 2], r"mrope_section \[2, 2, 2\] must be 3 positive counts"),
    ("qwen2_vl_tiny", "vision_config.hidden_act", "gelu", "vision_config.hidden_act 'gelu' is not supported"),
    ("qwen2_vl_tiny", "vision_config.depth", None, "missing required key vision_config.'depth'"),
    ("qwen2_vl_tiny", "vision_config.hidden_size", 48, r"vision_config.hidden_size \(48\) must equal"),
    ("qwen2_vl_tiny", "vision_config.num_heads", 4, "multiple of 4"),
    ("qwen2_vl_tiny", "image_token_id", 320, "image_token_id 320 is outside the vocabulary"),
    ("qwen2_vl_tiny", "vision_config", None, "missing required key 'vision_config'"),
    ("qwen2_vl_tiny", "use_sliding_window", True, "sliding-window"),
    ("qwen2_5_vl_tiny", "vision_config.window_size", 3, "vision_config.window_size 3 is smaller"),
    ("qwen2_5_vl_tiny", "vision_config.fullatt_block_indexes", [3], "fullatt_block_indexes"),
    ("qwen2_5_vl_tiny", "vision_config.out_hidden_size", 40, r"vision_config.out_hidden_size \(40\) must equal"),
    ("qwen2_5_vl_tiny", "vision_config.intermediate_size", None, "vision_config.'intermediate_size'"),
])
def test_unsupported_vl_configs_are_refused_naming_the_key(vl_dirs, tmp_path, name, edit, value, message):
    config = json.loads((vl_dirs[f"{name}/legacy"] / "config.json").read_text())
    _edit(config, edit, value)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match=message):
        load_model_config(tmp_path)


def test_transformers_5_rope_parameters_of_another_type_are_refused(vl_dirs, tmp_path):
    config = json.loads((vl_dirs["qwen2_vl_tiny"] / "config.json").read_text())
    config["text_config"]["rope_parameters"]["type"] = "dynamic"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match="rope_parameters.type 'dynamic'"):
        load_model_config(tmp_path)


# -- tensors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TINY)
def test_the_layouts_written_here_are_the_ones_transformers_reads(vl_dirs, name):
    reference = load_hf_vl_model(vl_dirs[name]).state_dict()
    for layout in ("legacy", "modules"):
        state = load_hf_vl_model(vl_dirs[f"{name}/{layout}"]).state_dict()
        assert sorted(state) == sorted(reference)
        assert all(bool((state[k] == reference[k]).all()) for k in reference)


@pytest.mark.parametrize("name", TINY)
def test_both_key_layouts_load_to_the_same_tensors(vl_dirs, name):
    hub = load_checkpoint(vl_dirs[f"{name}/legacy"])
    modules = load_checkpoint(vl_dirs[f"{name}/modules"])
    stored = read_safetensors(vl_dirs[f"{name}/modules"] / "model.safetensors")
    assert any(k.startswith("model.visual.") for k in stored) and any(k.startswith("model.language_model.") for k in stored)
    assert sorted(hub.tensors) == sorted(modules.tensors)
    assert set(vl_shapes(hub.config)) <= set(hub.tensors)
    assert "model.embed_tokens.weight" in hub.tensors and "model.layers.1.mlp.up_proj.weight" in hub.tensors
    for key, tensor in hub.tensors.items():
        np.testing.assert_array_equal(tensor.array, modules.tensors[key].array)
    assert hub.storage_dtype == ("BF16" if VARIANTS[name]["dtype"] == "bfloat16" else "F32")


def test_a_sharded_vl_checkpoint_loads_like_the_single_file(vl_dirs, tmp_path):
    single = load_checkpoint(vl_dirs["qwen2_5_vl_tiny"])
    sharded_dir = copy_model(vl_dirs["qwen2_5_vl_tiny/modules"], tmp_path / "sharded")
    reshard(sharded_dir, 3)
    sharded = load_checkpoint(sharded_dir)
    assert sorted(sharded.tensors) == sorted(single.tensors)
    for key, tensor in single.tensors.items():
        np.testing.assert_array_equal(sharded.tensors[key].array, tensor.array)


def _rewrite(model_dir: Path, edit) -> None:
    path = model_dir / "model.safetensors"
    tensors = {n: StoredTensor(t.dtype, np.array(t.array)) for n, t in read_safetensors(path).items()}
    edit(tensors)
    write_safetensors(path, tensors)


@pytest.mark.parametrize("layout, key", [
    ("/modules", "model.visual.blocks.1.mlp.fc2.weight"),
    ("/modules", "model.language_model.layers.0.mlp.up_proj.weight"),
    ("/legacy", "visual.merger.ln_q.bias"),
    ("/legacy", "model.layers.1.self_attn.q_proj.bias"),
])
def test_a_missing_tensor_is_named_as_the_files_store_it(vl_dirs, tmp_path, layout, key):
    model_dir = copy_model(vl_dirs["qwen2_vl_tiny" + layout], tmp_path / "model")
    _rewrite(model_dir, lambda tensors: tensors.pop(key))
    with pytest.raises(CheckpointError, match=f"'{key}' is missing"):
        load_checkpoint(model_dir)


def test_a_misshapen_tower_tensor_is_named(vl_dirs, tmp_path):
    model_dir = copy_model(vl_dirs["qwen2_5_vl_tiny/modules"], tmp_path / "model")
    key = "model.visual.blocks.2.attn.qkv.bias"

    def shrink(tensors):
        tensors[key] = StoredTensor(tensors[key].dtype, tensors[key].array[:-1])
    _rewrite(model_dir, shrink)
    with pytest.raises(CheckpointError, match=rf"'{key}' has shape \[71\], expected \[72\]"):
        load_checkpoint(model_dir)


def test_a_weight_stored_in_both_layouts_is_refused(vl_dirs, tmp_path):
    model_dir = copy_model(vl_dirs["qwen2_vl_tiny/modules"], tmp_path / "model")

    def duplicate(tensors):
        tensors["visual.merger.mlp.0.bias"] = tensors["model.visual.merger.mlp.0.bias"]
    _rewrite(model_dir, duplicate)
    with pytest.raises(CheckpointError, match="'model.visual.merger.mlp.0.bias' and 'visual.merger.mlp.0.bias'"):
        load_checkpoint(model_dir)


# -- the tower's index arithmetic -----------------------------------------------------------------------


def test_positions_follow_the_merge_window_order():
    rows_cols = vision_positions(np.array([[1, 2, 4]]), 2)
    assert rows_cols.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3], [1, 2], [1, 3]]
    assert frame_bounds(np.array([[2, 2, 4], [1, 4, 2]]), 2).tolist() == [0, 8, 16, 24]
    assert merged_token_counts(np.array([[2, 2, 4], [1, 4, 6]]), 2).tolist() == [4, 6]


def test_a_tower_without_windows_keeps_the_processor_order(vl_dirs):
    config = load_model_config(vl_dirs["qwen2_vl_tiny"]).vl.vision
    layout = vision_layout(config, np.array([[1, 4, 6], [2, 2, 2]]))
    assert layout.rows is None and layout.order is None and layout.windows is layout.frames
    assert layout.frames.tolist() == [0, 24, 28, 32] and layout.patches == 32


def test_windows_cover_each_frame_with_partial_edges():
    # 6x6 patches -> 3x3 merged tokens; windows of 2x2 tokens: {0,1,3,4}, {2,5}, {6,7}, {8}; then image 2
    order, bounds = window_order(np.array([[1, 6, 6], [1, 2, 2]]), 2, 2)
    assert order.tolist() == [0, 1, 3, 4, 2, 5, 6, 7, 8, 9]
    assert bounds.tolist() == [0, 16, 24, 32, 36, 40]


@pytest.mark.parametrize("grid, message", [
    ([[1, 3, 4]], "multiples of the spatial merge size 2"),
    ([[0, 2, 2]], "must be positive"),
    ([[1, 2]], r"\[images, 3\] integer array"),
])
def test_bad_grids_are_refused(vl_dirs, grid, message):
    tower = VisionTower.from_checkpoint(load_checkpoint(vl_dirs["qwen2_vl_tiny"]))
    with pytest.raises(VisionInputError, match=message):
        tower.encode(np.zeros((12, tower.config.patch_dim), np.float32), np.array(grid))


def test_patches_that_do_not_fit_the_grid_are_refused(vl_dirs):
    tower = VisionTower.from_checkpoint(load_checkpoint(vl_dirs["qwen2_vl_tiny"]))
    with pytest.raises(VisionInputError, match=r"float \[24, 96\] array"):
        tower.encode(np.zeros((24, 95), np.float32), np.array([[1, 4, 6]]))


def test_a_plain_qwen2_checkpoint_has_no_tower(tiny_model):
    with pytest.raises(CheckpointError, match="no vision tower"):
        VisionTower.from_checkpoint(load_checkpoint(tiny_model))


# -- the math the tower adds to numerics/ops --------------------------------------------------------------


def test_vision_ops_match_torch():
    import torch

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 40)) * 3).astype(np.float32)
    t = torch.from_numpy(x)
    np.testing.assert_allclose(ops.gelu(x), torch.nn.functional.gelu(t).numpy(), atol=2e-6, rtol=1e-6)
    np.testing.assert_allclose(ops.quick_gelu(x), (t * torch.sigmoid(1.702 * t)).numpy(), atol=2e-6, rtol=1e-6)
    w, b = rng.standard_normal(40).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    reference = torch.nn.functional.layer_norm(t, (40,), torch.from_numpy(w), torch.from_numpy(b), 1e-6).numpy()
    np.testing.assert_allclose(ops.layer_norm(x, w, b, 1e-6), reference, atol=1e-5, rtol=1e-5)
    q, k, v = (rng.standard_normal((10, 2, 8)).astype(np.float32) for _ in range(3))
    out = ops.segment_attention(q, k, v, np.array([0, 4, 4, 10]), 0.25)
    for start, end in ((0, 4), (4, 10)):
        seg = [torch.from_numpy(a[start:end]).transpose(0, 1) for a in (q, k, v)]
        reference = torch.nn.functional.scaled_dot_product_attention(*seg, scale=0.25).transpose(0, 1)
        np.testing.assert_allclose(out[start:end], reference.reshape(end - start, 16).numpy(), atol=1e-5)


# -- the tower against transformers -----------------------------------------------------------------------

# t = 2: two temporal patches of 2 frames each (a clip); attention stays within each.
GRIDS = {"one image": [[1, 4, 6]], "three images": [[1, 4, 6], [1, 8, 4], [1, 10, 14]],
         "a clip and an image": [[2, 6, 4], [1, 4, 4]]}


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("images", list(GRIDS))
def test_tower_matches_transformers(vl_dirs, name, images):
    grid = GRIDS[images]
    tower = VisionTower.from_checkpoint(load_checkpoint(vl_dirs[name]))
    patches = _patches(np.random.default_rng(len(grid)), grid, tower.config.patch_dim)
    reference = _hf_tower(load_hf_vl_model(vl_dirs[name]), patches, grid)
    out = tower.encode(patches, np.array(grid))
    assert out.dtype == np.float32 and out.shape == reference.shape == (int(np.prod(grid, axis=1).sum()) // 4,
                                                                         VARIANTS[name]["text"]["hidden_size"])
    assert _cosine(out, reference) >= 0.99999
    np.testing.assert_allclose(out, reference, atol=2e-5 * np.abs(reference).max(), rtol=0)


def test_qwen2_5_windows_change_the_output_and_match_transformers(vl_dirs):
    """A 10x14-patch image is 5x7 merged tokens: 3x4 windows of at most 2x2, partial at the edges; a 6x4 one
    3x2 tokens in 2x1 windows. Running every block with full attention instead gives a different answer,
    so the parity above sees windows."""
    grid = [[1, 10, 14], [1, 6, 4]]
    checkpoint = load_checkpoint(vl_dirs["qwen2_5_vl_tiny"])
    tower = VisionTower.from_checkpoint(checkpoint)
    order, bounds = window_order(np.array(grid), 2, tower.config.window_units)
    assert len(bounds) - 1 == 12 + 2 and (order != np.arange(order.size)).any()
    layout = vision_layout(tower.config, np.array(grid))
    assert layout.order.tolist() == order.tolist() and layout.windows.tolist() == bounds.tolist()
    assert layout.restore(layout.order[:, None])[:, 0].tolist() == list(range(order.size))
    assert layout.bounds(tower.config, 0) is layout.windows and layout.bounds(tower.config, 1) is layout.frames
    patches = _patches(np.random.default_rng(7), grid, tower.config.patch_dim)
    out = tower.encode(patches, np.array(grid))
    reference = _hf_tower(load_hf_vl_model(vl_dirs["qwen2_5_vl_tiny"]), patches, grid)
    assert _cosine(out, reference) >= 0.99999
    full = replace(tower.config, fullatt_block_indexes=tuple(range(tower.config.depth)))
    unwindowed = VisionTower(full, checkpoint).encode(patches, np.array(grid))
    assert _cosine(unwindowed, reference) < 0.999


@pytest.mark.slow
def test_qwen2_vl_2b_slice_tower_matches_transformers(tmp_path):
    """Qwen2-VL-2B's real ViT width (1280, 16 heads, MLP 5120, 14 px patches) and 1536-wide merger output,
    2 blocks, bf16 storage: one 224x224 frame (16x16 patches) and a 4x6 one."""
    model_dir = write_hf_vl_model(tmp_path / "slice", "qwen2_vl_2b_slice")
    checkpoint = load_checkpoint(model_dir)
    tower = VisionTower.from_checkpoint(checkpoint)
    assert (tower.config.embed_dim, tower.config.num_heads, tower.config.mlp_dim, tower.config.patch_dim) == \
        (1280, 16, 5120, 1176)
    grid = [[1, 16, 16], [1, 4, 6]]
    patches = _patches(np.random.default_rng(0), grid, tower.config.patch_dim)
    out = tower.encode(patches, np.array(grid))
    reference = _hf_tower(load_hf_vl_model(model_dir), patches, grid)
    assert out.shape == reference.shape == (70, 1536)
    assert _cosine(out, reference) >= 0.99999
    np.testing.assert_allclose(out, reference, atol=2e-5 * np.abs(reference).max(), rtol=0)
