"""``cosine``: evict the most redundant frame, so a unique event outlives a long run of look-alikes.

Each frame gets a *signature* when it enters: the mean over its tokens of its keys with RoPE undone
(rotated back by their own positions, so a frame's signature does not depend on where in the cache
it sits), for a chosen set of layers, every KV head concatenated (averaging over heads would mix
unrelated subspaces). ``signature: values`` uses the values instead (no rotation to undo);
``signature: embeddings`` uses the frame encoder's output, before any transformer layer. The
memory benchmark compares the three.

When room is needed, the frame whose nearest other frame is most similar goes; ties go to the older
frame; the newest ``protect_recent_frames`` are never evicted (the robot's present is not
redundant, it is the one thing it must see). Similarities are cached in a matrix, together with each
frame's nearest neighbour, so an insert costs one similarity row, O(frames x signature_dim), plus
O(frames) per frame whose nearest neighbour was the one evicted.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..config import CosineKnobs, MemoryKnobs, choices_of
from ..model.layout import arena_capacity
from ..numerics import ops
from .base import FrameTokens, _array
from .context import MemoryContext, MemorySite
from .frames import FrameWindowPolicy
from .memory_math import MemoryMath

SIGNATURES = choices_of("reasoning", "kv.cosine.signature")


class CosinePolicy(FrameWindowPolicy):
    name = "cosine"

    def __init__(self, knobs: CosineKnobs) -> None:
        super().__init__()
        self.knobs = knobs
        self.math: MemoryMath | None = None

    @property
    def signature(self) -> str:
        return self.knobs.signature

    @property
    def signature_layers(self) -> tuple[int, ...]:
        return self.knobs.signature_layers

    @property
    def protect_recent_frames(self) -> int:
        return self.knobs.protect_recent_frames

    @classmethod
    def check_knobs(cls, cosine: CosineKnobs, site: MemorySite) -> None:
        if not cosine.signature_layers and cosine.signature != "embeddings":
            raise ValueError("kv.cosine.signature_layers must name at least one layer")
        layers = site.config.num_hidden_layers
        bad = [i for i in cosine.signature_layers if not -layers <= i < layers]
        if bad and cosine.signature != "embeddings":
            raise ValueError(f"kv.cosine.signature_layers {bad} out of range for a {layers}-layer model")
        capacity = site.frames()
        protect = cosine.protect_recent_frames
        if not 0 <= protect < capacity:
            enough = arena_capacity(site.config, site.prompt_tokens, protect + 1)
            raise ValueError(f"kv.cosine.protect_recent_frames={protect} must be in [0, {capacity - 1}]: the arena "
                             f"holds {capacity} frames and one must stay evictable (or kv_capacity_tokens at least "
                             f"{enough})")

    def attach(self, context: MemoryContext) -> None:
        super().attach(context)
        self.check_knobs(self.knobs, context.site())
        rows = self.capacity_frames() + 1  # the arena's frames plus the one being inserted
        self.math = MemoryMath.for_device(context.device)
        self._dim = self._signature_dim()
        self._index = self.math.signature_index(rows, self._dim)
        self._sim = np.full((rows, rows), -np.inf, dtype=np.float32)
        self._nearest = np.full(rows, -np.inf, dtype=np.float32)
        self._nearest_row = np.full(rows, -1, dtype=np.int32)
        self._live = np.zeros(rows, dtype=bool)
        self._rows: list[int] = []  # signature row of each kept frame, parallel to ``frames``

    def configure(self, knobs: MemoryKnobs) -> None:
        self.knobs = replace(self.knobs, protect_recent_frames=knobs.cosine.protect_recent_frames)

    def _signature_dim(self) -> int:
        c = self._context().config
        if self.signature == "embeddings":
            return c.hidden_size
        return len(self.signature_layers) * c.num_key_value_heads * c.head_dim

    def reset(self) -> None:
        super().reset()
        self.reset_index()

    def reset_index(self) -> None:
        self._sim.fill(-np.inf)
        self._nearest.fill(-np.inf)
        self._nearest_row.fill(-1)
        self._live[:] = False
        self._rows = []

    def signature_of(self, frame: FrameTokens) -> np.ndarray:
        """The frame's signature vector (see the module doc)."""
        if self.signature == "embeddings":
            return frame.embeddings.mean(axis=0, dtype=np.float32)
        keys, values = self._context().read_kv(frame.slots)  # [layers, kv_heads, n, head_dim]
        chosen = (keys if self.signature == "keys" else values)[list(self.signature_layers)]
        if self.signature == "keys":
            cos, sin = self._context().rope_undo(frame.slots)
            chosen = np.stack([ops.apply_rope(layer.transpose(1, 0, 2), cos, sin) for layer in chosen])
            return chosen.mean(axis=1, dtype=np.float32).reshape(-1)  # [layers, n, heads, D] -> mean over n
        return chosen.mean(axis=2, dtype=np.float32).reshape(-1)

    def add_frame(self, frame: FrameTokens) -> None:
        self._insert(self.signature_of(frame))
        super().add_frame(frame)

    def _insert(self, signature: np.ndarray) -> None:
        """Give the newest frame a signature row and update the cached similarities and neighbours."""
        row = int(np.flatnonzero(~self._live)[0])
        sims = np.where(self._live, self._index.put(row, signature), np.float32(-np.inf))
        self._sim[row, :] = sims
        self._sim[:, row] = sims
        closer = sims > self._nearest
        self._nearest_row[closer] = row
        self._nearest[closer] = sims[closer]
        best = int(np.argmax(sims))
        self._nearest[row], self._nearest_row[row] = sims[best], (best if self._live[best] else -1)
        self._live[row] = True
        self._rows.append(row)

    def choose_victim(self) -> int:
        candidates = len(self.frames) - self.protect_recent_frames
        if candidates <= 0:
            return 0  # only reachable if the arena shrank below the protected window: oldest goes
        redundancy = self._nearest[self._rows[:candidates]]
        return int(np.argmax(redundancy))  # first maximum: the older frame wins ties

    def forget(self, index: int) -> None:
        row = self._rows.pop(index)
        self._live[row] = False
        self._sim[row, :] = -np.inf
        self._sim[:, row] = -np.inf
        self._nearest[row], self._nearest_row[row] = -np.inf, -1
        for other in np.flatnonzero(self._live & (self._nearest_row == row)):
            best = int(np.argmax(self._sim[other]))
            self._nearest[other] = self._sim[other, best]
            self._nearest_row[other] = best if np.isfinite(self._sim[other, best]) else -1

    def redundancy(self) -> np.ndarray:
        """Each kept frame's similarity to its nearest other frame, oldest first (for tests and reports)."""
        return self._nearest[self._rows].copy()

    def snapshot(self) -> dict[str, np.ndarray]:
        state = super().snapshot()
        rows = np.asarray(self._rows, dtype=np.int32)
        state["signatures"] = self._index.rows(rows)
        return state

    def restore(self, state: dict[str, np.ndarray]) -> None:
        super().restore(state)
        signatures = _array(state, "signatures", np.float32, (len(self.frames), self._dim))
        frames = self.frames
        self.frames = []
        self.reset_index()
        for slots, signature in zip(frames, signatures):  # re-insert in arrival order: same cache, same answers
            self._insert(signature)
            self.frames.append(slots)
