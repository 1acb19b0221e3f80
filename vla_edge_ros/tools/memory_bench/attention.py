"""Where a frame's last token looked: the attention weights the benchmark reads, taken beside the
runtime's forward pass, never inside it.

The production forward keeps no attention weights (``model/numpy_backend.py``). ``probe_frame`` adds a
frame exactly as ``VlaEngine.add_frame`` does, with the backend's ``forward`` wrapped for that one call:
the wrapper has the forward keep every layer's input and, as soon as it returns (before the policy is
handed the frame: dms enforces evictions then), recomputes each layer's queries from that input with
the backend's own ``project`` and weighs the last one against what the layer's heads held, through the
backend's own ``attention_inputs``. The same operations on the same arrays as inside the forward, so
the same weights, bit for bit; nothing the forward computes changes. A layer's cached entries are
still what its attention read then: a forward writes each layer's rows before that layer's attention
and never touches them after.

Only the numpy backend can be probed: the cuda kernels never materialise the weights.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ...engine.vla_engine import FramePrefill, VlaEngine
from ...model.backend import ForwardResult
from ...numerics import ops

if TYPE_CHECKING:
    from ...model.numpy_backend import NumpyBackend


def last_token_attention(backend: NumpyBackend, layer_inputs: list[np.ndarray], positions: np.ndarray,
                         rope_ids: np.ndarray | None) -> np.ndarray:
    """[layers, q_heads, capacity]: the attention weights of the last of the tokens a forward just ran at
    ``positions`` (``rope_ids``: their M-RoPE ids, or None), from each layer's input ``layer_inputs``
    (``ForwardResult.layer_hidden``); 0 on every slot a head did not read."""
    c, arena = backend.config, backend.arena
    group = c.num_attention_heads // c.num_key_value_heads
    heads = np.arange(c.num_attention_heads)[:, None]
    cos, sin = backend.rotation(positions, rope_ids)
    attention = np.zeros((len(backend.layers), c.num_attention_heads, arena.capacity), np.float32)
    for layer in range(len(backend.layers)):
        q, _, _ = backend.project(layer, layer_inputs[layer], cos, sin)
        keys, _, entry_slots, bias = backend.attention_inputs(layer, positions)
        weights = ops.attention_weights(q[-1], keys, bias[:, -1, :], backend.scale)  # [q_heads, n]
        read = np.repeat(entry_slots >= 0, group, axis=0)  # query head h reads KV head h // group
        attention[layer, np.broadcast_to(heads, read.shape)[read], np.repeat(entry_slots, group, axis=0)[read]] = \
            weights[read]
    return attention


def probe_frame(engine: VlaEngine, image: np.ndarray) -> tuple[FramePrefill, np.ndarray]:
    """``engine.add_frame(image)``, and where the frame's last token looked ([layers, q_heads, capacity],
    ``last_token_attention``)."""
    from ...model.numpy_backend import NumpyBackend  # here: the command line loads this module, and numba with it

    backend = engine.backend
    if not isinstance(backend, NumpyBackend):
        raise ValueError(f"the attention probe reads the numpy backend's arrays; this engine runs {backend.name}")
    looked: list[np.ndarray] = []

    def forward(positions: np.ndarray, slots: np.ndarray, *, collect_layers: bool = False,
                rope_positions: np.ndarray | None = None, **inputs: np.ndarray | None) -> ForwardResult:
        out = NumpyBackend.forward(backend, positions, slots, collect_layers=True, rope_positions=rope_positions,
                                   **inputs)
        rope_ids = None if rope_positions is None else np.asarray(rope_positions).astype(np.int32)
        looked.append(last_token_attention(backend, out.layer_hidden, np.asarray(positions, dtype=np.int32),
                                           rope_ids))
        return out if collect_layers else replace(out, layer_hidden=None)

    backend.forward = forward  # this instance, for this one frame
    try:
        prefill = engine.add_frame(image)
    finally:
        del backend.forward  # the class's forward shows again
    (attention,) = looked  # a frame is one forward: its prefix (aura's memory token) and its tokens
    return prefill, attention
