"""Memory plan: weights + KV pool + workspace against the configured budget, before anything loads.

The KV arena is a pool of pages (``model/pages.py``): ``kv_pool_pages`` of them, or by default a page for
every block of ``kv_page_tokens`` slots of every (layer, KV head); the plan counts pages, exactly what a
backend allocates. Only tensor headers are read (the weights are memory-mapped, not loaded), so a configuration that
cannot fit on the robot is refused in milliseconds with the breakdown that explains why.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import layout
from .checkpoint import Checkpoint
from .config import NUM_ACTION_BINS

FP32 = 4


class BudgetError(ValueError):
    """The plan does not fit in ``budget_bytes``."""


@dataclass(frozen=True)
class MemoryPlan:
    backend: str
    weight_bytes: int
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    kv_page_tokens: int
    kv_pages: int  # pages in the pool (layout.kv_pool_pages)
    kv_page_bytes: int  # keys and values of kv_page_tokens tokens of one (layer, KV head)
    workspace_bytes: int
    budget_bytes: int

    @property
    def kv_arena_bytes(self) -> int:
        return self.kv_pages * self.kv_page_bytes

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_arena_bytes + self.workspace_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.budget_bytes

    def table(self) -> str:
        rows = [
            ("weights", self.weight_bytes, f"{self.backend} backend"),
            ("kv arena", self.kv_arena_bytes, f"{self.kv_pages:,} pages x {self.kv_page_bytes:,} B (pages of "
             f"{self.kv_page_tokens} tokens of one layer and KV head; {self.kv_capacity_tokens} slots, "
             f"{self.kv_bytes_per_token:,} B per token in every head)"),
            ("workspace", self.workspace_bytes, "activations of the largest forward"),
            ("total", self.total_bytes, ""),
            ("budget", self.budget_bytes, f"{100.0 * self.total_bytes / self.budget_bytes:.1f}% used"
             + ("" if self.fits else " -> DOES NOT FIT")),
        ]
        return "\n".join(f"{name:<10} {value:>16,} B  {note}".rstrip() for name, value, note in rows)


def plan_memory(checkpoint: Checkpoint, backend: str, kv_capacity_tokens: int, budget_bytes: int,
                max_new_tokens: int, kv_page_tokens: int, kv_pool_pages: int = 0) -> MemoryPlan:
    """Bytes each part will take on ``backend`` ('numpy' widens weights to fp32; 'cuda' keeps storage dtype)."""
    c = checkpoint.config
    if backend == "numpy":
        weight_bytes = sum(t.array.size for t in checkpoint.tensors.values()) * FP32
    else:
        weight_bytes = checkpoint.weight_bytes()
    kv_per_token = layout.kv_bytes_per_token(c)
    t = max_new_tokens
    activations = t * (3 * c.hidden_size + c.q_dim + 2 * c.kv_dim + 3 * c.intermediate_size + NUM_ACTION_BINS)
    if backend == "numpy":  # attention scores are materialised per KV head group
        activations += 2 * c.num_attention_heads * t * kv_capacity_tokens
    pages = layout.kv_pool_pages(c.num_hidden_layers, c.num_key_value_heads, kv_capacity_tokens, kv_page_tokens,
                          kv_pool_pages)
    return MemoryPlan(backend, weight_bytes, kv_per_token, kv_capacity_tokens, kv_page_tokens, pages,
                      layout.kv_page_bytes(c, kv_page_tokens), activations * FP32, budget_bytes)


def require_fit(plan: MemoryPlan) -> None:
    if not plan.fits:
        raise BudgetError(f"configuration does not fit the memory budget:\n{plan.table()}")
