"""Locate, read and validate the tensors of a local HuggingFace Qwen2 checkpoint.

The tensor names are HuggingFace's (``model.layers.{i}.self_attn.q_proj.weight`` ...), so a real
Qwen2 checkpoint loads as is. The VLA parts live under names of our own:

- ``vision.patch_proj.weight`` [hidden, patch*patch*3], ``vision.patch_proj.bias`` [hidden],
  ``vision.pos_embed`` [tokens_per_frame, hidden]: the frame encoder;
- ``action_head.weight`` [dof, hidden], ``action_head.bias`` [dof]: only for the ``linear`` head.

Every expected tensor is checked for presence and shape before anything runs, and the error names it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import ModelConfig, load_model_config
from .safetensors_io import SafetensorsError, StoredTensor, read_safetensors

SUPPORTED_DTYPES = ("F32", "F16", "BF16")


class CheckpointError(ValueError):
    """Missing, misshapen or unreadable weights."""


def language_model_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor the decoder needs."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (config.q_dim, h),
            p + "self_attn.q_proj.bias": (config.q_dim,),
            p + "self_attn.k_proj.weight": (config.kv_dim, h),
            p + "self_attn.k_proj.bias": (config.kv_dim,),
            p + "self_attn.v_proj.weight": (config.kv_dim, h),
            p + "self_attn.v_proj.bias": (config.kv_dim,),
            p + "self_attn.o_proj.weight": (h, config.q_dim),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        })
    return shapes


def vla_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the frame encoder and (for the linear head) action head tensors."""
    h, vision = config.hidden_size, config.vision
    shapes: dict[str, tuple[int, ...]] = {
        "vision.patch_proj.weight": (h, vision.patch_dim),
        "vision.patch_proj.bias": (h,),
        "vision.pos_embed": (vision.tokens_per_frame, h),
    }
    if config.action.head == "linear":
        shapes["action_head.weight"] = (config.action.dof, h)
        shapes["action_head.bias"] = (config.action.dof,)
    return shapes


@dataclass
class Checkpoint:
    """A validated model directory: its config and its tensors in storage dtype."""

    path: Path
    config: ModelConfig
    tensors: dict[str, StoredTensor]
    has_vla: bool

    def float32(self, name: str) -> np.ndarray:
        return self.tensors[name].to_float32()

    @property
    def storage_dtype(self) -> str:
        """The dtype of the decoder weights (what the CUDA backend keeps on device)."""
        return self.tensors["model.embed_tokens.weight"].dtype

    def weight_bytes(self) -> int:
        return sum(t.array.nbytes for t in self.tensors.values())


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    single = model_dir / "model.safetensors"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a valid shard index (needs a 'weight_map' object): {exc}") from exc
        files = sorted({model_dir / name for name in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard files that do not exist: {missing}")
        return files
    if single.is_file():
        return [single]
    raise CheckpointError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")


def check_tensors(tensors: dict[str, StoredTensor], shapes: dict[str, tuple[int, ...]], model_dir: Path) -> None:
    for name, shape in shapes.items():
        if name not in tensors:
            raise CheckpointError(f"{model_dir}: tensor {name!r} is missing (expected shape {list(shape)})")
        tensor = tensors[name]
        if tensor.shape != shape:
            raise CheckpointError(
                f"{model_dir}: tensor {name!r} has shape {list(tensor.shape)}, expected {list(shape)}")
        if tensor.dtype not in SUPPORTED_DTYPES:
            raise CheckpointError(f"{model_dir}: tensor {name!r} is stored as {tensor.dtype}; "
                                  f"supported: {', '.join(SUPPORTED_DTYPES)}")


def load_checkpoint(model_dir: str | Path, *, require_vla: bool = True) -> Checkpoint:
    """Read config.json and the safetensors weights; validate every tensor the engine will use."""
    model_dir = Path(model_dir)
    config = load_model_config(model_dir)
    tensors: dict[str, StoredTensor] = {}
    for file in _weight_files(model_dir):
        try:
            tensors.update(read_safetensors(file))
        except (SafetensorsError, OSError) as exc:
            raise CheckpointError(str(exc)) from exc
    check_tensors(tensors, language_model_shapes(config), model_dir)
    vla = vla_shapes(config)
    has_vla = all(name in tensors for name in vla)
    if require_vla or any(name in tensors for name in vla):
        config.validate_vla()
        check_tensors(tensors, vla, model_dir)
        has_vla = True
    return Checkpoint(model_dir, config, tensors, has_vla)
