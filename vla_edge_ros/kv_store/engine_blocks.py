"""Where the runtime uses the store: the pinned prompt's KV, and the episode memory across restarts.

Block keys chain from the model fingerprint: prompt = H(fingerprint, "prompt", token ids), episode
memory = H(prompt key, "memory", policy, name). A memory block is found by name rather than by the
hashes of its frames, because the process restoring it has not seen those frames; it is still bound
to the prompt, the policy and the model through the chain, and its arrays carry every kept token's
position and KV.
"""

from __future__ import annotations

import numpy as np

from ..engine.vla_engine import VlaEngine
from .keys import chain_key
from .store import BlockStore

PROMPT_KIND = "prompt"
MEMORY_KIND = "memory"


def prompt_key(store: BlockStore, token_ids: np.ndarray | list[int]) -> bytes:
    return chain_key(store.fingerprint, PROMPT_KIND, np.asarray(token_ids, dtype=np.int32))


def memory_key(store: BlockStore, token_ids: np.ndarray | list[int], policy: str, name: str) -> bytes:
    return chain_key(prompt_key(store, token_ids), MEMORY_KIND, policy, name)


def load_or_prefill_prompt(engine: VlaEngine, store: BlockStore, token_ids: list[int] | np.ndarray, *,
                           keep_memory: bool = False) -> bool:
    """Pin the prompt from its stored KV when a valid block exists (True), else prefill it and store it: for
    a new episode, or (``keep_memory``) for the episode going on under a new instruction (``replace_prompt``)."""
    def place(cached: dict[str, np.ndarray] | None = None) -> None:
        if keep_memory:
            engine.replace_prompt(token_ids, cached=cached)
        else:
            engine.set_prompt(token_ids, cached=cached)

    key = prompt_key(store, token_ids)
    cached = store.get(key)
    if cached is not None:
        try:
            place(cached)
            return True
        except ValueError as exc:  # authenticated, yet not this prompt's shape
            store.reject("shape", store.path_of(key).name, str(exc))
    place()
    try:
        store.put(key, PROMPT_KIND, engine.prompt_kv())
    except OSError as exc:  # a full disk costs the next start a prefill, never this one
        store.log(f"prompt KV not stored: {exc}")
    return False


def save_memory(engine: VlaEngine, store: BlockStore, name: str) -> int:
    """Store the current episode (every kept token's KV and the policy's state); returns bytes written."""
    key = memory_key(store, engine.prompt_ids, engine.policy.name, name)
    return store.put(key, MEMORY_KIND, engine.memory_state())


def restore_memory(engine: VlaEngine, store: BlockStore, name: str) -> bool:
    """Continue the stored episode of this prompt, policy and name if there is a valid one (True)."""
    key = memory_key(store, engine.prompt_ids, engine.policy.name, name)
    state = store.get(key)
    if state is None:
        return False
    try:
        engine.load_memory_state(state)
    except (ValueError, KeyError) as exc:
        why = f"it lacks the array {exc}" if isinstance(exc, KeyError) else str(exc)
        store.reject("shape", store.path_of(key).name, f"episode memory does not fit this engine: {why}")
        engine.set_prompt(engine.prompt_ids)
        return False
    return True
