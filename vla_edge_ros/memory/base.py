"""What a KV memory policy is: the part of the engine that decides what the cache keeps.

A policy's "frame" is one observation's token group (``ModelConfig.observation_tokens``): each camera's
``tokens_per_frame`` tokens, the primary camera's first, then the robot's state token when the model reads
one. Policies keep or evict these groups whole (dms decides per token, as ever); with one camera and no
state a frame is exactly the camera's frame.

The engine owns the arena and the backend; a policy owns the bookkeeping of what is in the arena
beyond the pinned prompt, and sees the engine only through the ``MemoryContext`` it is attached to
(context.py). Each frame, the engine asks the policy for any tokens to prefill before
the frame (``frame_prefix``), to make room for them (``make_room``: the policy releases slots), and
then hands it the prefilled frame (``add_frame``). Decoded action tokens are scratch that leaves at
the end of the step, unless the policy ``keeps_decoded`` (dms): then each one is handed over
(``add_decoded``) like a frame. After evictions the engine re-positions every kept token by its
order in the cache (pinned prompt first, then the rest in arrival order) by rotating cached keys,
so positions stay below the arena capacity for an episode that never ends.

A policy that decides per KV head (``per_kv_head``, dms) gets the arena's per-head page layout
(``model/pages.py``): each (layer, KV head) holds only the tokens it still reads, in its own pages, and
attention reads each head's own; the others get the dense layout, where every head holds every token.

Knobs come from the schema as typed groups (``config.MemoryKnobs``). ``check_knobs`` (a class
method) says whether a group can run at a ``MemorySite`` without building anything, which is how a
live parameter change is checked; ``attach`` runs the same check on its own knobs. ``configure``
applies live changes to a running policy, between cycles.

Switching policy takes effect at an episode boundary: ``VlaEngine.set_policy`` installs the new
policy together with a fresh prompt prefill, because one policy cannot interpret another's state
(cosine's signatures, aura's fast weights) and a cache mid-episode may hold what the new policy
would never have kept.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..config import MemoryKnobs
from .context import MemoryContext, MemorySite


@dataclass(frozen=True)
class FrameTokens:
    """A frame just prefilled into the arena: where its tokens went and what the model made of them."""

    slots: np.ndarray  # arena slots of the frame's tokens (after any prefix tokens)
    positions: np.ndarray  # their RoPE positions
    embeddings: np.ndarray  # [observation_tokens, hidden] frame-encoder (and state) output: the transformer's input
    prefix_slots: np.ndarray  # slots of the tokens ``frame_prefix`` asked for (empty if none)
    layer_inputs: list[np.ndarray] | None = None  # each layer's input [observation_tokens, hidden], if asked for
    hidden: np.ndarray | None = None  # [hidden] final-norm hidden state at the frame's last token (the action's)


@dataclass(frozen=True)
class DecodedTokens:
    """Decoded action tokens just written to the arena, for a policy that ``keeps_decoded``."""

    slots: np.ndarray
    positions: np.ndarray
    layer_inputs: list[np.ndarray] | None = None  # each layer's input [n, hidden], if asked for


@dataclass(frozen=True)
class MemoryStats:
    """What a policy holds and has done, for diagnostics, benchmarks and reports."""

    policy: str
    frames_seen: int  # frames offered to the memory this episode
    frames_kept: int  # frames whose tokens are in the cache now
    kv_tokens: int  # cache slots in use, pinned prompt included
    kv_bytes: int  # bytes of keys and values held, all layers (per-head pages: the pages in use)
    state_bytes: int  # policy state outside the KV cache (aura's fast weights; 0 for the others)
    evictions: int  # frames evicted this episode (dms: tokens evicted from every head)
    writes: int  # writes into the memory this episode (frames stored; aura: fast-weight updates; dms: tokens)
    tokens_seen: int  # tokens that entered the memory this episode, the pinned prompt not counted
    tokens_held: float  # tokens a (layer, KV head) reads now beyond the prompt, mean over heads

    @property
    def memory_bytes(self) -> int:
        return self.kv_bytes + self.state_bytes

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "memory_bytes": self.memory_bytes}


class MemoryPolicy(ABC):
    """Decides which frames the KV cache keeps; one instance serves one engine."""

    name: str
    needs_prefix = False  # True when ``frame_prefix`` may return tokens
    per_kv_head = False  # True when the policy evicts per KV head: the arena then keeps pages per KV head
    keeps_decoded = False  # True when decoded action tokens are handed to ``add_decoded`` instead of dropped

    def __init__(self) -> None:
        self.context: MemoryContext | None = None
        self.frames_seen = 0
        self.evictions = 0
        self.writes = 0

    @classmethod
    def check_knobs(cls, knobs: Any, site: MemorySite) -> None:
        """ValueError naming the knob when this policy's knob group (``MemoryKnobs.<name>``, None for a
        policy without knobs) cannot run at ``site``; builds nothing."""

    @classmethod
    def check_tensors(cls, site: MemorySite) -> None:
        """CheckpointError when the checkpoint lacks tensors this policy reads (checked when it is chosen)."""

    def attach(self, context: MemoryContext) -> None:
        """Bind to the arena this policy manages (once, before the first episode); checks the knobs too."""
        self.context = context

    def configure(self, knobs: MemoryKnobs) -> None:
        """Apply this policy's live knobs, already checked by ``check_knobs``."""

    @property
    def needs_layer_inputs(self) -> bool:
        """True when ``FrameTokens.layer_inputs`` / ``DecodedTokens.layer_inputs`` must be filled in."""
        return False

    def reserved_tokens(self) -> int:
        """Tokens beside the prompt the policy holds that no ``make_room`` can free (aura's memory token)."""
        return int(self.needs_prefix)

    def tokens_beside_frames(self) -> int:
        """Tokens a budget of F frames adds beside the F frames' tokens: what the policy holds that is no
        frame's (aura's memory token). A budget bounds everything else the policy holds."""
        return self.reserved_tokens()

    def reset(self) -> None:
        """A new episode: the arena holds only the pinned prompt again."""
        self.frames_seen = self.evictions = self.writes = 0

    def frame_prefix(self, embeddings: np.ndarray) -> np.ndarray | None:
        """Extra input embeddings [n, hidden] to prefill right before this frame's tokens (None: none)."""
        return None

    @abstractmethod
    def make_room(self, tokens: int) -> int:
        """Release slots until ``tokens`` more fit in the arena; return how many frames (dms: tokens) were evicted."""

    @abstractmethod
    def add_frame(self, frame: FrameTokens) -> None:
        """Take ownership of a frame that has just been prefilled."""

    def add_decoded(self, tokens: DecodedTokens) -> None:
        """Take ownership of decoded action tokens (only called when ``keeps_decoded``)."""
        raise NotImplementedError(f"{self.name} does not keep decoded tokens")

    @abstractmethod
    def frames_kept(self) -> int:
        """Frames whose tokens are in the cache now."""

    def state_bytes(self) -> int:
        return 0

    def tokens_seen(self) -> int:
        """Tokens that entered the memory this episode: each frame's, and the prefix token when there is one."""
        return self.frames_seen * (self._context().config.observation_tokens + int(self.needs_prefix))

    def diagnostics(self) -> dict[str, Any]:
        """Policy-specific figures for the reasoning node's diagnostics (dms: its compression)."""
        return {}

    def stats(self) -> MemoryStats:
        context = self._context()
        arena = context.arena
        held = float(arena.pages.held_per_head().mean()) - arena.pinned.size
        return MemoryStats(self.name, self.frames_seen, self.frames_kept(), arena.used, context.kv_bytes_held(),
                           self.state_bytes(), self.evictions, self.writes, self.tokens_seen(), held)

    def snapshot(self) -> dict[str, np.ndarray]:
        """The policy's own state as named arrays (the KV contents are the engine's to save)."""
        return {"counters": np.array([self.frames_seen, self.evictions, self.writes], dtype=np.int64)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Inverse of ``snapshot``; raises ValueError on state that does not fit this policy and engine."""
        counters = _array(state, "counters", np.int64, (3,))
        self.frames_seen, self.evictions, self.writes = (int(c) for c in counters)

    def _context(self) -> MemoryContext:
        if self.context is None:
            raise RuntimeError(f"{self.name} policy is not attached to an engine")
        return self.context


def _array(state: dict[str, np.ndarray], name: str, dtype: type, shape: tuple[int | None, ...]) -> np.ndarray:
    """``state[name]`` checked for dtype and shape (None: any size on that axis)."""
    if name not in state:
        raise ValueError(f"memory snapshot lacks {name!r}")
    value = np.asarray(state[name])
    if value.dtype != np.dtype(dtype) or value.ndim != len(shape) or any(
            want is not None and got != want for got, want in zip(value.shape, shape)):
        raise ValueError(f"memory snapshot {name!r} is {value.dtype}{list(value.shape)}, "
                         f"expected {np.dtype(dtype)}{[s if s is not None else '*' for s in shape]}")
    return value
