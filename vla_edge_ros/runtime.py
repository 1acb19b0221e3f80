"""Build a ready engine from validated settings: plan the memory, refuse what cannot fit, load, prefill."""

from __future__ import annotations

from pathlib import Path

from .config import Settings
from .memory import make_policy
from .model.budget import MemoryPlan, plan_memory, require_fit
from .model.checkpoint import Checkpoint, load_checkpoint
from .model.engine import VlaEngine, resolve_backend


def plan_for(settings: Settings, checkpoint: Checkpoint | None = None) -> tuple[MemoryPlan, Checkpoint]:
    """The memory plan of the reasoning node's configuration (reads tensor headers only)."""
    node = settings["reasoning"]
    checkpoint = checkpoint or load_checkpoint(Path(node["model_dir"]))
    largest = max(checkpoint.config.vision.tokens_per_frame, len(node["prompt_token_ids"]))
    plan = plan_memory(checkpoint, resolve_backend(node["backend"]), node["kv_capacity_tokens"],
                       node["budget_bytes"], largest)
    return plan, checkpoint


def load_engine(settings: Settings) -> tuple[VlaEngine, MemoryPlan]:
    """Plan, check the budget, load the engine, prefill the pinned prompt and warm it up."""
    node = settings["reasoning"]
    plan, checkpoint = plan_for(settings)
    require_fit(plan)
    prompt = node["prompt_token_ids"]
    vocab = checkpoint.config.vocab_size
    if any(t >= vocab for t in prompt):
        raise ValueError(f"{settings.source}: reasoning.prompt_token_ids has ids >= vocab_size {vocab}")
    try:
        policy = make_policy(node["kv.policy"], node)
        engine = VlaEngine(checkpoint, backend=plan.backend, kv_capacity_tokens=node["kv_capacity_tokens"],
                           policy=policy)
    except ValueError as exc:
        raise ValueError(f"{settings.source}: reasoning: {exc}") from exc
    engine.set_prompt(prompt)
    engine.warm_up()
    return engine, plan
