"""The VLA engine: (pinned prompt, camera frame) -> action, on a bounded KV arena.

The prompt is prefilled once and pinned at the front of the cache. Every ``step`` encodes one
frame, prefills its ``tokens_per_frame`` tokens after what is already cached, and decodes the
action. Decoded action tokens are scratch: they leave the cache when the step ends. When a new
frame does not fit, the oldest frame is evicted (a sliding window; smarter forgetting is the KV
policies' job) and the kept tokens are re-positioned 0..n-1 by rotating their keys, so positions
stay below the arena capacity however long the episode runs.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .action_head import ActionHead
from .arena import KVArena
from .backend import Backend
from .checkpoint import Checkpoint
from .vision import FrameEncoder

BACKENDS = ("auto", "numpy", "cuda")


def cuda_simulated() -> bool:
    """True when Numba's CUDA simulator stands in for a GPU (NUMBA_ENABLE_CUDASIM=1, as in the tests)."""
    try:
        from numba import config
    except ImportError:
        return False
    return bool(config.ENABLE_CUDASIM)


def cuda_available() -> bool:
    """True when a real CUDA device is usable (Numba's simulator does not count)."""
    if cuda_simulated():
        return False
    try:
        from numba import cuda
    except ImportError:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # a broken driver install must not take the numpy path down with it
        return False


def resolve_backend(name: str) -> str:
    """``auto`` means cuda when a GPU is present, else numpy."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        return "cuda" if cuda_available() else "numpy"
    return name


def make_backend(name: str, checkpoint: Checkpoint, arena: KVArena) -> Backend:
    """Build the requested backend over ``arena``."""
    if resolve_backend(name) == "cuda":
        if not (cuda_available() or cuda_simulated()):
            raise ValueError("backend 'cuda' was requested but no CUDA GPU is usable here; use 'auto' or 'numpy'")
        from .cuda_backend import CudaBackend

        return CudaBackend(checkpoint, arena)
    from .numpy_backend import NumpyBackend

    return NumpyBackend(checkpoint, arena)


@dataclass
class FramePrefill:
    """A frame now in memory: the last hidden state to decode the action from, and where it ends."""

    hidden: np.ndarray
    next_position: int
    evicted_frames: int
    encode_ms: float
    prefill_ms: float


@dataclass
class StepResult:
    """One cycle's action and where its time went."""

    action: np.ndarray
    tokens: list[int] = field(default_factory=list)
    encode_ms: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    evicted_frames: int = 0

    @property
    def total_ms(self) -> float:
        return self.encode_ms + self.prefill_ms + self.decode_ms


class VlaEngine:
    """Owns the arena, the backend, the frame encoder and the action head."""

    def __init__(self, checkpoint: Checkpoint, *, backend: str = "auto", kv_capacity_tokens: int = 1024) -> None:
        config = checkpoint.config
        if not checkpoint.has_vla:
            raise ValueError(f"{checkpoint.path}: no vision weights; a VLA engine needs vision.* tensors")
        self.config = config
        self.tokens_per_frame = config.vision.tokens_per_frame
        scratch = config.action.dof if config.action.head == "bins" else 0
        if kv_capacity_tokens < self.tokens_per_frame + scratch + 1:
            raise ValueError(f"kv_capacity_tokens={kv_capacity_tokens} cannot hold one frame "
                             f"({self.tokens_per_frame} tokens) plus {scratch} action tokens")
        self.arena = KVArena(kv_capacity_tokens)
        self.backend = make_backend(backend, checkpoint, self.arena)
        self.encoder = FrameEncoder.from_checkpoint(checkpoint)
        weight = bias = None
        if config.action.head == "linear":
            weight, bias = checkpoint.float32("action_head.weight"), checkpoint.float32("action_head.bias")
        self.head = ActionHead(config.action, config.vocab_size, weight, bias)
        self.prompt_slots = np.empty(0, dtype=np.int32)
        self._prompt_ids = np.empty(0, dtype=np.int32)
        self.frames: deque[np.ndarray] = deque()
        self._scratch_tokens = scratch

    def set_prompt(self, token_ids: list[int] | np.ndarray) -> None:
        """Start an episode: clear the cache and prefill (and pin) the instruction tokens."""
        ids = np.asarray(token_ids, dtype=np.int32)
        if ids.size + self.tokens_per_frame + self._scratch_tokens > self.arena.capacity:
            raise ValueError(f"prompt of {ids.size} tokens leaves no room for a frame in a "
                             f"{self.arena.capacity}-token arena")
        self.arena.release(np.arange(self.arena.capacity))
        self.frames.clear()
        self._prompt_ids = ids
        self.prompt_slots = self.arena.allocate(ids.size)
        if ids.size:
            self.backend.forward(np.arange(ids.size, dtype=np.int32), self.prompt_slots, token_ids=ids)

    def warm_up(self) -> None:
        """Run one cycle on a blank frame, then restore the episode's start.

        The first cycle pays one-off costs (BLAS and OpenCV initialisation, first-touch of every
        buffer, kernel compilation on the GPU) that are many times a normal cycle; a robot should
        pay them at load, not in its first control period.
        """
        size = self.config.vision.image_size
        self.step(np.zeros((size, size, 3), dtype=np.uint8))
        self.set_prompt(self._prompt_ids)

    def _make_room(self, count: int) -> int:
        """Evict the oldest frames until ``count`` tokens fit in slots and in positions."""
        evicted = 0
        while self.arena.capacity - self.arena.used < count:
            self.arena.release(self.frames.popleft())
            evicted += 1
        if evicted or self.arena.next_position() + count > self.arena.capacity:
            self.compact_positions()
        return evicted

    def compact_positions(self) -> None:
        """Re-position the cached tokens to 0..n-1 in their current order, rotating their keys."""
        slots = self.arena.slots_in_order()
        targets = np.arange(slots.size, dtype=np.int32)
        shifts = targets - self.arena.positions[slots]
        moving = shifts != 0
        if moving.any():
            self.backend.rotate_keys(slots[moving], shifts[moving])
            self.arena.positions[slots] = targets

    def add_frame(self, image: np.ndarray) -> FramePrefill:
        """Encode one frame and prefill its tokens into the memory (evicting the oldest frame if full)."""
        t0 = time.perf_counter()
        embeddings = self.encoder.encode(image)
        t1 = time.perf_counter()
        evicted = self._make_room(self.tokens_per_frame + self._scratch_tokens)
        slots = self.arena.allocate(self.tokens_per_frame)
        start = self.arena.next_position()
        positions = np.arange(start, start + self.tokens_per_frame, dtype=np.int32)
        hidden = self.backend.forward(positions, slots, embeddings=embeddings).hidden[-1]
        self.frames.append(slots)
        t2 = time.perf_counter()
        return FramePrefill(hidden, int(positions[-1]) + 1, evicted, (t1 - t0) * 1e3, (t2 - t1) * 1e3)

    def decode_action(self, prefill: FramePrefill, admit: Callable[[], object] = lambda: True,
                      done: Callable[[object], None] = lambda ticket: None) -> tuple[np.ndarray, list[int]] | None:
        """The action for a prefilled frame, or None if ``admit`` refused a decode step.

        ``admit`` is asked before each decode step (a falsy answer abandons the action, leaving the
        frame in memory) and ``done`` is given its answer after the step: the admission gate's hooks.
        """
        if self.config.action.head == "linear":
            return self.head.from_hidden(prefill.hidden), []
        head, dof = self.head, self.config.action.dof
        bins = [self.backend.greedy(prefill.hidden, head.bin_rows)]
        scratch = self.arena.allocate(dof - 1)
        try:
            for i in range(dof - 1):
                ticket = admit()
                if not ticket:
                    return None
                token = np.array([head.first_bin_token + bins[-1]], dtype=np.int32)
                position = np.array([prefill.next_position + i], dtype=np.int32)
                out = self.backend.forward(position, scratch[i:i + 1], token_ids=token)
                bins.append(self.backend.greedy(out.hidden[-1], head.bin_rows))
                done(ticket)
        finally:
            self.arena.release(scratch)
        return head.from_bins(bins), [head.first_bin_token + b for b in bins]

    def step(self, image: np.ndarray) -> StepResult:
        """Encode one frame, add it to the memory, and decode the action (no admission control)."""
        prefill = self.add_frame(image)
        t0 = time.perf_counter()
        action, tokens = self.decode_action(prefill)
        decode_ms = (time.perf_counter() - t0) * 1e3
        return StepResult(action, tokens, prefill.encode_ms, prefill.prefill_ms, decode_ms, prefill.evicted_frames)
