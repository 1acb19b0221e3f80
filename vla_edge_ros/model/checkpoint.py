"""Locate, read and validate the tensors of a local HuggingFace Qwen2 checkpoint.

The tensor names are HuggingFace's (``model.layers.{i}.self_attn.q_proj.weight`` ...), so a real
Qwen2 checkpoint loads as is. The VLA parts live under names of our own:

- ``vision.patch_proj.weight`` [hidden, patch*patch*3], ``vision.patch_proj.bias`` [hidden],
  ``vision.pos_embed`` [tokens_per_frame, hidden]: the frame encoder;
- ``action_head.weight`` [dof, hidden], ``action_head.bias`` [dof]: only for the ``linear`` head;
- ``action_head.fc1.weight`` [mlp_hidden, hidden], ``action_head.fc1.bias`` [mlp_hidden],
  ``action_head.fc2.weight`` [chunk * dof, mlp_hidden], ``action_head.fc2.bias`` [chunk * dof]: only for the
  ``mlp`` head (``action_head.py``: tanh(fc2 GELU(fc1 h)), row i * dof + d of fc2 is action i's dimension d);
- ``state_proj.weight`` [hidden, state_dim], ``state_proj.bias`` [hidden]: the robot's state as one token,
  exactly when config.json's ``vla.state`` says its dimension and normalisation (either without the other
  is refused: a state the model cannot read, or a projection whose input is unknown).

A Qwen2-VL / Qwen2.5-VL checkpoint is stored in one of two key layouts: the hub's legacy one
(``visual.*``, ``model.layers.*``, ``model.embed_tokens.weight``, ``model.norm.weight``; transformers 5
saves it too) or the module paths transformers 4.52-4.57 saved (``model.visual.*``,
``model.language_model.*``); ``lm_head.weight`` in both. The
loader renames the latter to the former, so inside the engine the decoder's tensors have the plain Qwen2
names every backend reads and the tower's are ``visual.*`` (see ``vl_shapes``); errors still name a
tensor by the key the files use. A VL checkpoint's frame encoder is its tower: it has no ``vision.*``.

Every expected tensor is checked for presence and shape before anything runs, and the error names it.
Every tensor the files hold is checked for NaN and Inf too (on its stored bits, about 10 GB/s): a
corrupt checkpoint is refused before it can drive a robot, unless ``allow_nonfinite`` lets it load
for debugging (the engine still produces no action from a non-finite output).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from ..config import choices_of
from ..numerics.weight_formats import (DEFAULT_INT4_GROUP, PackedMatrix, concat_rows, matrix_bytes, pack,
                                       pack_bf16_bits)
from .config import ModelConfig, load_model_config
from .vl.config import VisionTowerConfig
from .safetensors_io import SafetensorsError, StoredTensor, read_safetensors

SUPPORTED_DTYPES = ("F32", "F16", "BF16")
WEIGHT_FORMATS = choices_of("reasoning", "weights")
"""``reasoning.weights``: what the decoder's and the vision tower's matrices are held in; auto keeps bf16 as
bf16 and widens the rest to fp32 (the CUDA backend keeps fp16 as fp16 too)."""
STATE_PROJ = ("state_proj.weight", "state_proj.bias")
MLP_HEAD = ("action_head.fc1.weight", "action_head.fc1.bias", "action_head.fc2.weight", "action_head.fc2.bias")
TOKEN_TABLES = ("model.embed_tokens.weight", "lm_head.weight")
PACK_BLOCK_VALUES = 1 << 20  # weights widened to fp32 at a time while packing (4 MB)


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


def vl_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of a VL checkpoint's vision tower (none for a plain Qwen2 one)."""
    if config.vl is None:
        return {}
    v: VisionTowerConfig = config.vl.vision
    e, m, merged = v.embed_dim, v.mlp_dim, v.merged_dim
    qwen2_vl = v.family == "qwen2_vl"  # LayerNorm (weight and bias) and fc1/fc2; else RMSNorm and SwiGLU
    norm = ("weight", "bias") if qwen2_vl else ("weight",)
    shapes: dict[str, tuple[int, ...]] = {
        "visual.patch_embed.proj.weight": (e, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)}
    for block in range(v.depth):
        p = f"visual.blocks.{block}."
        shapes.update({f"{p}{n}.{part}": (e,) for n in ("norm1", "norm2") for part in norm})
        shapes.update({p + "attn.qkv.weight": (3 * e, e), p + "attn.qkv.bias": (3 * e,),
                       p + "attn.proj.weight": (e, e), p + "attn.proj.bias": (e,)})
        mlp = {"fc1": (m, e), "fc2": (e, m)} if qwen2_vl else {"gate_proj": (m, e), "up_proj": (m, e), "down_proj": (e, m)}
        for name, shape in mlp.items():
            shapes[f"{p}mlp.{name}.weight"] = shape
            shapes[f"{p}mlp.{name}.bias"] = shape[:1]
    shapes.update({f"visual.merger.ln_q.{part}": (e,) for part in norm})
    shapes.update({"visual.merger.mlp.0.weight": (merged, merged), "visual.merger.mlp.0.bias": (merged,),
                   "visual.merger.mlp.2.weight": (v.out_hidden_size, merged),
                   "visual.merger.mlp.2.bias": (v.out_hidden_size,)})
    return shapes


def vla_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the frame encoder (not in a VL checkpoint, whose tower is its frame encoder) and
    (for the linear and mlp heads) action head tensors."""
    h, vision = config.hidden_size, config.vision
    shapes: dict[str, tuple[int, ...]] = {} if config.vl is not None else {
        "vision.patch_proj.weight": (h, vision.patch_dim),
        "vision.patch_proj.bias": (h,),
        "vision.pos_embed": (vision.tokens_per_frame, h),
    }
    if config.action.head == "linear":
        shapes["action_head.weight"] = (config.action.dof, h)
        shapes["action_head.bias"] = (config.action.dof,)
    elif config.action.head == "mlp":
        shapes.update(mlp_head_shapes(config))
    if config.state is not None:
        shapes.update(dict(zip(STATE_PROJ, ((h, config.state.dim), (h,)))))
    return shapes


def mlp_head_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the mlp action head's two layers (``MLP_HEAD`` order: fc1 weight and bias, fc2's)."""
    inner, outputs = config.action.mlp_hidden, config.action.chunk * config.action.dof
    return dict(zip(MLP_HEAD, ((inner, config.hidden_size), (inner,), (outputs, inner), (outputs,))))


def is_matrix(name: str, shape: tuple[int, ...]) -> bool:
    """Whether tensor ``name`` is held in ``reasoning.weights``: every 2-D weight of the decoder (embedding and
    lm_head included) and of a VL vision tower. Norms, biases, the frame encoder, the state projection and the
    linear action head are small and stay fp32."""
    return name.endswith(".weight") and name.startswith(("model.", "lm_head.", "visual.")) and len(shape) == 2


def held_format(weights: str, names: tuple[str, ...], dtypes: list[str]) -> str:
    """The format matrices ``names`` (stored as ``dtypes``) are held in under ``reasoning.weights``: that format,
    except that int4 keeps the embedding and lm_head in int8 (as GPTQ and AWQ keep them wide and llama.cpp's
    Q4_K_M keeps its output layer at 6 bits: on the 1.5B shape it lifts the logits' cosine from 0.88 to 0.93);
    ``auto``: bf16 when they all are stored so, else fp32."""
    if weights == "int4" and any(name in TOKEN_TABLES for name in names):
        return "int8"
    if weights != "auto":
        return weights
    return "bfloat16" if all(dtype == "BF16" for dtype in dtypes) else "float32"


@dataclass
class Checkpoint:
    """A validated model directory: its config, its tensors in storage dtype, and the format (``WEIGHT_FORMATS``)
    its matrices are to be held in by a backend."""

    path: Path
    config: ModelConfig
    tensors: dict[str, StoredTensor]
    has_vla: bool
    weights: str = "auto"
    weights_group: int = DEFAULT_INT4_GROUP  # int4's inputs per scale

    def float32(self, name: str) -> np.ndarray:
        return self.tensors[name].to_float32()

    def is_matrix(self, name: str) -> bool:
        return is_matrix(name, self.tensors[name].shape)

    @property
    def held_as(self) -> str:
        """The format of the decoder's layer matrices, in words for a log line: ``int8``, ``bfloat16 (as stored)``."""
        fmt = self.format_of("model.layers.0.mlp.down_proj.weight")
        return fmt if self.weights != "auto" else f"{fmt} (as stored)"

    def format_of(self, *names: str) -> str:
        """The format matrices ``names`` are held in (``held_format``)."""
        return held_format(self.weights, names, [self.tensors[name].dtype for name in names])

    def rounds(self, name: str) -> bool:
        """Whether holding matrix ``name`` in its format changes its values (fp32 and bf16-as-bf16 do not)."""
        fmt = self.format_of(name)
        return not (fmt == "float32" or (fmt == "bfloat16" and self.tensors[name].dtype == "BF16"))

    def matrix(self, *names: str) -> PackedMatrix:
        """Matrices ``names`` [out, in], stacked along ``out``, packed in their format. A bf16 checkpoint held
        as bf16 keeps its bits: nothing is rounded twice. Rows are widened and packed a block at a time and each
        tensor's file pages are released once it is packed, so a load's peak memory is what it holds plus a
        block, not an fp32 copy of the largest matrix (the embedding, 0.9 GB at the 1.5B shape)."""
        fmt = self.format_of(*names)
        stored = [self.tensors[name] for name in names]
        if fmt == "bfloat16" and all(t.dtype == "BF16" for t in stored):
            packed = pack_bf16_bits(np.concatenate([t.array for t in stored]))  # one copy, out of the mapping
            for tensor in stored:
                tensor.release()
            return packed
        blocks = []
        for tensor in stored:
            rows = max(1, PACK_BLOCK_VALUES // tensor.shape[1])
            blocks += [pack(StoredTensor(tensor.dtype, tensor.array[start:start + rows]).to_float32(), fmt,
                            self.weights_group) for start in range(0, tensor.shape[0], rows)]
            tensor.release()
        return blocks[0] if len(blocks) == 1 else concat_rows(*blocks)

    def held_bytes(self, name: str, backend: str = "numpy") -> int:
        """The bytes tensor ``name`` takes on ``backend``. numpy: a matrix in its format, anything else fp32.
        cuda: a matrix in its format, but as stored under ``auto`` (fp16 stays fp16); vectors (norms, biases)
        fp32; anything else (a Conv3d kernel; tensors the host keeps) as stored."""
        stored = self.tensors[name]
        shape = stored.shape
        if self.is_matrix(name) and (backend == "numpy" or self.weights != "auto"):
            return matrix_bytes(shape[0], shape[1], self.format_of(name), self.weights_group)
        if backend == "numpy" or len(shape) == 1:
            return int(np.prod(shape, dtype=np.int64)) * 4
        return stored.array.nbytes

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


# transformers 4.52-4.57 saved these module-path prefixes; the engine uses the hub's (on the right)
_VL_PREFIXES = (("model.visual.", "visual."), ("model.language_model.", "model."))


def vl_stored_name(name: str, new_layout: bool) -> str:
    """The key under which internal tensor ``name`` is (or would be) stored in a VL checkpoint's files."""
    if new_layout:
        for new, legacy in _VL_PREFIXES:
            if name.startswith(legacy):
                return new + name[len(legacy):]
    return name


def normalize_vl_names(tensors: dict[str, StoredTensor], model_dir: Path) -> tuple[dict[str, StoredTensor], bool]:
    """A VL checkpoint's tensors under the legacy names, and whether its files use the newer layout."""
    renamed: dict[str, StoredTensor] = {}
    stored_as: dict[str, str] = {}
    new_layout = False
    for key, tensor in tensors.items():
        name = key
        for new, legacy in _VL_PREFIXES:
            if key.startswith(new):
                name, new_layout = legacy + key[len(new):], True
                break
        if name in renamed:
            raise CheckpointError(f"{model_dir}: tensors {stored_as[name]!r} and {key!r} are the same weight "
                                  "in the two key layouts; a checkpoint must hold one")
        renamed[name], stored_as[name] = tensor, key
    return renamed, new_layout


def check_tensors(tensors: dict[str, StoredTensor], shapes: dict[str, tuple[int, ...]], model_dir: Path,
                  stored_name: Callable[[str], str] = str) -> None:
    """Presence, shape and dtype of each tensor in ``shapes``; errors name it as ``stored_name`` maps it."""
    for name, shape in shapes.items():
        key = stored_name(name)
        if name not in tensors:
            raise CheckpointError(f"{model_dir}: tensor {key!r} is missing (expected shape {list(shape)})")
        tensor = tensors[name]
        if tensor.shape != shape:
            raise CheckpointError(
                f"{model_dir}: tensor {key!r} has shape {list(tensor.shape)}, expected {list(shape)}")
        if tensor.dtype not in SUPPORTED_DTYPES:
            raise CheckpointError(f"{model_dir}: tensor {key!r} is stored as {tensor.dtype}; "
                                  f"supported: {', '.join(SUPPORTED_DTYPES)}")


def _counted(tensor: StoredTensor) -> int:
    """``tensor``'s NaN and Inf values, its file pages released after the read (``StoredTensor.release``)."""
    count = tensor.nonfinite_count()
    tensor.release()
    return count


def check_finite(tensors: dict[str, StoredTensor], model_dir: Path, stored_name: Callable[[str], str] = str) -> None:
    """CheckpointError naming each tensor that holds NaN or Inf, and how many of its values do."""
    bad = {name: count for name, count in ((name, _counted(t)) for name, t in tensors.items()) if count}
    if not bad:
        return
    shown = [f"{stored_name(name)!r} ({count:,} of {tensors[name].array.size:,})" for name, count in list(bad.items())[:3]]
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    raise CheckpointError(f"{model_dir}: weights are not finite: {len(bad)} tensor(s) hold NaN or Inf values: "
                          f"{', '.join(shown)}{more}; the checkpoint is corrupt (set "
                          f"reasoning.allow_nonfinite_weights to load it anyway, for debugging only)")


def load_checkpoint(model_dir: str | Path, *, require_vla: bool = True, allow_nonfinite: bool = False,
                    weights: str = "auto", weights_group: int = DEFAULT_INT4_GROUP) -> Checkpoint:
    """Read config.json and the safetensors weights; validate every tensor the engine will use, and refuse
    non-finite weights unless ``allow_nonfinite``. ``weights`` (``WEIGHT_FORMATS``) is the format a backend
    will hold the matrices in: quantized as they load, from whatever the files store."""
    if weights not in WEIGHT_FORMATS:
        raise CheckpointError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
    model_dir = Path(model_dir)
    config = load_model_config(model_dir)
    tensors: dict[str, StoredTensor] = {}
    for file in _weight_files(model_dir):
        try:
            tensors.update(read_safetensors(file))
        except (SafetensorsError, OSError) as exc:
            raise CheckpointError(str(exc)) from exc
    stored_name: Callable[[str], str] = str
    if config.vl is not None:
        tensors, new_layout = normalize_vl_names(tensors, model_dir)
        stored_name = partial(vl_stored_name, new_layout=new_layout)
        check_tensors(tensors, vl_shapes(config), model_dir, stored_name)
    check_tensors(tensors, language_model_shapes(config), model_dir, stored_name)
    vla = vla_shapes(config)
    stray = [name for name in STATE_PROJ if name in tensors and config.state is None]
    if stray:
        raise CheckpointError(f"{model_dir}: tensors {stray} project a robot state, but config.json has no vla.state "
                              "(its dim, mean and std): add it, or remove the tensors")
    has_vla = all(name in tensors for name in vla)
    if require_vla or any(name in tensors for name in vla):
        config.validate_vla()
        check_tensors(tensors, vla, model_dir, stored_name)
        has_vla = True
    if not allow_nonfinite:
        check_finite(tensors, model_dir, stored_name)
    return Checkpoint(model_dir, config, tensors, has_vla, weights, weights_group)
