"""What a compute backend provides to the engine; ``numpy`` and ``cuda`` implement it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from .arena import KVArena
from .checkpoint import Checkpoint


@dataclass
class ForwardResult:
    """Final-norm hidden states [T, H] (host, fp32) and, when asked, every layer's input/output."""

    hidden: np.ndarray
    layer_hidden: list[np.ndarray] | None = None  # embeddings, then the output of each layer (pre final norm)


class Backend(ABC):
    """A Qwen2 decoder that reads and writes a slot-based KV arena, storing its pages' rows."""

    name: str

    def __init__(self, checkpoint: Checkpoint, arena: KVArena) -> None:
        self.config = checkpoint.config
        self.mrope_section: tuple[int, ...] = self.config.vl.mrope_section if self.config.vl else ()
        self.arena = arena
        heads = (self.config.num_hidden_layers, self.config.num_key_value_heads)
        if arena.pages.heads != heads:
            arena.set_layout(heads, arena.per_head)  # the model's heads, in the layout the arena has
        arena.move_rows = self.move_rows

    @abstractmethod
    def forward(self, positions: np.ndarray, slots: np.ndarray, *, token_ids: np.ndarray | None = None,
                embeddings: np.ndarray | None = None, collect_layers: bool = False,
                rope_positions: np.ndarray | None = None) -> ForwardResult:
        """Run T new tokens (ids or [T, H] embeddings) at ``positions``, storing their K/V in ``slots``.

        Each new token attends to every valid slot whose position is not after its own, which
        includes the earlier new tokens: one rule for prefill, decode and a cache with holes.
        ``rope_positions`` [3, T] are a VL model's M-RoPE ids (``vl/positions.rope_index``): the rotation
        then uses them, banded by ``mrope_section``, while masking stays on ``positions`` (the order in
        the arena). None rotates by ``positions``, the 1-D RoPE of a text decoder.
        """

    @abstractmethod
    def logits(self, hidden: np.ndarray, rows: slice = slice(None)) -> np.ndarray:
        """lm_head applied to final-norm hidden [T, H], restricted to vocabulary ``rows``."""

    @abstractmethod
    def greedy(self, hidden: np.ndarray, rows: slice = slice(None)) -> int:
        """Index (within ``rows``) of the highest logit for one final-norm hidden state [H]; NonFiniteError
        (``numerics/finite.py``) when any of those logits is NaN or Inf, since no token can be chosen then."""

    @abstractmethod
    def action_mlp(self, hidden: np.ndarray) -> np.ndarray:
        """The ``mlp`` action head before its tanh, fc2 GELU(fc1 h + b1) + b2 [chunk * dof] (fp32, host), for
        one final-norm hidden state [H] (``model/action_head.py``); ValueError on a checkpoint without one."""

    @abstractmethod
    def rotate_keys(self, slots: np.ndarray, shifts: np.ndarray) -> None:
        """Rotate the cached keys of ``slots`` in every layer by ``shifts`` positions (RoPE composes).

        This is exact under M-RoPE too, for a shift of all three ids alike: frequency i of a key at ids
        (t, h, w) was turned by ``id(i) * inv_freq[i]``, ``id(i)`` the t, h or w its ``mrope_section`` band
        reads. Adding ``delta`` to all three adds ``delta * inv_freq[i]`` to every frequency whatever its
        band, which is the 1-D rotation by ``delta``: the key lands at (t + delta, h + delta, w + delta),
        and the KV arena re-positions VL tokens as it does text.
        """

    @abstractmethod
    def read_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Host copies [n, head_dim] of the keys and values in pool rows ``rows``."""

    @abstractmethod
    def write_rows(self, rows: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
        """Store keys and values [n, head_dim] into pool rows ``rows``."""

    @abstractmethod
    def move_rows(self, sources: np.ndarray, destinations: np.ndarray) -> None:
        """Copy pool rows ``sources`` onto ``destinations`` (disjoint): the arena's compaction."""

    def read_kv(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the cached keys and values of ``slots``, each [layers, kv_heads, n, head_dim];
        every head must hold every slot (the prompt, tokens inside the dms window)."""
        rows = self._held_rows(slots)
        keys, values = self.read_rows(rows.reshape(-1))
        return keys.reshape(*rows.shape, -1), values.reshape(*rows.shape, -1)

    def write_kv(self, slots: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
        """Store keys and values [layers, kv_heads, n, head_dim] (as ``read_kv`` returns them) into ``slots``."""
        rows = self._held_rows(slots).reshape(-1)
        self.write_rows(rows, keys.reshape(rows.size, -1), values.reshape(rows.size, -1))

    def _held_rows(self, slots: np.ndarray) -> np.ndarray:
        rows = self.arena.pages.rows(slots)
        if (rows < 0).any():
            raise ValueError("read_kv/write_kv: a head does not hold one of these slots")
        return rows

    @abstractmethod
    def state_bytes(self) -> tuple[int, int]:
        """(weight bytes, KV arena bytes) this backend holds: the decoder's, and the mlp action head's if any."""

    def _no_mlp_head(self) -> ValueError:
        return ValueError(f"this checkpoint's action head is {self.config.action.head!r}, not 'mlp'")

    def _rope_ids(self, rope_positions: np.ndarray | None, tokens: int) -> np.ndarray | None:
        """``rope_positions`` checked as [3, tokens] M-RoPE ids of a model that has them (None passes)."""
        if rope_positions is None:
            return None
        if not self.mrope_section:
            raise ValueError("rope_positions given, but this model has no M-RoPE (mrope_section): it is not a VL model")
        ids = np.asarray(rope_positions)
        if ids.shape != (3, tokens) or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"rope_positions must be integer [3, {tokens}], got {ids.dtype} {list(ids.shape)}")
        return ids.astype(np.int32)

    def _inputs(self, token_ids: np.ndarray | None, embeddings: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
        if (token_ids is None) == (embeddings is None):
            raise ValueError("forward needs exactly one of token_ids or embeddings")
        if token_ids is not None:
            token_ids = np.asarray(token_ids, dtype=np.int32)
            if token_ids.size and (token_ids.min() < 0 or token_ids.max() >= self.config.vocab_size):
                raise ValueError(f"token id out of range [0, {self.config.vocab_size})")
        if embeddings is not None:
            embeddings = np.asarray(embeddings, dtype=np.float32)
            if embeddings.ndim != 2 or embeddings.shape[1] != self.config.hidden_size:
                raise ValueError(f"embeddings must be [T, {self.config.hidden_size}], got {list(embeddings.shape)}")
        return token_ids, embeddings
