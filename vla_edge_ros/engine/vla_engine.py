"""The VLA engine: (pinned prompt, observation) -> a chunk of actions [H, dof], on a bounded KV arena.

The prompt is prefilled once and pinned at the front of the cache. Every ``step`` encodes one
observation and prefills its ``observation_tokens`` tokens (after any prefix its memory policy asks
for) after what is already cached, and decodes the action chunk (``model/action_head.py``: H = 1, or H
actions from the mlp head, or H x dof bins decoded in parallel). An observation is each of the checkpoint's
cameras' frame (``tokens_per_frame`` tokens each, the primary camera's first, then the others in their
configured order), then the robot's state as one token when the checkpoint reads one
(``model/state_token.py``); the engine calls that group a frame, and so do the memory policies.
Decoded action tokens are scratch: they leave the cache when the step ends, unless the policy keeps
them (dms decides on each). What else
the cache keeps is the memory policy's decision (``vla_edge_ros.memory``: fifo, cosine, aura, dms);
after evictions the kept tokens are re-positioned 0..n-1 in cache order by rotating their keys, so
positions stay below the arena capacity however long the episode runs.

A VL checkpoint (Qwen2-VL / Qwen2.5-VL) encodes each camera's frame with its vision tower into one image
segment, vision start, the merged visual tokens, vision end (``model/vl/frames.py``): ``tokens_per_frame``
is that segment's length, so every policy keeps or evicts whole observations as it does frames (dms per
head). The segments of one observation follow each other as transformers numbers consecutive images (each
from one past the highest id before it), and the state token is text-like after them.
The arena then keeps each token's M-RoPE ids beside its sequence position: new tokens get the ids
transformers' ``get_rope_index`` would give them at the end of the cached sequence (text-like tokens one
past the highest id, an image's tokens its base plus row and column), masking reads the sequence
positions, and re-numbering after evictions re-packs the ids as ``get_rope_index`` would number the
kept sequence (``arena.repack_rope_ids``), rotating each key by its group's one delta.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..memory.base import DecodedTokens, FrameTokens, MemoryPolicy, MemoryStats
from ..memory.context import MemoryContext, MemorySite
from ..memory.fifo import FifoPolicy
from ..model.action_head import ActionHead
from ..model.arena import KVArena, repack_rope_ids
from ..model.backend import ForwardResult
from ..model.backends import make_backend
from ..model.checkpoint import Checkpoint
from ..model.layout import arena_capacity, kv_bytes_per_token, scratch_tokens
from ..model.state_token import StateError, StateProjection
from ..model.vision import FrameEncoder, FrameError
from ..model.vl.frames import VlFrameEncoder, text_rope_ids
from ..model.vl.preprocess import ImageProcessing
from ..model.vl.tower import make_vision_tower
from ..numerics.finite import NonFiniteError, require_finite

PREFILL_CHUNK_TOKENS = 1024  # prompt tokens per forward pass: bounds the attention workspace


@dataclass
class EncodedFrame:
    """An observation's input embeddings, ready to prefill, and what encoding it took."""

    embeddings: np.ndarray  # [observation_tokens, hidden]
    encode_ms: float


@dataclass
class FramePrefill:
    """A frame now in memory: the last hidden state to decode the action from, and where it ends."""

    hidden: np.ndarray
    next_position: int
    evicted_frames: int
    encode_ms: float
    prefill_ms: float
    slots: np.ndarray  # arena slots of the frame's tokens
    next_rope_position: int | None = None  # M-RoPE id of the first decoded token (VL checkpoints only)


@dataclass
class StepResult:
    """One cycle's chunk of actions and where its time went."""

    chunk: np.ndarray  # [H, dof] in robot units, action i one control period after action i - 1
    tokens: list[int] = field(default_factory=list)
    encode_ms: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    evicted_frames: int = 0

    @property
    def action(self) -> np.ndarray:
        """The chunk's first action [dof]: the one meant for the observation's own time."""
        return self.chunk[0]

    @property
    def total_ms(self) -> float:
        return self.encode_ms + self.prefill_ms + self.decode_ms


class VlaEngine:
    """Owns the arena, the backend, the frame encoder and the action head."""

    def __init__(self, checkpoint: Checkpoint, *, kv_capacity_tokens: int, backend: str = "auto",
                 policy: MemoryPolicy | None = None, kv_page_tokens: int | None = None, kv_pool_pages: int = 0) -> None:
        config = checkpoint.config
        if not checkpoint.has_vla:
            raise ValueError(f"{checkpoint.path}: no vision weights; a VLA engine needs vision.* tensors")
        self.checkpoint = checkpoint
        self.config = config
        self.mrope = config.vl is not None
        self.tokens_per_frame = config.vision.tokens_per_frame  # one camera's
        self.observation_tokens = config.observation_tokens  # the unit the memory keeps
        scratch = scratch_tokens(config)
        if kv_capacity_tokens < arena_capacity(config, 1, 1):
            raise ValueError(f"kv_capacity_tokens={kv_capacity_tokens} cannot hold one frame "
                             f"({self.observation_tokens} tokens) plus {scratch} action tokens beside a prompt")
        self.arena = KVArena(kv_capacity_tokens, kv_page_tokens, kv_pool_pages,  # None, 0: the schema's defaults
                             mrope=self.mrope)
        self.policy = policy or FifoPolicy()
        self._use_layout()  # before the backend sizes its pool: a pool below the dense size is refused here
        self.kv_bytes_per_token = kv_bytes_per_token(config)
        self.backend = make_backend(backend, checkpoint, self.arena)
        self.memory = MemoryContext(checkpoint, self.arena, self.backend.read_kv, self.backend.name)
        self.encoder: FrameEncoder | VlFrameEncoder = (
            VlFrameEncoder(checkpoint, ImageProcessing.load(checkpoint.path), make_vision_tower(backend, checkpoint))
            if self.mrope else FrameEncoder.from_checkpoint(checkpoint))
        self.state_proj = StateProjection.from_checkpoint(checkpoint)  # None: the model reads no state
        weight = bias = None
        if config.action.head == "linear":
            weight, bias = checkpoint.float32("action_head.weight"), checkpoint.float32("action_head.bias")
        self.head = ActionHead(config.action, config.vocab_size, weight, bias)
        self._prompt_ids = np.empty(0, dtype=np.int32)
        self.scratch_tokens = scratch
        self.policy.attach(self.memory)

    @property
    def prompt_slots(self) -> np.ndarray:
        """Arena slots of the pinned prompt."""
        return self.arena.pinned

    def memory_site(self) -> MemorySite:
        """What memory knobs are checked against: this engine's model, arena size and prompt length."""
        return self.memory.site()

    def _use_layout(self) -> None:
        """Pages per KV head exactly when the policy evicts per KV head, else the dense layout (empties the arena)."""
        c = self.config
        self.arena.set_layout((c.num_hidden_layers, c.num_key_value_heads), self.policy.per_kv_head)

    def set_prompt(self, token_ids: list[int] | np.ndarray, cached: dict[str, np.ndarray] | None = None) -> None:
        """Start an episode: clear the cache and prefill (and pin) the instruction tokens.

        ``cached`` is the prompt's KV as ``prompt_kv`` returned it (from the KV store): it is placed
        into the arena instead of being recomputed. Long prompts prefill in chunks, which bounds the
        attention workspace at chunk x arena instead of prompt x arena.
        """
        ids = self._checked_prompt(token_ids, cached)
        self.arena.release(np.arange(self.arena.capacity))
        self._pin_prompt(ids, cached)
        self.policy.reset()

    def replace_prompt(self, token_ids: list[int] | np.ndarray, cached: dict[str, np.ndarray] | None = None) -> int:
        """Swap the pinned prompt for ``token_ids`` and keep the episode memory (``kv.on_instruction: keep``);
        returns how many frames (dms: tokens) the memory let go to make room for a longer prompt.

        The kept tokens move behind the new prompt, their keys rotated by the shift (exact for RoPE, and for
        M-RoPE as re-numbering is), and the new prompt is prefilled in front of them reading only itself,
        as a fresh prompt is. What the memory holds was computed under the old prompt: keeping it across
        an instruction is what keeping a memory means (``set_prompt`` starts afresh instead).
        """
        ids = self._checked_prompt(token_ids, cached)
        self.arena.release(self.arena.pinned)
        self.arena.pinned = np.empty(0, dtype=np.int32)
        evicted = self.policy.make_room(ids.size)
        self.compact_positions(first=ids.size)
        self._pin_prompt(ids, cached)
        return evicted

    def _checked_prompt(self, token_ids: list[int] | np.ndarray, cached: dict[str, np.ndarray] | None) -> np.ndarray:
        """``token_ids`` as the prompt's ids, once they leave room for a frame (and ``cached`` fits them)."""
        ids = np.asarray(token_ids, dtype=np.int32)
        reserved = self.policy.reserved_tokens()
        if arena_capacity(self.config, ids.size, 1, reserved) > self.arena.capacity:
            raise ValueError(f"prompt of {ids.size} tokens leaves no room for a frame in a "
                             f"{self.arena.capacity}-token arena ({self.policy.name} holds {reserved} more)")
        if cached is not None:
            self._check_prompt_kv(ids, cached)
        return ids

    def _pin_prompt(self, ids: np.ndarray, cached: dict[str, np.ndarray] | None) -> None:
        """Place the prompt at positions 0..n-1 and pin it: its stored KV, or a prefill in chunks."""
        self._prompt_ids = ids
        self.arena.pinned = self.arena.allocate(ids.size)
        if cached is not None:
            positions = np.arange(ids.size, dtype=np.int32)
            self.arena.commit(self.prompt_slots, positions, self._text_ids(0, ids.size))
            self.backend.write_kv(self.prompt_slots, cached["keys"], cached["values"])
            return
        for start in range(0, ids.size, PREFILL_CHUNK_TOKENS):
            chunk = slice(start, start + PREFILL_CHUNK_TOKENS)
            positions = np.arange(start, min(start + PREFILL_CHUNK_TOKENS, ids.size), dtype=np.int32)
            self.backend.forward(positions, self.prompt_slots[chunk], token_ids=ids[chunk],
                                 rope_positions=self._text_ids(start, positions.size))

    def _text_ids(self, first: int, count: int) -> np.ndarray | None:
        """M-RoPE ids of ``count`` text-like tokens from id ``first`` (None for a text decoder: 1-D RoPE)."""
        return text_rope_ids(first, count) if self.mrope else None

    @property
    def prompt_ids(self) -> np.ndarray:
        return self._prompt_ids.copy()

    def prompt_kv(self) -> dict[str, np.ndarray]:
        """The pinned prompt's token ids, positions, keys and values: what the KV store keeps of it."""
        keys, values = self.backend.read_kv(self.prompt_slots)
        return {"token_ids": self._prompt_ids.copy(), "positions": self.arena.positions[self.prompt_slots].copy(),
                "keys": keys, "values": values}

    def _check_prompt_kv(self, ids: np.ndarray, cached: dict[str, np.ndarray]) -> None:
        c = self.config
        expected = (c.num_hidden_layers, c.num_key_value_heads, ids.size, c.head_dim)
        try:
            same = (np.array_equal(cached["token_ids"], ids) and cached["keys"].shape == expected
                    and cached["values"].shape == expected
                    and np.array_equal(cached["positions"], np.arange(ids.size)))
        except KeyError as exc:
            raise ValueError(f"cached prompt KV lacks {exc}") from None
        if not same:
            raise ValueError(f"cached prompt KV does not match this prompt and model (expected keys {list(expected)})")

    def set_policy(self, policy: MemoryPolicy) -> None:
        """Install another memory policy; an episode boundary: the cache restarts from the pinned prompt."""
        self.memory.site().check_pool(policy.name, policy.per_kv_head)
        policy.attach(self.memory)
        self.policy = policy
        self._use_layout()
        self.set_prompt(self._prompt_ids)

    def memory_stats(self) -> MemoryStats:
        return self.policy.stats()

    def memory_state(self) -> dict[str, np.ndarray]:
        """Everything the cache holds of this episode, as named arrays: the prompt, every kept token's slot and
        position, what each (layer, KV head) holds (``entry_counts`` [layers, kv_heads], then ``entry_slots``,
        ``keys`` and ``values`` [entries, head_dim], head by head in the order the head holds them), and the
        policy's own state (``policy.*``). A VL checkpoint's also holds the tokens' M-RoPE ids
        (``rope_positions`` [3, n]) and its ``tokens_per_frame``, which the pixel cap sets."""
        slots = np.flatnonzero(self.arena.valid).astype(np.int32)
        counts, rows = self.arena.pages.held()
        keys, values = self.backend.read_rows(rows)
        state = {f"policy.{name}": value for name, value in self.policy.snapshot().items()}
        state.update({
            "policy_name": np.frombuffer(self.policy.name.encode(), dtype=np.uint8).copy(),
            "prompt_ids": self._prompt_ids.copy(), "prompt_slots": self.prompt_slots.copy(),
            "slots": slots, "positions": self.arena.positions[slots].copy(), "entry_counts": counts,
            "entry_slots": self.arena.pages.entry_slot.reshape(-1)[rows].copy(), "keys": keys, "values": values,
        })
        if self.arena.rope_positions is not None:
            state["rope_positions"] = self.arena.rope_positions[:, slots].copy()
            state["tokens_per_frame"] = np.array([self.tokens_per_frame], dtype=np.int64)
        return state

    def load_memory_state(self, state: dict[str, np.ndarray]) -> None:
        """Make the cache and policy exactly what ``memory_state`` saw; ValueError if it does not fit."""
        name = bytes(np.asarray(state.get("policy_name", b""), dtype=np.uint8)).decode(errors="replace")
        if name != self.policy.name:
            raise ValueError(f"memory state is of policy {name!r}, this engine runs {self.policy.name!r}")
        c = self.config
        slots = np.asarray(state["slots"], dtype=np.int32)
        entry_slots = np.asarray(state["entry_slots"], dtype=np.int32)
        expected = (entry_slots.size, c.head_dim)
        if (state["keys"].shape != expected or state["values"].shape != expected
                or state["positions"].shape != slots.shape
                or state["entry_counts"].shape != (c.num_hidden_layers, c.num_key_value_heads)
                or (slots.size and (slots.min() < 0 or slots.max() >= self.arena.capacity))):
            raise ValueError(f"memory state does not fit this engine: keys {list(state['keys'].shape)} of "
                             f"{list(np.shape(state['entry_counts']))} heads, expected {list(expected)} of "
                             f"{[c.num_hidden_layers, c.num_key_value_heads]} in a {self.arena.capacity}-slot arena")
        rope = None
        if self.mrope:
            rope = np.asarray(state.get("rope_positions", np.empty(0)), dtype=np.int32)
            if rope.shape != (3, slots.size):
                raise ValueError(f"memory state lacks the M-RoPE ids of a VL checkpoint's {slots.size} tokens "
                                 f"(rope_positions {list(rope.shape)}, expected {[3, slots.size]})")
            frame = np.asarray(state.get("tokens_per_frame", [-1])).reshape(-1)
            if frame.tolist() != [self.tokens_per_frame]:
                raise ValueError(f"memory state holds frames of {frame.tolist()} tokens, this engine's are "
                                 f"{self.tokens_per_frame} (reasoning.vision_max_pixels differs)")
        self.arena.release(np.arange(self.arena.capacity, dtype=np.int32))
        self.arena.restore_entries(slots, np.asarray(state["positions"], dtype=np.int32), state["entry_counts"],
                                   entry_slots, rope)
        _, rows = self.arena.pages.held()  # in the order the state lists them
        self.backend.write_rows(rows, state["keys"], state["values"])
        self._prompt_ids = np.asarray(state["prompt_ids"], dtype=np.int32).copy()
        self.arena.pinned = np.asarray(state["prompt_slots"], dtype=np.int32).copy()
        self.policy.restore({key[len("policy."):]: value for key, value in state.items() if key.startswith("policy.")})

    def warm_up(self) -> str:
        """Run one cycle on a blank frame, then restore the episode's start; returns why its output was not
        finite ("" when it was), which says the model will give no action.

        The first cycle pays one-off costs (BLAS and OpenCV initialisation, first-touch of every
        buffer, kernel compilation on the GPU) that are many times a normal cycle; a robot should
        pay them at load, not in its first control period.
        """
        size = self.config.vision.image_size
        blank = np.zeros((size, size, 3), dtype=np.uint8)
        prompt = self.prompt_kv()
        try:  # a state at the checkpoint's mean: this cycle's action is thrown away with its memory
            state = None if self.state_proj is None else self.state_proj.mean
            self.step(blank, (blank,) * (self.config.cameras - 1), state)
            invalid = ""
        except NonFiniteError as exc:
            invalid = str(exc)
        self.set_prompt(prompt["token_ids"], cached=prompt)
        return invalid

    def compact_positions(self, first: int = 0) -> None:
        """Re-position the cached tokens to first..first+n-1 in their current order, rotating their keys (a VL
        checkpoint's by the delta that re-packs their M-RoPE ids from ``first``; see the module doc)."""
        slots = self.arena.slots_in_order()
        targets = np.arange(first, first + slots.size, dtype=np.int32)
        if self.arena.rope_positions is None:
            shifts = targets - self.arena.positions[slots]
        else:
            old = self.arena.rope_positions[:, slots]
            new = repack_rope_ids(old) + first  # one shift of all three ids: a 1-D rotation, still exact
            shifts = new[0] - old[0]
            self.arena.rope_positions[:, slots] = new
        moving = shifts != 0
        if moving.any():
            self.backend.rotate_keys(slots[moving], shifts[moving])
        self.arena.positions[slots] = targets

    def encode_frame(self, image: np.ndarray, extra_images: tuple[np.ndarray, ...] = (),
                     state: np.ndarray | None = None) -> EncodedFrame:
        """An observation's ``observation_tokens`` input embeddings (a VL checkpoint: its vision tower's block):
        ``image`` (the primary camera), then ``extra_images`` in order, then ``state``'s token. FrameError or
        StateError when the observation is not the checkpoint's (a camera too few or many, a state missing,
        unexpected, misshapen or not finite): nothing is ever filled in."""
        cameras = self.config.cameras
        if 1 + len(extra_images) != cameras:
            raise FrameError(f"the model sees {cameras} camera{'s' if cameras > 1 else ''} per observation, "
                             f"got {1 + len(extra_images)} frames")
        if self.state_proj is None and state is not None:
            raise StateError("the model reads no robot state, and one was given")
        t0 = time.perf_counter()
        parts = [self.encoder.encode(frame) for frame in (image, *extra_images)]
        if self.state_proj is not None:
            parts.append(self.state_proj.token(state))
        embeddings = parts[0] if len(parts) == 1 else np.concatenate(parts).astype(np.float32, copy=False)
        return EncodedFrame(embeddings, (time.perf_counter() - t0) * 1e3)

    def prefill_frame(self, frame: EncodedFrame) -> FramePrefill:
        """Prefill an encoded frame (after any prefix its policy asks for), making room first."""
        t1 = time.perf_counter()
        embeddings = frame.embeddings
        prefix = self.policy.frame_prefix(embeddings)
        inputs = embeddings if prefix is None else np.concatenate([prefix, embeddings]).astype(np.float32)
        count = inputs.shape[0]
        evicted = self.policy.make_room(count + self.scratch_tokens)
        if evicted or self.arena.next_position() + count + self.scratch_tokens > self.arena.capacity:
            self.compact_positions()
        slots = self.arena.allocate(count)
        start = self.arena.next_position()
        positions = np.arange(start, start + count, dtype=np.int32)
        n_prefix = count - self.observation_tokens
        rope = None
        if self.mrope:
            first = self.arena.next_rope_position()
            rope = np.concatenate([text_rope_ids(first, n_prefix), self._observation_rope_ids(first + n_prefix)],
                                  axis=1)
        out = self.backend.forward(positions, slots, embeddings=inputs, collect_layers=self.policy.needs_layer_inputs,
                                   rope_positions=rope)
        self.policy.add_frame(FrameTokens(slots[n_prefix:], positions[n_prefix:], embeddings, slots[:n_prefix],
                                          _layer_inputs(out, n_prefix), out.hidden[-1]))
        t2 = time.perf_counter()
        return FramePrefill(out.hidden[-1], int(positions[-1]) + 1, evicted, frame.encode_ms, (t2 - t1) * 1e3,
                            slots[n_prefix:], None if rope is None else int(rope.max()) + 1)

    def _observation_rope_ids(self, first: int) -> np.ndarray:
        """M-RoPE ids [3, observation_tokens] from id ``first``: each camera's segment from one past the highest id
        before it, as ``get_rope_index`` numbers consecutive images, then the state token as text."""
        parts = []
        for _ in range(self.config.cameras):
            parts.append(self.encoder.rope_ids(first))
            first = int(parts[-1].max()) + 1
        if self.state_proj is not None:
            parts.append(text_rope_ids(first, 1))
        return np.concatenate(parts, axis=1)

    def add_frame(self, image: np.ndarray, extra_images: tuple[np.ndarray, ...] = (),
                  state: np.ndarray | None = None) -> FramePrefill:
        """Encode one observation and prefill it: ``encode_frame`` then ``prefill_frame``."""
        return self.prefill_frame(self.encode_frame(image, extra_images, state))

    def decode_action(self, prefill: FramePrefill, admit: Callable[[], object] = lambda: True,
                      done: Callable[[object], None] = lambda ticket: None) -> tuple[np.ndarray, list[int]] | None:
        """The chunk of actions [H, dof] for a prefilled frame and the tokens decoded for it, or None if ``admit``
        refused a decode step. The continuous heads (``linear``, ``mlp``) read the frame's last hidden state and
        decode no token; ``bins`` decodes one token per dof (H = 1).

        ``admit`` is asked before each decode step (a falsy answer abandons the action, leaving the
        frame in memory) and ``done`` is given its answer after the step, however the step ended: the
        admission gate's hooks. A hidden state or logits holding NaN or Inf raise NonFiniteError: no
        action comes of them (``numerics/finite.py``).
        """
        require_finite(prefill.hidden, "the frame's last hidden state")
        if self.config.action.head == "linear":
            return self.head.from_hidden(prefill.hidden), []
        if self.config.action.head == "mlp":
            return self.head.from_preactivation(self.backend.action_mlp(prefill.hidden)), []
        if self.config.action.chunk > 1:
            return self._decode_parallel(prefill, admit, done)
        head, dof, policy = self.head, self.config.action.dof, self.policy
        bins = [self.backend.greedy(prefill.hidden, head.bin_rows)]
        scratch = self.arena.allocate(dof - 1)
        handed = 0  # scratch slots now owned by a policy that keeps decoded tokens
        try:
            for i in range(dof - 1):
                ticket = admit()
                if not ticket:
                    return None
                try:
                    token = np.array([head.first_bin_token + bins[-1]], dtype=np.int32)
                    position = np.array([prefill.next_position + i], dtype=np.int32)
                    rope = (None if prefill.next_rope_position is None
                            else text_rope_ids(prefill.next_rope_position + i, 1))
                    out = self.backend.forward(position, scratch[i:i + 1], token_ids=token, rope_positions=rope,
                                               collect_layers=policy.keeps_decoded and policy.needs_layer_inputs)
                    if policy.keeps_decoded:
                        policy.add_decoded(DecodedTokens(scratch[i:i + 1], position, _layer_inputs(out, 0)))
                        handed = i + 1
                    bins.append(self.backend.greedy(out.hidden[-1], head.bin_rows))
                finally:
                    done(ticket)
        finally:
            self.arena.release(scratch[handed:])
        return head.from_bins(bins), [head.first_bin_token + b for b in bins]

    def _decode_parallel(self, prefill: FramePrefill, admit: Callable[[], object],
                         done: Callable[[object], None]) -> tuple[np.ndarray, list[int]] | None:
        """A bins chunk in one admitted forward pass (``model/action_head.py``): H x dof zero embeddings at the
        positions after the frame, each one's bin the argmax of its logits over the bins. The placeholders are
        scratch: they leave the cache when the pass ends, whatever the policy (they hold no observation)."""
        head, count = self.head, self.config.action.chunk * self.config.action.dof
        scratch = self.arena.allocate(count)
        try:
            ticket = admit()
            if not ticket:
                return None
            try:
                positions = prefill.next_position + np.arange(count, dtype=np.int32)
                rope = (None if prefill.next_rope_position is None
                        else text_rope_ids(prefill.next_rope_position, count))
                out = self.backend.forward(positions, scratch, rope_positions=rope,
                                           embeddings=np.zeros((count, self.config.hidden_size), dtype=np.float32))
                logits = require_finite(self.backend.logits(out.hidden, head.bin_rows), "the action logits")
            finally:
                done(ticket)
        finally:
            self.arena.release(scratch)
        bins = np.argmax(logits, axis=1)
        return head.from_bins(bins), [head.first_bin_token + int(b) for b in bins]

    def step(self, image: np.ndarray, extra_images: tuple[np.ndarray, ...] = (),
             state: np.ndarray | None = None) -> StepResult:
        """Encode one observation, add it to the memory, and decode its chunk (no admission control)."""
        prefill = self.add_frame(image, extra_images, state)
        t0 = time.perf_counter()
        chunk, tokens = self.decode_action(prefill)
        decode_ms = (time.perf_counter() - t0) * 1e3
        return StepResult(chunk, tokens, prefill.encode_ms, prefill.prefill_ms, decode_ms, prefill.evicted_frames)


def _layer_inputs(out: ForwardResult, skip: int) -> list[np.ndarray] | None:
    """Each layer's input hidden states from a forward that collected them, without the first ``skip`` tokens."""
    if out.layer_hidden is None:
        return None
    return [hidden[skip:] for hidden in out.layer_hidden[:-1]]
