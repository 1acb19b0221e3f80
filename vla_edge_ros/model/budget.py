"""Memory plan: weights + KV pool + workspace against the configured budget, before anything loads.

The KV arena is a pool of pages (``model/pages.py``): ``kv_pool_pages`` of them, or by default a page for
every block of ``kv_page_tokens`` slots of every (layer, KV head); the plan counts pages, exactly what a
backend allocates. Only tensor headers are read (the weights are memory-mapped, not loaded), so a configuration that
cannot fit on the robot is refused in milliseconds with the breakdown that explains why.

The KV one observation costs is shown: its ``observation_tokens`` (every camera's frame and the state
token) in every layer and KV head. A VL checkpoint's weights include its vision tower (shown apart), its
frames are ``tokens_per_frame`` tokens at the configured pixel cap, and the workspace is the
larger of the decoder's largest forward and the tower's pass over one frame (they run one after the
other). ``edge_table`` sets a plan against the memory of the Jetson Orin family, whose GPU shares it.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import layout
from .checkpoint import Checkpoint
from .config import NUM_ACTION_BINS, ModelConfig

FP32 = 4
GIB = 1 << 30
EDGE_MEMORY = (("8 GB (Jetson Orin Nano / NX 8GB)", 8 * GIB), ("Jetson Orin NX 16GB", 16 * GIB),
               ("Jetson AGX Orin 32GB", 32 * GIB), ("Jetson AGX Orin 64GB", 64 * GIB))
"""Memory of the Orin family (LPDDR5 the GPU and the CPU share; the OS and the rest of the robot's
software need their part of it, which is why ``budget_bytes`` defaults to 5 GB)."""


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
    vision_weight_bytes: int = 0  # the part of weight_bytes that is a VL checkpoint's vision tower
    observation_tokens: int = 0  # the memory's unit: every camera's frame and the state token

    @property
    def kv_bytes_per_observation(self) -> int:
        """KV bytes one observation's tokens take in every layer and KV head (the dense layout)."""
        return self.kv_bytes_per_token * self.observation_tokens

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
        tower = f"; vision tower {self.vision_weight_bytes:,} B of it" if self.vision_weight_bytes else ""
        rows = [
            ("weights", self.weight_bytes, f"{self.backend} backend{tower}"),
            ("kv arena", self.kv_arena_bytes, f"{self.kv_pages:,} pages x {self.kv_page_bytes:,} B (pages of "
             f"{self.kv_page_tokens} tokens of one layer and KV head; {self.kv_capacity_tokens} slots, "
             f"{self.kv_bytes_per_token:,} B per token in every head, {self.kv_bytes_per_observation:,} B per "
             f"observation of {self.observation_tokens} tokens)"),
            ("workspace", self.workspace_bytes, "activations of the largest forward"),
            ("total", self.total_bytes, ""),
            ("budget", self.budget_bytes, f"{100.0 * self.total_bytes / self.budget_bytes:.1f}% used"
             + ("" if self.fits else " -> DOES NOT FIT")),
        ]
        return "\n".join(f"{name:<10} {value:>16,} B  {note}".rstrip() for name, value, note in rows)


def plan_memory(checkpoint: Checkpoint, backend: str, kv_capacity_tokens: int, budget_bytes: int,
                max_new_tokens: int, kv_page_tokens: int, kv_pool_pages: int = 0) -> MemoryPlan:
    """Bytes each part will take on ``backend`` (``Checkpoint.held_bytes``)."""
    def weight_bytes(names: list[str]) -> int:
        return sum(checkpoint.held_bytes(name, backend) for name in names)

    tower = [name for name in checkpoint.tensors if name.startswith("visual.")] if checkpoint.config.vl else []
    return plan_config(checkpoint.config, backend, weight_bytes(list(checkpoint.tensors)), weight_bytes(tower),
                       kv_capacity_tokens, budget_bytes, max_new_tokens, kv_page_tokens, kv_pool_pages)


def plan_config(c: ModelConfig, backend: str, weight_bytes: int, vision_weight_bytes: int, kv_capacity_tokens: int,
                budget_bytes: int, max_new_tokens: int, kv_page_tokens: int, kv_pool_pages: int = 0) -> MemoryPlan:
    """The plan of a model of config ``c`` whose weights take ``weight_bytes`` (the tower's part of them
    ``vision_weight_bytes``) on ``backend``: what ``plan_memory`` computes, without a checkpoint."""
    kv_per_token = layout.kv_bytes_per_token(c)
    t = max_new_tokens
    activations = t * (3 * c.hidden_size + c.q_dim + 2 * c.kv_dim + 3 * c.intermediate_size + NUM_ACTION_BINS)
    if backend == "numpy":  # attention scores are materialised per KV head group
        activations += 2 * c.num_attention_heads * t * kv_capacity_tokens
    if c.vl is not None:  # the tower's pass over one frame: every patch's widest rows, and its attention scores
        v = c.vl.vision
        patches = (c.vision.image_size // v.patch_size) ** 2
        tower = patches * (v.patch_dim + 5 * v.embed_dim + 2 * v.mlp_dim) + v.num_heads * patches * patches
        activations = max(activations, tower)
    pages = layout.kv_pool_pages(c.num_hidden_layers, c.num_key_value_heads, kv_capacity_tokens, kv_page_tokens,
                                 kv_pool_pages)
    return MemoryPlan(backend, weight_bytes, kv_per_token, kv_capacity_tokens, kv_page_tokens, pages,
                      layout.kv_page_bytes(c, kv_page_tokens), activations * FP32, budget_bytes, vision_weight_bytes,
                      c.observation_tokens)


def edge_table(plan: MemoryPlan) -> str:
    """The plan against each Orin memory size: whether it fits, and how many observations of KV the memory left
    beside the weights and the workspace would hold (dense layout, the arena's fp32)."""
    rows = []
    for name, memory in EDGE_MEMORY:
        spare = memory - plan.weight_bytes - plan.workspace_bytes
        held = max(0, spare) // plan.kv_bytes_per_observation if plan.kv_bytes_per_observation else 0
        verdict = "fits" if plan.total_bytes <= memory else "DOES NOT FIT"
        rows.append(f"{name:<34} {memory:>16,} B  {100.0 * plan.total_bytes / memory:5.1f}% {verdict:<12} "
                    f"room for {held:,} observations of KV")
    return "\n".join(rows)


def require_fit(plan: MemoryPlan) -> None:
    if not plan.fits:
        raise BudgetError(f"configuration does not fit the memory budget:\n{plan.table()}")
