"""``aura``: constant memory. Past frames are not kept as KV; what matters of them lives in fast weights.

The KV cache holds the pinned prompt, one *memory token* and the current frame, nothing else. Each
frame gives a query q = normalise(W_q z_q), a key k = normalise(W_k z_w) and a value v = W_v z_w.
Which features z_q and z_w are is the checkpoint's *layout*, told apart by the projections' input
widths (``model/memory_tensors.FEATURES``):

- ``mean`` (both hidden wide): the mean of the frame's encoder tokens (the transformer's input). What
  a cue *is* survives (its colour and shape), *where* it is does not: the encoder is linear, so the
  mean of its tokens is a projection of the mean image patch. ``vla-edge init-model`` writes this
  layout; the memory benchmark's readout of the cue class through random projections works on it and
  not on ``concat`` (0.50 vs 0.22 at N = 64).
- ``concat`` (both observation_tokens * hidden wide): the encoder tokens concatenated in order, which
  keeps where a cue is, but only as a linear function of pixels: a linear map from it to where the
  cue ring was, fitted on 600 layouts, missed by 0.31-0.60 (squared, in [-1, 1] units) on new ones.
- ``hidden`` (z_q as ``concat``, z_w hidden wide): the query as ``concat``; key and value from the
  frame's final-norm hidden state at its last token, what the action head reads, i.e. what the
  decoder made of the frame. The same linear map fitted on it missed by 0.011. ``vla-edge train``
  writes this layout: the memory stores what the model understood, not pixels.

Per frame, in this order:

1. read: r = W q + b from the memory as it was before this frame;
2. the memory token W_out r is prefilled right before the frame's tokens, so every layer of the
   frame and every action token can attend to what the memory returned: that is how the read feeds
   the action head;
3. write, after the frame's forward (which made the ``hidden`` layout's z_w): surprise =
   ||v - (W k + b)||. The policy's write gate decides (``aura_gate.py``: a strategy the policy is
   given; a robot runs ``SurpriseGate``, evaluation plugs its baselines in the same place). In the
   surprise gate one source decides, as in ``dms``: the checkpoint's learned gate when it has one and
   ``use_learned_gate`` is true (write iff logit = w . [k, v - (W k + b)] + c > 0), otherwise the
   surprise threshold (write iff surprise > threshold * ||v||). A write is one delta-rule step:
   W += beta (v - W k - b) k^T, b += beta (v - W k - b).

The threshold is relative to ||v|| so that one default means the same on every checkpoint: 0.5
writes when the memory mispredicts the value by more than half its length. ``last_surprise`` is
reported in the same relative units whichever source decides.

With ``target_write_rate`` rho > 0 the surprise gate adapts one-sidedly: the policy's EMA of its
write rate over about ``RATE_WINDOW_FRAMES`` frames drives lambda += RATE_STEP * (rate - rho),
lambda >= 0, which multiplies the threshold by exp(lambda) or is subtracted from the learned logit
(write iff logit - lambda > 0): the gate tightens while writes exceed rho and relaxes back to its
configured self when they do not, never beyond it. lambda is the policy's state (it is saved with
the memory), offered to the gate with each frame.

State: W [d_v, d_k] and b [d_v] in fp32, (d_k * d_v + d_v) * 4 bytes (4,224 B at d_k = d_v = 32),
the same at frame 1 and at frame 10^6. Positions: prompt 0..P-1, memory token P, frame P+1..P+n,
the same every frame, so nothing is ever re-rotated.

Checkpoint tensors (``vla-edge init-model`` writes random ones; training writes learned ones):
``aura.k_proj.weight`` [d_k, feature], ``aura.q_proj.weight`` [d_k, feature], ``aura.v_proj.weight``
[d_v, feature] with feature = observation_tokens * hidden, ``aura.out_proj.weight`` [hidden, d_v];
optional learned gate ``aura.gate.weight`` [1, d_k + d_v] and ``aura.gate.bias`` [1].
"""

from __future__ import annotations

import math

import numpy as np

from ..config import AuraKnobs, MemoryKnobs
from ..model.memory_tensors import AURA_GATE, AURA_PROJECTIONS, check_aura
from .aura_gate import SurpriseGate, WriteGate, WriteOffer
from .base import FrameTokens, MemoryPolicy, _array
from .context import MemoryContext, MemorySite
from .memory_math import FastWeights, MemoryMath

RATE_WINDOW_FRAMES = 50
RATE_STEP = 0.5


def query_feature(embeddings: np.ndarray, layout: str) -> np.ndarray:
    """z_q of a frame's [observation_tokens, hidden] embeddings in ``layout``."""
    if layout == "mean":
        return embeddings.mean(axis=0, dtype=np.float32)
    return embeddings.reshape(-1).astype(np.float32, copy=False)


def write_feature(frame: FrameTokens, layout: str) -> np.ndarray:
    """z_w of a prefilled frame in ``layout``."""
    if layout != "hidden":
        return query_feature(frame.embeddings, layout)
    if frame.hidden is None:
        raise RuntimeError("aura: the hidden layout writes the frame's last hidden state, and none was given")
    return frame.hidden.astype(np.float32, copy=False)


def _normalise(x: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(x))
    return (x / norm).astype(np.float32) if norm > 0 else x.astype(np.float32)


def fast_weight_bytes(d_k: int, d_v: int) -> int:
    """Bytes of the fast-weight state W [d_v, d_k] and b [d_v], fp32: constant whatever the episode's length."""
    return (d_k * d_v + d_v) * 4


class AuraPolicy(MemoryPolicy):
    name = "aura"
    needs_prefix = True

    def __init__(self, knobs: AuraKnobs, gate: WriteGate | None = None) -> None:
        """``gate`` decides each write; None: the ``SurpriseGate`` that ``knobs`` configure."""
        super().__init__()
        self.knobs = knobs
        self.gate = gate if gate is not None else SurpriseGate()
        self.memory: FastWeights | None = None
        self.learned_gate: tuple[np.ndarray, np.ndarray] | None = None  # (weight, bias) once attached, if any
        self.current: np.ndarray = np.empty(0, dtype=np.int32)  # slots of the memory token and current frame
        self._prefixed = False  # frame_prefix has read the memory for the frame being prefilled
        self.last_read: np.ndarray | None = None   # r the latest frame read (before its own write)
        self.last_value: np.ndarray | None = None  # v of the latest frame (written or not)
        self._lambda = 0.0
        self._rate = 0.0
        self.last_surprise = math.nan

    @classmethod
    def check_knobs(cls, knobs: AuraKnobs, site: MemorySite) -> None:
        """The arena must hold aura's memory token beside the prompt and one frame (a live switch to aura
        would otherwise fail at the next episode's prefill)."""
        site.check_capacity(int(cls.needs_prefix), "aura's memory token")

    @classmethod
    def check_tensors(cls, site: MemorySite) -> None:
        check_aura(site.checkpoint)

    def configure(self, knobs: MemoryKnobs) -> None:
        self.knobs = knobs.aura  # every aura knob is live

    def attach(self, context: MemoryContext) -> None:
        super().attach(context)
        checkpoint = context.checkpoint
        self.layout, learned = check_aura(checkpoint)
        self.k_proj, self.q_proj, self.v_proj, self.out_proj = (checkpoint.float32(n) for n in AURA_PROJECTIONS)
        self.learned_gate = tuple(checkpoint.float32(n) for n in AURA_GATE) if learned else None
        self.memory = MemoryMath.for_device(context.device).fast_weights(self.k_proj.shape[0], self.v_proj.shape[0])

    @property
    def effective_threshold(self) -> float:
        """The surprise threshold after the write-rate adaptation (the learned gate is offset by lambda instead)."""
        return self.knobs.threshold * math.exp(self._lambda)

    def reset(self) -> None:
        super().reset()
        memory = self._memory()
        memory.set(np.zeros((memory.d_v, memory.d_k), np.float32), np.zeros(memory.d_v, np.float32))
        self.current = np.empty(0, dtype=np.int32)
        self._prefixed = False
        self.last_read = self.last_value = None
        self._lambda = self._rate = 0.0
        self.gate.reset()

    def _memory(self) -> FastWeights:
        if self.memory is None:
            raise RuntimeError("aura policy is not attached to an engine")
        return self.memory

    def frame_prefix(self, embeddings: np.ndarray) -> np.ndarray:
        q = _normalise(self.q_proj @ query_feature(embeddings, self.layout))
        self.last_read = self._memory().read(q)
        self._prefixed = True
        return (self.out_proj @ self.last_read)[None, :].astype(np.float32)

    def make_room(self, tokens: int) -> int:
        arena = self._context().arena
        evicted = int(self.current.size > 0)
        arena.release(self.current)
        self.current = np.empty(0, dtype=np.int32)
        if arena.capacity - arena.used < tokens:
            raise RuntimeError(f"aura: {tokens} tokens do not fit beside the prompt in the arena")
        self.evictions += evicted
        return evicted

    def add_frame(self, frame: FrameTokens) -> None:
        if not self._prefixed:
            raise RuntimeError("aura: add_frame without frame_prefix")
        self._prefixed = False
        z = write_feature(frame, self.layout)
        k, v = _normalise(self.k_proj @ z), (self.v_proj @ z).astype(np.float32)
        self.last_value = v
        self.current = np.concatenate([frame.prefix_slots, frame.slots]).astype(np.int32)
        self.frames_seen += 1
        memory = self._memory()
        scale = float(np.linalg.norm(v))
        if np.isfinite(scale):
            surprise, written = memory.step(k, v, self.knobs.beta, *self.gate.decide(self._offer(memory, k, v, scale)))
            self.last_surprise = surprise / scale if scale > 0 else 0.0
        else:  # a diverged forward (hidden layout): one bad frame must not poison every later read
            written, self.last_surprise = False, math.nan
        self.writes += int(written)
        if self.knobs.target_write_rate > 0:
            self._rate += (float(written) - self._rate) / RATE_WINDOW_FRAMES
            self._lambda = max(0.0, self._lambda + RATE_STEP * (self._rate - self.knobs.target_write_rate))

    def _offer(self, memory: FastWeights, k: np.ndarray, v: np.ndarray, scale: float) -> WriteOffer:
        """The frame just made, for the gate; the learned gate is offered only when it is to decide."""
        learned = self.learned_gate if self.knobs.use_learned_gate else None
        return WriteOffer(self.frames_seen, k, v, scale, memory, self.effective_threshold, learned, self._lambda)

    def frames_kept(self) -> int:
        return int(self.current.size > 0)

    def state_bytes(self) -> int:
        memory = self._memory()
        return fast_weight_bytes(memory.d_k, memory.d_v)

    def snapshot(self) -> dict[str, np.ndarray]:
        state = super().snapshot()
        weights, bias = self._memory().get()
        state.update(weights=weights, bias=bias, current_slots=self.current.copy(),
                     threshold_state=np.array([self._lambda, self._rate], dtype=np.float64))
        return state

    def restore(self, state: dict[str, np.ndarray]) -> None:
        super().restore(state)
        memory = self._memory()
        memory.set(_array(state, "weights", np.float32, (memory.d_v, memory.d_k)),
                   _array(state, "bias", np.float32, (memory.d_v,)))
        self.current = _array(state, "current_slots", np.int32, (None,)).copy()
        self._lambda, self._rate = (float(x) for x in _array(state, "threshold_state", np.float64, (2,)))
