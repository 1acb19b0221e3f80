"""What a stored KV block is bound to: the exact model, KV layout and engine that made it.

KV bytes are only meaningful to the model that computed them. Two checkpoints with the same
token ids produce different keys and values, and so does the same checkpoint under another frame
encoder or KV layout; loading across any of these would give a robot silently wrong attention.
The fingerprint hashes everything that decides the bytes, so a mismatch is a miss, never a load.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from ..model.checkpoint import Checkpoint

# Bump when anything the engine writes into the arena changes meaning (RoPE convention, KV dtype,
# the frame encoder's pixel pipeline, the policy state layout): older blocks then stop matching.
# 2: episode memory lists each (layer, KV head)'s entries in its own pages' order (per-head paged KV).
ENGINE_FORMAT_VERSION = 2
KV_DTYPE = "float32"


def weights_digest(checkpoint: Checkpoint) -> bytes:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order (independent of sharding)."""
    digest = hashlib.sha256()
    for name in sorted(checkpoint.tensors):
        tensor = checkpoint.tensors[name]
        digest.update(f"{name}\0{tensor.dtype}\0{list(tensor.shape)}\0".encode())
        digest.update(memoryview(np.ascontiguousarray(tensor.array)).cast("B"))
        tensor.release()  # read once: its file pages need not stay resident
    return digest.digest()


def model_fingerprint(checkpoint: Checkpoint, weights: bytes | None = None) -> bytes:
    """32 bytes binding a block to config, weights, KV layout, frame encoder and engine format version, and to
    the format the weights are held in when it changes their values (``reasoning.weights``)."""
    config = checkpoint.config
    description = {
        "engine_format_version": ENGINE_FORMAT_VERSION,
        "config": config.to_hf_dict(),  # includes the frame encoder's settings (vla.vision)
        "kv_layout": {"dtype": KV_DTYPE, "layers": config.num_hidden_layers,
                      "kv_heads": config.num_key_value_heads, "head_dim": config.head_dim},
        "weights_sha256": (weights or weights_digest(checkpoint)).hex(),
    }
    matrices = ("model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight")
    if any(checkpoint.rounds(name) for name in matrices):  # int8 / int4 / bf16 of wider files compute other KV
        description["weights_held"] = {"formats": [checkpoint.format_of(name) for name in matrices],
                                       "group": checkpoint.weights_group if checkpoint.weights == "int4" else 0}
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).digest()
