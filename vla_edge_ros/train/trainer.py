"""``vla-edge train`` end to end: demonstrations -> three stages -> an HF checkpoint the engine loads.

Seeded and repeatable: the demonstrations, the initial weights and every sampled batch follow from
``TrainSpec.seed`` (torch runs single-threaded per op order, so the same machine gives the same
bytes). The output directory gets config.json + model.safetensors (decoder, frame encoder, action
head, aura projections and gate, dms gates), train_log.json with every step's figures, and loss.png.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..model.checkpoint import load_checkpoint
from ..model.config import ModelConfig
from ..model.init_model import AURA_DIM, preset, write_model
from ..worlds.sim.world import TaskSpec
from .demos import record_demos
from .stages import AuraRecipe, StageSpec, behaviour_cloning, check_dagger, perception, train_aura, train_dms
from .torch_model import VlaModel

SCHEMA = "vla_edge_ros.train/1"
DEFAULT_PROMPT = (151, 9, 402, 77, 1030, 12)  # the default config's instruction tokens
STAGES = ("perception", "bc", "aura", "dms")  # in the order they run


@dataclass(frozen=True)
class TrainSpec:
    """Everything that decides the trained weights. Defaults: ~30 min on a 2-core x86 CPU (the aura stage,
    unrolled frame by frame, ~1.4 s a step)."""

    seed: int = 0
    preset: str = "sim"
    episodes: int = 1200           # demonstrations, reach and cue-reach alternating
    max_frames: int = 100          # frames per training sequence at most (a cue-reach demo has <= 99)
    prompt_ids: tuple[int, ...] = DEFAULT_PROMPT
    perception: StageSpec = StageSpec(steps=1000, batch=64, lr=1e-3)
    bc: StageSpec = StageSpec(steps=900, batch=4, lr=1e-3)
    aura: StageSpec = StageSpec(steps=500, batch=8, lr=3e-3)
    aura_train_decoder: bool = False  # the decoder learns in the aura stage too (models/sim: True, recipe E)
    aura_bc_batch: int = 4         # aura_train_decoder: frame-history sequences per step, so the decoder keeps serving the KV policies
    aura_decoder_lr: float = 1e-3  # aura_train_decoder: the decoder's learning rate in the aura stage
    aura_cue_writes: bool = False  # privileged write labels where the cue appears, forced first (AuraRecipe.cue_writes)
    aura_forced_fraction: float = 0.5  # aura_cue_writes: share of the aura steps whose writes are forced
    aura_label_weight: float = 1.0     # aura_cue_writes: the gate's BCE toward the labels, annealed to 0
    aura_memory_goal: float = 0.0      # weight of the goal position regressed from the memory token (0: off)
    aura_memory_warmup: int = 0        # aura_cue_writes: steps of aura.* alone on that regression first
    aura_dagger_episodes: int = 0      # closed-loop episodes of the policy per collection, half of each aura batch
    aura_dagger_rounds: int = 4        # aura_dagger_episodes: collections over the aura stage
    dms: StageSpec = StageSpec(steps=100, batch=2, lr=2e-2)
    dms_max_frames: int = 64       # cue, hold and the first moves: what the gate must learn to keep
    aura_beta: float = 0.5         # the delta-rule step the gate is trained with (kv.aura.beta's default)
    aura_rho: float = 0.15         # target write rate: writes above it are penalised
    aura_penalty: float = 1.0
    dms_window: int = 32           # kv.dms.window's default
    dms_target_ratio: float = 4.0  # kv.dms.target_ratio's default
    dms_penalty: float = 1.0
    dtype: str = "bfloat16"
    tasks: tuple[str, ...] = ("reach", "cue-reach")
    stages: tuple[str, ...] = STAGES  # which stages run (a subset of STAGES, run in STAGES' order)
    init_from: str | None = None      # start from this checkpoint's weights (its config), not from scratch

    def __post_init__(self) -> None:
        unknown = [name for name in self.stages if name not in STAGES]
        if unknown or not self.stages:
            raise ValueError(f"stages: expected a non-empty subset of {', '.join(STAGES)}, got {list(self.stages)}")
        check_dagger(self.aura_dagger_episodes, self.aura.batch)  # before the demonstrations, not after

    def scaled(self, factor: float) -> TrainSpec:
        """The same recipe with every stage's steps (and the demonstrations) scaled, for smoke runs."""
        def steps(stage: StageSpec) -> StageSpec:
            return replace(stage, steps=max(1, round(stage.steps * factor)))

        return replace(self, episodes=max(2 * self.bc.batch, round(self.episodes * factor)),
                       perception=steps(self.perception), bc=steps(self.bc), aura=steps(self.aura),
                       dms=steps(self.dms))


@dataclass
class TrainLog:
    spec: dict[str, Any]
    stages: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    demos: dict[str, Any] = field(default_factory=dict)


StageProgress = Callable[[str, int, int, dict[str, float]], None]


def train(spec: TrainSpec, out: Path, progress: StageProgress = lambda *args: None) -> TrainLog:
    """Run every stage and write the checkpoint, train_log.json and loss.png to ``out``."""
    config = preset(spec.preset)
    if config.action.head != "linear" or config.action.dof != 2:
        raise ValueError(f"preset {spec.preset!r}: training drives a 2-D velocity, it needs a linear head with dof 2")
    if max(spec.prompt_ids) >= config.vocab_size:
        raise ValueError(f"prompt ids must be below the vocabulary size {config.vocab_size}")
    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    log = TrainLog(spec=asdict(spec))
    model = VlaModel(config, AURA_DIM)
    if spec.init_from is not None:
        config = load_weights(model, Path(spec.init_from))
    started = time.perf_counter()
    demos = record_demos([TaskSpec(name=name) for name in spec.tasks], spec.episodes, spec.seed,
                         config.vision.image_size) if set(spec.stages) - {"perception"} else []
    log.seconds["demos"] = time.perf_counter() - started
    log.demos = {"episodes": len(demos), "frames": int(sum(len(d.frames) for d in demos)),
                 "expert_success": float(np.mean([d.success for d in demos])) if demos else float("nan")}
    prompt = torch.tensor(spec.prompt_ids)

    def run(name: str, steps: int, body: Callable[[Callable[[int, dict[str, float]], None]], None]) -> None:
        """Stage ``name`` of ``steps`` steps in all (aura's include its memory warm-up, which runs first)."""
        if name not in spec.stages:
            return
        rows: list[dict[str, float]] = []

        def step(index: int, figures: dict[str, float]) -> None:
            rows.append(figures)
            progress(name, len(rows) - 1, steps, figures)

        begin = time.perf_counter()
        body(step)
        log.stages[name] = rows
        log.seconds[name] = time.perf_counter() - begin

    run("perception", spec.perception.steps,
        lambda step: perception(model, prompt, spec.perception, rng, step))
    run("bc", spec.bc.steps, lambda step: behaviour_cloning(model, demos, prompt, spec.bc, rng, spec.max_frames, step))
    recipe = AuraRecipe(spec.aura_beta, spec.aura_rho, spec.aura_penalty,
                        spec.aura_train_decoder, spec.aura_bc_batch, spec.aura_decoder_lr, spec.aura_cue_writes,
                        spec.aura_forced_fraction, spec.aura_label_weight, spec.aura_memory_goal,
                        spec.aura_memory_warmup, spec.aura_dagger_episodes, spec.aura_dagger_rounds)
    run("aura", recipe.warmup_steps + spec.aura.steps,
        lambda step: train_aura(model, demos, prompt, spec.aura, rng, spec.max_frames, recipe, step))
    run("dms", spec.dms.steps, lambda step: train_dms(model, demos, prompt, spec.dms, rng, spec.dms_max_frames,
                                                       spec.dms_window, spec.dms_target_ratio, spec.dms_penalty, step))
    export(model, config, out, spec)
    (out / "train_log.json").write_text(json.dumps({"schema": SCHEMA, **asdict(log)}, indent=1) + "\n")
    plot_losses(log, out / "loss.png")
    return log


def load_weights(model: VlaModel, model_dir: Path) -> ModelConfig:
    """Copy a checkpoint's tensors into ``model`` (all it exports, so every one must be there) and return
    the checkpoint's config, which must be the one ``model`` was built with. ``where_head`` keeps its
    fresh initialisation: it is training-only and not exported. So does the aura memory when the checkpoint's
    has another feature layout (``memory/aura.py``; a checkpoint of an earlier ``vla-edge train``): that
    memory cannot be carried over, and the aura stage trains this one from its start."""
    checkpoint = load_checkpoint(model_dir)
    if checkpoint.config != model.c:
        raise ValueError(f"{model_dir}: its config.json differs from the preset this run trains (TrainSpec.preset)")
    state = model.exported_state()
    if any(checkpoint.tensors[name].shape != tuple(tensor.shape) for name, tensor in state.items()
           if name.startswith("aura.") and name in checkpoint.tensors):
        state = {name: tensor for name, tensor in state.items() if not name.startswith("aura.")}
    missing = sorted(set(state) - set(checkpoint.tensors))
    if missing:
        raise ValueError(f"{model_dir}: not a 'vla-edge train' checkpoint, it lacks {missing[:3]}")
    with torch.no_grad():
        for name, tensor in state.items():
            stored = torch.from_numpy(checkpoint.float32(name))
            if stored.shape != tensor.shape:
                raise ValueError(f"{model_dir}: {name} has shape {list(stored.shape)}, this run needs "
                                 f"{list(tensor.shape)}")
            tensor.copy_(stored)
    return checkpoint.config


def export(model: VlaModel, config: ModelConfig, out: Path, spec: TrainSpec) -> Path:
    """The model's tensors under their checkpoint names (HF's for the decoder) as an HF directory."""
    arrays = {name: tensor.detach().numpy().astype(np.float32) for name, tensor in model.exported_state().items()}
    metadata = {"format": "pt", "producer": "vla-edge train", "seed": str(spec.seed)}
    return write_model(out, config, arrays, spec.dtype, metadata)


def plot_losses(log: TrainLog, path: Path) -> None:
    """One panel per stage: its loss (log scale) and its rate figure where it has one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name in ("perception", "bc", "aura", "dms") if log.stages.get(name)]
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.5), squeeze=False)
    titles = {"perception": "single frames: action MSE", "bc": "episodes: action MSE", "aura": "aura (frozen decoder): action MSE",
              "dms": "dms (frozen decoder): distillation MSE"}
    series = {"perception": "action", "bc": "action", "aura": "action", "dms": "distill"}
    rates = {"aura": "write_rate", "dms": "keep_rate"}
    for ax, name in zip(axes[0], names):
        rows = log.stages[name]
        values = np.array([r.get(series[name], np.nan) for r in rows])  # aura's memory warm-up has no action
        ax.plot(values, lw=0.5, color="tab:blue", alpha=0.35)
        ax.plot(_running_mean(values), lw=1.2, color="tab:blue")
        ax.set(yscale="log", xlabel="step", title=titles[name])
        if name in rates:
            twin = ax.twinx()
            twin.plot(_running_mean(np.array([r.get(rates[name], np.nan) for r in rows])), lw=1.2, color="tab:orange")
            twin.set(ylim=(0, 1.05), ylabel=rates[name].replace("_", " ") + " (orange)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _running_mean(values: np.ndarray, window: int = 25) -> np.ndarray:
    """Mean of the last ``window`` values at each step (fewer at the start): one batch is a noisy figure."""
    sums = np.cumsum(values)
    counts = np.minimum(np.arange(1, values.size + 1), window)
    shifted = np.concatenate([np.zeros(window), sums])[:values.size]
    return (sums - shifted) / counts
