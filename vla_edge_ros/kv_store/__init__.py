"""Encrypted, model-bound, key-bound, crash-safe storage of KV blocks (see store.py and block_file.py)."""

from .binding import StoreBindingError
from .block_file import BlockError
from .directory import BlockDirectory, StoreBusyError, StoreFullError, StoreIOError
from .engine_blocks import load_or_prefill_prompt, restore_memory, save_memory
from .fingerprint import model_fingerprint
from .keys import StoreKeyError, load_key
from .store import BlockStore

__all__ = ["BlockDirectory", "BlockError", "BlockStore", "StoreBindingError", "StoreBusyError", "StoreFullError",
           "StoreIOError", "StoreKeyError", "load_key", "load_or_prefill_prompt", "model_fingerprint", "restore_memory",
           "save_memory"]
