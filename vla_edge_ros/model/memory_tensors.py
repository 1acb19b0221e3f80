"""Checkpoint tensors of the memory policies, beside HuggingFace's decoder names: names, shapes, checks.

They belong to the checkpoint format (``init-model`` and ``train`` write them, the loader checks them),
so they live with the model, below the policies that read them.

- aura: ``aura.k_proj.weight`` [d_k, write], ``aura.q_proj.weight`` [d_k, query],
  ``aura.v_proj.weight`` [d_v, write], ``aura.out_proj.weight`` [hidden, d_v]; optional learned
  write gate ``aura.gate.weight`` [1, d_k + d_v] and ``aura.gate.bias`` [1]. The widths name the
  feature layout (``memory/aura.py``): ``mean`` (query = write = hidden), ``concat`` (both
  observation_tokens * hidden) or ``hidden`` (query observation_tokens * hidden, write hidden).
- dms: ``model.layers.{i}.self_attn.dms_gate.weight`` [kv_heads, hidden] and ``.bias`` [kv_heads],
  every layer or none.
"""

from __future__ import annotations

from .checkpoint import Checkpoint, CheckpointError, check_tensors
from .config import ModelConfig

AURA_PROJECTIONS = ("aura.k_proj.weight", "aura.q_proj.weight", "aura.v_proj.weight", "aura.out_proj.weight")
AURA_GATE = ("aura.gate.weight", "aura.gate.bias")

FEATURES = ("mean", "concat", "hidden")


def feature_sizes(config: ModelConfig, layout: str) -> tuple[int, int]:
    """(query width, write width) in ``layout``: what q_proj reads, and what k_proj and v_proj read."""
    tokens = config.hidden_size * config.observation_tokens
    widths = {"mean": (config.hidden_size, config.hidden_size), "concat": (tokens, tokens),
              "hidden": (tokens, config.hidden_size)}
    if layout not in widths:
        raise ValueError(f"aura feature layout must be one of {FEATURES}, got {layout!r}")
    return widths[layout]


def feature_layout(config: ModelConfig, query_width: int, write_width: int) -> str:
    """The layout whose queries and writes read these widths, or CheckpointError naming the known ones."""
    for layout in FEATURES:
        if feature_sizes(config, layout) == (query_width, write_width):
            return layout
    known = ", ".join(f"{layout} {feature_sizes(config, layout)}" for layout in FEATURES)
    raise CheckpointError(f"aura projections read (query, write) = ({query_width}, {write_width}) values; "
                          f"this config's layouts read {known}")


def aura_shapes(config: ModelConfig, d_k: int, d_v: int, *, learned_gate: bool, layout: str = "mean"
                ) -> dict[str, tuple[int, ...]]:
    query, write = feature_sizes(config, layout)
    shapes = {"aura.k_proj.weight": (d_k, write), "aura.q_proj.weight": (d_k, query),
              "aura.v_proj.weight": (d_v, write), "aura.out_proj.weight": (config.hidden_size, d_v)}
    if learned_gate:
        shapes.update({"aura.gate.weight": (1, d_k + d_v), "aura.gate.bias": (1,)})
    return shapes


def dms_gate_names(layer: int) -> tuple[str, str]:
    """Checkpoint names of layer ``layer``'s dms gate weight and bias."""
    prefix = f"model.layers.{layer}.self_attn.dms_gate."
    return prefix + "weight", prefix + "bias"


def dms_gate_shapes(layers: int, kv_heads: int, hidden: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in range(layers):
        weight, bias = dms_gate_names(layer)
        shapes.update({weight: (kv_heads, hidden), bias: (kv_heads,)})
    return shapes


def has_dms_gate(checkpoint: Checkpoint) -> bool:
    """True when the checkpoint carries dms gate tensors (all of them, checked, or CheckpointError)."""
    config = checkpoint.config
    shapes = dms_gate_shapes(config.num_hidden_layers, config.num_key_value_heads, config.hidden_size)
    present = [name for name in shapes if name in checkpoint.tensors]
    if not present:
        return False
    missing = sorted(set(shapes) - set(present))
    if missing:
        raise CheckpointError(f"{checkpoint.path}: dms gate tensors are incomplete, missing {missing}")
    check_tensors(checkpoint.tensors, shapes, checkpoint.path)
    return True


def check_aura(checkpoint: Checkpoint) -> tuple[str, bool]:
    """(feature layout, has a learned write gate) of the checkpoint's aura tensors, every one checked;
    CheckpointError naming what is missing or misshapen."""
    tensors = checkpoint.tensors
    missing = [name for name in AURA_PROJECTIONS if name not in tensors]
    if missing:
        raise CheckpointError(f"{checkpoint.path}: kv.policy aura needs tensors {missing}; `vla-edge init-model` "
                              "writes them (random), `vla-edge train` learned ones when its recipe runs the aura stage")
    d_k, d_v = tensors["aura.k_proj.weight"].shape[0], tensors["aura.v_proj.weight"].shape[0]
    learned = any(name in tensors for name in AURA_GATE)
    layout = feature_layout(checkpoint.config, tensors["aura.q_proj.weight"].shape[-1],
                            tensors["aura.k_proj.weight"].shape[-1])
    check_tensors(tensors, aura_shapes(checkpoint.config, d_k, d_v, learned_gate=learned, layout=layout),
                  checkpoint.path)
    return layout, learned
