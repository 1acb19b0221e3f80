"""How the KV arena divides: its slots (prompt, what a policy reserves, frames, the action scratch) and its pages.

A "frame" here is one observation's token group, ``ModelConfig.observation_tokens``: every camera's
frame and the state token (one camera and no state: ``tokens_per_frame``). One formula, two directions:
``arena_capacity`` sizes an arena for a number of frames (evaluation budgets, benchmarks),
``frames_in_arena`` says how many frames an arena holds (the frame-window policies). The scratch is
where decoded action tokens go while an action is decoded: one slot per action dimension for the
``bins`` head (the first bin is read off the frame's last token, so a step needs ``dof - 1``; the arena
keeps one more so a frame never fills it to the last slot), none for the ``linear`` head, which reads the
action off the frame's last hidden state.

Memory is pages (``model/pages.py``): a page holds the keys and values of ``page_tokens`` tokens of one
(layer, KV head). Each head's block table has room for every slot. By default the pool has a page for
every block of every head (the dense size), so no layout runs out of pages before it runs out of slots;
a smaller pool serves only the per-head layout (dms), whose heads hold fewer tokens than the arena has
slots, and its policy forces tokens out when the pages run short.
"""

from __future__ import annotations

from .config import ModelConfig

ARENA_BYTES_PER_VALUE = 4  # the arena holds fp32 keys and values on every backend


def scratch_tokens(config: ModelConfig) -> int:
    """Arena slots a decoded chunk needs beside its frame: a bins head's tokens (H x dof with parallel decoding)."""
    return config.action.chunk * config.action.dof if config.action.head == "bins" else 0


def kv_bytes_per_token(config: ModelConfig) -> int:
    """Bytes one cached token takes: keys and values of every layer and KV head, fp32 (the arena's dtype)."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * ARENA_BYTES_PER_VALUE


def blocks_per_head(capacity: int, page_tokens: int) -> int:
    """Block-table columns of one (layer, KV head): pages enough for every slot."""
    return -(-capacity // page_tokens)


def kv_pool_pages(layers: int, kv_heads: int, capacity: int, page_tokens: int, configured: int = 0) -> int:
    """Pages in the arena's pool: ``configured`` when > 0, else every block of every (layer, KV head), the
    dense size (every head holding every slot), which every layout runs on."""
    return configured if configured > 0 else layers * kv_heads * blocks_per_head(capacity, page_tokens)


def kv_pages_for(config: ModelConfig, tokens: int, page_tokens: int) -> int:
    """Pages every (layer, KV head) needs to hold ``tokens`` tokens: a dense cache of them, in pages."""
    return kv_pool_pages(config.num_hidden_layers, config.num_key_value_heads, tokens, page_tokens)


def kv_page_bytes(config: ModelConfig, page_tokens: int) -> int:
    """Bytes one page takes: keys and values of ``page_tokens`` tokens of one (layer, KV head), fp32."""
    return 2 * page_tokens * config.head_dim * ARENA_BYTES_PER_VALUE




def arena_capacity(config: ModelConfig, prompt_tokens: int, frames: int, reserved_tokens: int = 0) -> int:
    """Slots for the prompt, ``reserved_tokens`` a policy holds beside it, ``frames`` frames and the scratch."""
    return prompt_tokens + reserved_tokens + frames * config.observation_tokens + scratch_tokens(config)


def frames_in_arena(config: ModelConfig, capacity: int, prompt_tokens: int, reserved_tokens: int = 0) -> int:
    """Whole frames a ``capacity``-slot arena holds beside the prompt, the reserved tokens and the scratch."""
    free = capacity - prompt_tokens - reserved_tokens - scratch_tokens(config)
    return free // config.observation_tokens
