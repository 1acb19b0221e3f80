"""``dms``: Dynamic Memory Sparsification-style delayed eviction, decided per token and KV head.

After Łańcucki et al. 2025, "Inference-Time Hyper-Scaling with KV Cache Compression". Every token
that enters the cache (each frame token, and each decoded action token) gets a keep/evict decision
per (layer, KV head): its keep score there (``dms_scores``: the checkpoint's learned gate, or key
novelty) above the threshold (``dms_threshold``: fixed, or driven by ``target_ratio``) means keep.

Delayed eviction. A decision is enforced only once its token has left the window of the newest
``window`` tokens, so until then every head still reads it: the model gets to use a token for a
while before it goes, instead of losing it the moment it is judged. Exactly: after every forward
pass (a frame's prefill, or one decoded token) the pending tokens older than the newest ``window``
are enforced, so a token is read by every token whose forward starts while fewer than ``window``
tokens have arrived after it, and by none later unless a head keeps it. The pinned prompt is never
judged and never evicted.

Per-head memory. The arena runs its per-head page layout (``model/pages.py``, after the paged cache of
NVIDIA's DMS inference code and vLLM's paged attention): every (layer, KV head) has its own block table
and length over one pool of fixed-size pages. A head that evicts a token drops its entry at once: the
head's last entry moves into the hole, and a page the head no longer needs goes back to the pool, so
each head holds ceil(tokens it reads / page size) pages and attention (the NumPy path and the CUDA
kernel alike) reads only those. A token's slot (its position) is released when the last head has
dropped it. ``compression()`` reports tokens seen / tokens a head keeps (DMS's ratio: what each head
reads), tokens seen / slots held, and the bytes the pages hold against a dense cache of every token seen.

When the arena lacks room for the next frame, tokens are forced out whole, every head at once: the
held token outside the window whose best keep score, over the heads still reading it, is lowest goes
first; ties go to the older.

Positions. A token has one position, shared by every layer and KV head of its slot; a head that
evicted a token just does not read that position, so the distances between the tokens a head
reads stay what they were when they were written. The engine re-numbers the held slots in cache
order (prompt first) when the next frame would reach the arena capacity, as for every policy, so
no position ever reaches the capacity in an episode that never resets.

Decoded action tokens enter the memory like frame tokens (decisions per head, the same window) and
stay while a head keeps them, so the robot can remember what it did; the other policies drop them
at the end of the step. ``writes`` and ``evictions`` count tokens, not frames.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..config import DmsKnobs, MemoryKnobs
from ..model.layout import scratch_tokens
from ..model.memory_tensors import has_dms_gate
from .base import DecodedTokens, FrameTokens, MemoryPolicy, _array
from .context import MemoryContext, MemorySite
from .dms_scores import KeyNovelty, LearnedGate
from .dms_threshold import KeepThreshold


@dataclass(frozen=True)
class DmsCompression:
    """How much dms has compressed this episode (the pinned prompt is not counted anywhere)."""

    tokens_seen: int  # tokens that entered the memory (frame and decoded tokens)
    held_per_head: np.ndarray  # [layers, kv_heads] tokens each head reads now, window included
    slots_held: int  # tokens at least one head still reads: what the arena holds
    pages_per_head: np.ndarray  # [layers, kv_heads] pages each head holds, the pinned prompt's entries included
    page_tokens: int  # entries per page
    prompt_tokens: int  # the pinned prompt's entries in every head (not counted as held)
    decided: int  # tokens whose decisions were enforced (they left the window)
    kept_per_head: np.ndarray  # [layers, kv_heads] of those, how many each head decided to keep
    forced_evictions: int  # tokens forced out of every head for room
    threshold: float  # the threshold that decided the newest tokens

    @property
    def ratio_per_head(self) -> np.ndarray:
        """Tokens seen / tokens the head keeps (inf for a head that keeps none)."""
        with np.errstate(divide="ignore"):
            return self.tokens_seen / self.held_per_head.astype(np.float64)

    @property
    def ratio(self) -> float:
        """Tokens seen / tokens kept, pooled over every (layer, KV head): the compression of what heads read."""
        held = int(self.held_per_head.sum())
        return self.tokens_seen * self.held_per_head.size / held if held else float("inf")

    @property
    def decision_ratio(self) -> float:
        """Tokens decided / keep decisions, pooled over heads: the compression the threshold asked for,
        without the window's share."""
        kept = int(self.kept_per_head.sum())
        return self.decided * self.kept_per_head.size / kept if kept else float("inf")

    @property
    def slot_ratio(self) -> float:
        """Tokens seen / slots held: distinct tokens some head still reads."""
        return self.tokens_seen / self.slots_held if self.slots_held else float("inf")

    @property
    def byte_ratio_per_layer(self) -> np.ndarray:
        """[layers] bytes a dense cache of every token seen would take / bytes the layer's pages hold, the
        prompt's share taken out of both (pages are whole: a head's unfilled last page counts as held)."""
        heads = self.pages_per_head.shape[1]
        held = self.pages_per_head.sum(axis=1) * self.page_tokens - self.prompt_tokens * heads
        with np.errstate(divide="ignore"):
            return self.tokens_seen * heads / held.astype(np.float64)

    @property
    def byte_ratio(self) -> float:
        """Bytes of a dense cache of every token seen / bytes of KV the pages hold, pooled over layers and heads:
        the memory dms actually frees, to compare with ``ratio``."""
        held = int(self.pages_per_head.sum()) * self.page_tokens - self.prompt_tokens * self.pages_per_head.size
        return self.tokens_seen * self.pages_per_head.size / held if held else float("inf")


class DmsPolicy(MemoryPolicy):
    name = "dms"
    per_kv_head = True
    keeps_decoded = True

    def __init__(self, knobs: DmsKnobs) -> None:
        super().__init__()
        self.knobs = knobs
        self.source: LearnedGate | KeyNovelty | None = None
        self.limits: KeepThreshold | None = None

    @property
    def window(self) -> int:
        return self.knobs.window

    @classmethod
    def check_knobs(cls, knobs: DmsKnobs, site: MemorySite) -> None:
        limit = site.free_tokens()
        c = site.config
        if knobs.window > limit:
            if limit < 1:  # not even a one-token window fits beside one frame: the arena is what is too small
                raise site.too_small(knobs.window, "kv.dms.window")
            raise ValueError(f"kv.dms.window={knobs.window} must be in [1, {limit}]: the {site.capacity}-slot arena "
                             f"holds the prompt ({site.prompt_tokens}), the window, one frame "
                             f"({c.observation_tokens}) and the action tokens ({scratch_tokens(c)}) (or "
                             f"kv_capacity_tokens at least {site.least_capacity(knobs.window)})")
        least = site.pages_per_head(site.least_capacity(knobs.window))
        if site.pool_pages and site.pool_pages < least:
            raise ValueError(f"kv_pool_pages={site.pool_pages} must be at least {least}: every (layer, KV head) holds "
                             f"the prompt ({site.prompt_tokens}), the window ({knobs.window}), one frame "
                             f"({c.observation_tokens}) and the action tokens ({scratch_tokens(c)}) in pages of "
                             f"{site.page_tokens}")

    @classmethod
    def check_tensors(cls, site: MemorySite) -> None:
        has_dms_gate(site.checkpoint)  # an incomplete or misshapen gate is an error even if unused

    @property
    def needs_layer_inputs(self) -> bool:
        return self.source is not None and self.source.needs_layer_inputs

    def reserved_tokens(self) -> int:
        return self.window  # the window is never evicted, so it can never make room

    def tokens_beside_frames(self) -> int:
        return 0  # the window holds frame (and action) tokens: a budget of F frames includes it

    def configure(self, knobs: MemoryKnobs) -> None:
        live = knobs.dms
        self.knobs = replace(self.knobs, threshold=live.threshold, target_ratio=live.target_ratio)
        if self.limits is not None:
            self.limits.configure(live.threshold, live.target_ratio)

    def attach(self, context: MemoryContext) -> None:
        super().attach(context)
        self.check_knobs(self.knobs, context.site())
        c, arena = context.config, context.arena
        gated = self.knobs.use_learned_gate and has_dms_gate(context.checkpoint)
        self.source = LearnedGate(context.checkpoint) if gated else KeyNovelty(context, self.window)
        layers, heads = c.num_hidden_layers, c.num_key_value_heads
        self.limits = KeepThreshold(layers, heads, threshold=self.knobs.threshold, target_ratio=self.knobs.target_ratio)
        self._slot_score = np.full((layers, heads, arena.capacity), -np.inf, dtype=np.float32)
        self._slot_frame = np.full(arena.capacity, -1, dtype=np.int64)
        self._clear()

    def _clear(self) -> None:
        heads = self._slot_score.shape[:2]
        self._pending_slots = np.empty(0, dtype=np.int32)  # tokens inside the window, oldest first
        self._pending_keep = np.empty((0, *heads), dtype=bool)  # their decisions, [n, layers, kv_heads]
        self._kept_decisions = np.zeros(heads, dtype=np.int64)
        self._decided = self._forced = 0

    def reset(self) -> None:
        super().reset()
        self._clear()
        self._slot_score.fill(-np.inf)
        self._slot_frame.fill(-1)
        self._limits().reset()
        self._source().reset(self._context())

    def _source(self) -> LearnedGate | KeyNovelty:
        if self.source is None:
            raise RuntimeError("dms policy is not attached to an engine")
        return self.source

    def _limits(self) -> KeepThreshold:
        if self.limits is None:
            raise RuntimeError("dms policy is not attached to an engine")
        return self.limits

    def make_room(self, tokens: int) -> int:
        """Force out whole tokens (see the module doc) until ``tokens`` slots are free and every (layer, KV head)
        has pages for ``tokens`` more entries (a pool smaller than the dense size runs short); returns how many."""
        arena = self._context().arena
        need = tokens - (arena.capacity - arena.used)
        if need <= 0 and not arena.pages.pages_short(tokens):
            return 0
        evictable = arena.valid.copy()
        evictable[arena.pinned] = evictable[self._pending_slots] = False
        candidates = np.flatnonzero(evictable).astype(np.int32)
        reading = arena.holds(candidates)
        best = np.where(reading, self._slot_score[:, :, candidates], -np.inf).max(axis=(0, 1))
        order = candidates[np.lexsort((arena.positions[candidates], best))]
        forced = max(need, 0)
        if order.size < forced:
            raise RuntimeError(f"dms: {tokens} tokens do not fit beside the prompt and the {self.window}-token window")
        arena.release(order[:forced])
        while arena.pages.pages_short(tokens):  # a page comes back only when a head's length crosses a page
            if forced == order.size:
                raise RuntimeError(f"dms: {tokens} tokens do not fit the KV pool beside the prompt and the window")
            arena.release(order[forced:forced + 1])
            forced += 1
        self._forced += forced
        self.evictions += forced
        return forced

    def add_frame(self, frame: FrameTokens) -> None:
        self.frames_seen += 1
        scores = self._source().scores(self._context(), frame.slots, frame.layer_inputs)
        self.admit(frame.slots, scores, frame=self.frames_seen - 1)

    def add_decoded(self, tokens: DecodedTokens) -> None:
        scores = self._source().scores(self._context(), tokens.slots, tokens.layer_inputs)
        self.admit(tokens.slots, scores, frame=-1)

    def admit(self, slots: np.ndarray, scores: np.ndarray, *, frame: int) -> None:
        """Decide new tokens in ``slots`` from their keep scores [T, layers, kv_heads]; enforce what left the window.

        ``frame`` is the index of the frame they belong to this episode (-1: decoded tokens).
        """
        slots = np.asarray(slots, dtype=np.int32)
        keep = scores > self._limits().update(scores)
        self._slot_score[:, :, slots] = scores.transpose(1, 2, 0)
        self._slot_frame[slots] = frame
        self._pending_slots = np.concatenate([self._pending_slots, slots])
        self._pending_keep = np.concatenate([self._pending_keep, keep])
        self.writes += slots.size
        excess = self._pending_slots.size - self.window
        if excess > 0:
            self._enforce(excess)

    def _enforce(self, count: int) -> None:
        """Apply the decisions of the ``count`` oldest pending tokens: each head that did not keep one stops reading it."""
        slots, keep = self._pending_slots[:count], self._pending_keep[:count]
        self._pending_slots, self._pending_keep = self._pending_slots[count:], self._pending_keep[count:]
        freed = self._context().arena.hide(slots, ~keep.transpose(1, 2, 0))
        self.evictions += freed.size
        self._decided += count
        self._kept_decisions += keep.sum(axis=0)

    def pending_slots(self) -> np.ndarray:
        """Slots of the tokens inside the window, oldest first: every head still reads them."""
        return self._pending_slots.copy()

    def entries_of_frame(self, frame: int) -> np.ndarray:
        """[layers, kv_heads] how many tokens of this episode's frame number ``frame`` (0: the first)
        each head still reads."""
        return self._context().arena.holds(self.slots_of_frame(frame)).sum(axis=-1)

    def slots_of_frame(self, frame: int) -> np.ndarray:
        """Slots that still hold tokens of frame number ``frame`` (slot numbers are reused after evictions)."""
        return np.flatnonzero((self._slot_frame == frame) & self._context().arena.valid).astype(np.int32)

    def frames_held(self) -> np.ndarray:
        """Frame numbers of this episode with a token some (layer, KV head) still reads, ascending."""
        frames = self._slot_frame[self._context().arena.valid]
        return np.unique(frames[frames >= 0])

    def frames_kept(self) -> int:
        return int(self.frames_held().size)

    def tokens_seen(self) -> int:
        return self.writes  # frame and decoded tokens alike

    def compression(self) -> DmsCompression:
        arena = self._context().arena
        prompt = arena.pinned.size
        return DmsCompression(
            tokens_seen=self.writes, held_per_head=arena.pages.held_per_head() - prompt,
            slots_held=arena.used - prompt, pages_per_head=arena.pages.pages_per_head(),
            page_tokens=arena.page_tokens, prompt_tokens=prompt, decided=self._decided,
            kept_per_head=self._kept_decisions.copy(), forced_evictions=self._forced, threshold=self._limits().current)

    def diagnostics(self) -> dict[str, Any]:
        report = self.compression()
        return {"dms_compression": report.ratio, "dms_byte_compression": report.byte_ratio,
                "dms_slot_compression": report.slot_ratio, "dms_threshold": report.threshold,
                "dms_forced_evictions": report.forced_evictions}

    def snapshot(self) -> dict[str, np.ndarray]:
        state = super().snapshot()
        state.update(self._limits().snapshot())
        state.update(self._source().snapshot())
        state.update(slot_scores=self._slot_score.copy(), slot_frames=self._slot_frame.copy(), pending_slots=self._pending_slots.copy(),
                     pending_keep=self._pending_keep.astype(np.uint8), kept_decisions=self._kept_decisions.copy(),
                     dms_counters=np.array([self._decided, self._forced], dtype=np.int64))
        return state

    def restore(self, state: dict[str, np.ndarray]) -> None:
        context = self._context()
        arena = context.arena
        heads, capacity = self._slot_score.shape[:2], arena.capacity
        pending = _array(state, "pending_slots", np.int32, (None,))
        if pending.size > self.window:
            raise ValueError(f"memory snapshot's window ({pending.size} tokens) does not fit kv.dms.window={self.window}")
        if not arena.valid[pending].all() or not arena.holds(pending).all():
            raise ValueError("memory snapshot's window is not held by every head of the restored cache")
        super().restore(state)
        self._slot_score = _array(state, "slot_scores", np.float32, (*heads, capacity)).copy()
        self._slot_frame = _array(state, "slot_frames", np.int64, (capacity,)).copy()
        self._pending_slots = pending.copy()
        self._pending_keep = _array(state, "pending_keep", np.uint8, (pending.size, *heads)) != 0
        self._kept_decisions = _array(state, "kept_decisions", np.int64, heads).copy()
        self._decided, self._forced = (int(x) for x in _array(state, "dms_counters", np.int64, (2,)))
        self._limits().restore(state)
        self._source().restore(state, context)
