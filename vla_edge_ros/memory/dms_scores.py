"""Where ``dms`` gets its keep/evict decisions: a learned gate from the checkpoint, or key novelty.

Both give every new token a *keep score* per (layer, KV head), an array [T, layers, kv_heads]; the
policy keeps a token in a head iff its score there is above the threshold.

- ``LearnedGate``, when the checkpoint has one: ``model.layers.{i}.self_attn.dms_gate.weight``
  [kv_heads, hidden] and ``model.layers.{i}.self_attn.dms_gate.bias`` [kv_heads] for every layer i,
  applied to the layer's input hidden state *after* the layer's input RMSNorm, i.e. to the vector
  q, k and v are projected from (DMS reads its decision off the attention projections of the same
  input). alpha = W norm(x) + b is an eviction logit, as DMS's alpha; the keep score is -alpha, so
  threshold 0 keeps a token iff sigmoid(alpha) < 1/2, DMS's rule at inference.
- ``KeyNovelty``, otherwise: 1 - the largest cosine similarity between the token's key and the keys
  the head reads in the pinned prompt, in the window (the newest ``window`` tokens before it) and
  among the earlier tokens of its own forward, all with RoPE undone, so that two keys are compared by
  what they say, not by where they sit. In [0, 2]: 0 repeats something the head still reads, 1 is
  orthogonal to all of it. A near-duplicate camera frame scores low and is forgotten; a change in
  the scene scores high and is kept. It compares a token with the window only, so a view that comes
  back after more than ``window`` tokens scores as new again (cosine's frame signatures do not forget).
"""

from __future__ import annotations

import numpy as np

from ..model.checkpoint import Checkpoint
from ..model.memory_tensors import dms_gate_names
from ..numerics import ops
from .base import _array
from .context import MemoryContext


class LearnedGate:
    """Keep scores -alpha from the checkpoint's per-layer gates (see the module doc)."""

    needs_layer_inputs = True

    def __init__(self, checkpoint: Checkpoint) -> None:
        config = checkpoint.config
        self.eps = config.rms_norm_eps
        self.norms = [checkpoint.float32(f"model.layers.{i}.input_layernorm.weight")
                      for i in range(config.num_hidden_layers)]
        self.weights = [checkpoint.float32(dms_gate_names(i)[0]) for i in range(config.num_hidden_layers)]
        self.biases = [checkpoint.float32(dms_gate_names(i)[1]) for i in range(config.num_hidden_layers)]

    def reset(self, context: MemoryContext) -> None:
        """Nothing to remember between tokens."""

    def scores(self, context: MemoryContext, slots: np.ndarray, layer_inputs: list[np.ndarray] | None) -> np.ndarray:
        if layer_inputs is None:
            raise RuntimeError("dms learned gate: the forward pass did not return the layers' inputs")
        alphas = [ops.rms_norm(x, norm, self.eps) @ weight.T + bias
                  for x, norm, weight, bias in zip(layer_inputs, self.norms, self.weights, self.biases)]
        return -np.stack(alphas, axis=1).astype(np.float32)  # [T, layers, kv_heads]

    def snapshot(self) -> dict[str, np.ndarray]:
        return {}

    def restore(self, state: dict[str, np.ndarray], context: MemoryContext) -> None:
        """Stateless: nothing to restore."""


class KeyNovelty:
    """Keep scores 1 - max cosine to the prompt's and the window's keys, RoPE undone (see the module doc)."""

    needs_layer_inputs = False

    def __init__(self, context: MemoryContext, window: int) -> None:
        c = context.config
        self.window = window
        self.recent = np.zeros((window, c.num_hidden_layers * c.num_key_value_heads, c.head_dim), np.float32)
        self.count = 0  # tokens ever pushed this episode; the ring holds the newest min(count, window)
        self.prompt = self.recent[:0]

    def reset(self, context: MemoryContext) -> None:
        self.count = 0
        self.prompt = self._unit_keys(context, context.prompt_slots)

    def _unit_keys(self, context: MemoryContext, slots: np.ndarray) -> np.ndarray:
        """Keys of ``slots`` rotated back to position 0, unit length: [n, layers * kv_heads, head_dim]."""
        keys, _ = context.read_kv(slots)  # [layers, kv_heads, n, head_dim]
        layers, heads, n, dim = keys.shape
        keys = keys.transpose(2, 0, 1, 3).reshape(n, layers * heads, dim)
        cos, sin = context.rope_undo(slots)
        keys = ops.apply_rope(keys, cos, sin)
        norms = np.linalg.norm(keys, axis=-1, keepdims=True)
        return (keys / np.where(norms > 0, norms, np.float32(1))).astype(np.float32)

    def scores(self, context: MemoryContext, slots: np.ndarray, layer_inputs: list[np.ndarray] | None) -> np.ndarray:
        new = self._unit_keys(context, slots)  # [T, LH, D]
        tokens, lh, _ = new.shape
        reference = np.concatenate([self.prompt, self.recent[:min(self.count, self.window)]])  # [R, LH, D]
        best = np.full((lh, tokens), -np.inf, dtype=np.float32)
        if reference.shape[0]:
            best = np.matmul(new.transpose(1, 0, 2), reference.transpose(1, 2, 0)).max(axis=-1)  # [LH, T]
        if tokens > 1:  # earlier tokens of the same forward: strictly causal
            among = np.matmul(new.transpose(1, 0, 2), new.transpose(1, 2, 0))  # [LH, T, T]
            among[:, ~np.tri(tokens, k=-1, dtype=bool)] = -np.inf
            best = np.maximum(best, among.max(axis=-1))
        best = np.where(np.isfinite(best), best, np.float32(0))  # nothing to compare with: orthogonal
        self._push(new)
        c = context.config
        return (1 - best).T.reshape(tokens, c.num_hidden_layers, c.num_key_value_heads).astype(np.float32)

    def _push(self, keys: np.ndarray) -> None:
        """Append to the ring of the newest ``window`` keys (of a longer forward, only its last ``window``)."""
        skipped = max(0, keys.shape[0] - self.window)
        rows = (self.count + skipped + np.arange(keys.shape[0] - skipped)) % self.window
        self.recent[rows] = keys[skipped:]
        self.count += keys.shape[0]

    def snapshot(self) -> dict[str, np.ndarray]:
        return {"novelty_window_keys": self.recent.copy(), "novelty_count": np.array([self.count], dtype=np.int64)}

    def restore(self, state: dict[str, np.ndarray], context: MemoryContext) -> None:
        """The window's keys from the snapshot; the prompt's are recomputed from the restored cache."""
        self.recent = _array(state, "novelty_window_keys", np.float32, self.recent.shape).copy()
        self.count = int(_array(state, "novelty_count", np.int64, (1,))[0])
        self.prompt = self._unit_keys(context, context.prompt_slots)
