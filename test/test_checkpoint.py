"""Loading model directories: every way a checkpoint can be wrong gets an error naming the problem."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from vla_edge_ros.model.checkpoint import CheckpointError, load_checkpoint
from vla_edge_ros.model.config import ModelConfigError
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.model.safetensors_io import StoredTensor, read_safetensors, write_safetensors


@pytest.fixture
def model_copy(tiny_model, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(tiny_model, target)
    return target


def _edit_config(model_dir, **changes):
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _rewrite_tensors(model_dir, edit):
    path = model_dir / "model.safetensors"
    tensors = {name: StoredTensor(t.dtype, np.array(t.array)) for name, t in read_safetensors(path).items()}
    edit(tensors)
    write_safetensors(path, tensors)


def test_tiny_preset_loads_with_vla_weights(tiny_model):
    checkpoint = load_checkpoint(tiny_model)
    assert checkpoint.has_vla and checkpoint.storage_dtype == "BF16"
    assert checkpoint.config.vision.tokens_per_frame == 16


def test_missing_directory(tmp_path):
    with pytest.raises(ModelConfigError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")


@pytest.mark.parametrize("changes, message", [
    ({"model_type": "llama"}, "model_type 'llama' is not supported"),
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"use_sliding_window": True}, "sliding-window"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_key_value_heads": 3}, "not a multiple"),
])
def test_unsupported_configs_are_refused(model_copy, changes, message):
    _edit_config(model_copy, **changes)
    with pytest.raises(ModelConfigError, match=message):
        load_checkpoint(model_copy)


def test_invalid_json(model_copy):
    (model_copy / "config.json").write_text("{ not json")
    with pytest.raises(ModelConfigError, match="not valid JSON"):
        load_checkpoint(model_copy)


def test_missing_tensor_is_named(model_copy):
    _rewrite_tensors(model_copy, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"'model.layers.1.mlp.up_proj.weight' is missing"):
        load_checkpoint(model_copy)


def test_misshapen_tensor_is_named(model_copy):
    def shrink(tensors):
        t = tensors["model.layers.0.self_attn.k_proj.bias"]
        tensors["model.layers.0.self_attn.k_proj.bias"] = StoredTensor(t.dtype, t.array[:-1])
    _rewrite_tensors(model_copy, shrink)
    with pytest.raises(CheckpointError, match=r"k_proj.bias' has shape \[127\], expected \[128\]"):
        load_checkpoint(model_copy)


def test_missing_vision_weights_are_refused_for_a_vla_but_fine_for_parity(model_copy):
    _rewrite_tensors(model_copy, lambda t: [t.pop(n) for n in list(t) if n.startswith("vision.")])
    with pytest.raises(CheckpointError, match="vision.patch_proj.weight"):
        load_checkpoint(model_copy)
    assert not load_checkpoint(model_copy, require_vla=False).has_vla


def test_truncated_weights_file(model_copy):
    path = model_copy / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(model_copy)


def test_sharded_checkpoint_loads_like_the_single_file(model_copy):
    single = read_safetensors(model_copy / "model.safetensors")
    names = sorted(single)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():
        write_safetensors(model_copy / file, {n: StoredTensor(single[n].dtype, np.array(single[n].array)) for n in part})
    weight_map = {n: file for file, part in halves.items() for n in part}
    (model_copy / "model.safetensors").unlink()
    (model_copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    sharded = load_checkpoint(model_copy)
    for name in names:
        np.testing.assert_array_equal(sharded.tensors[name].array, single[name].array)


def test_index_naming_a_missing_shard(model_copy):
    (model_copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "gone.safetensors"}}))
    with pytest.raises(CheckpointError, match="gone.safetensors"):
        load_checkpoint(model_copy)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_init_model_is_deterministic_per_seed(tmp_path, dtype):
    a = write_random_model(tmp_path / "a", preset("tiny", layers=1), seed=5, dtype=dtype)
    b = write_random_model(tmp_path / "b", preset("tiny", layers=1), seed=5, dtype=dtype)
    c = write_random_model(tmp_path / "c", preset("tiny", layers=1), seed=6, dtype=dtype)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert load_checkpoint(a).config.num_hidden_layers == 1
