"""``vla-edge train``: a recipe's phases in order, each demonstrations -> stages -> an HF checkpoint.

Seeded and repeatable: a phase's demonstrations, its fresh weights and every sampled batch follow from its
``TrainSpec.seed`` (torch runs single-threaded per op order, so the same machine gives the same bytes). Each
phase writes config.json + model.safetensors (decoder, frame encoder, action head, and the aura projections
and gate and the dms gates once a stage has trained them), the next phase starts from them as a separate run
would, and the output directory gets the last phase's checkpoint and train_log.json (``train_log.py``) for
all of them.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..model.checkpoint import load_checkpoint
from ..model.config import ModelConfig, StateConfig, load_model_config
from ..model.init_model import AURA_DIM, preset, write_model
from ..model.instruction import TEMPLATE_FILE, InstructionTokenizer
from ..model.tokenizer_files import write_tokenizer
from ..worlds.metaworld import ACTION, description
from ..worlds.sim.world import CueReachEnv, TaskSpec
from .arm_demos import ArmEpisode, arm_episode, arm_episodes, arm_state_statistics, pieces, record_arm_demos
from .demos import Demo, PlanarEpisode, odometry_statistics, record_demos
from .recipe import Phase, Recipe
from .spec import METAWORLD, DaggerSpec, TrainSpec
from .stages import behaviour_cloning, dagger, demo_perception, perception, train_aura, train_dms
from .torch_model import VlaModel
from .train_log import LOG_NAME, PhaseLog, read_log, write_log
from .wording import Wording, arm_corpus, corpus

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", TEMPLATE_FILE)
MEMORY_GROUPS = ("aura", "dms")  # the memory policies with tensors of their own, each trained by its stage

StageProgress = Callable[[str, int, int, dict[str, float]], None]
# records a phase's Meta-World demonstrations, in order, their prompts left empty (the phase's name, for files)
ArmRecording = Callable[[str, list[ArmEpisode]], list[Demo]]
# a DAgger collection (the dagger stage's, the aura stage's): (a name for its files, the checkpoint whose policy
# drives, the episodes, the dagger stage's knobs (configuration, cost, step limit), the memory policy: fifo or aura)
# -> each episode as the policy drove it, labelled as a demonstration (``arm_demos.PlanLabeller``,
# ``demos.PlanarLabeller``), in order
Rollouts = Callable[[str, Path, list[ArmEpisode] | list[PlanarEpisode], DaggerSpec, str], list[Demo]]
DAGGER_DIR = "dagger"  # under a phase's output while it runs: the checkpoint of each collection


def train_recipe(recipe: Recipe, out: Path, progress: StageProgress = lambda *args: None,
                 record_arm: ArmRecording = record_arm_demos, rollouts: Rollouts | None = None,
                 resume: bool = False) -> list[dict[str, Any]]:
    """Every phase of ``recipe`` where ``Recipe.chained`` puts it, ``out/train_log.json`` rewritten after each, and
    each phase's record as that log holds it, in order; ``progress`` sees each stage as "<phase> <stage>";
    ``record_arm`` records Meta-World's demonstrations (the command line's runs them on ``--workers`` processes),
    ``rollouts`` DAgger's episodes (the runtime drives them: the command line gives it). With ``resume`` the
    phases an earlier run into ``out`` finished are kept (``finished_phases``) and the run goes on from the first
    one it did not."""
    phases = recipe.chained(out)
    logs = finished_phases(phases, out) if resume else []
    for phase, where in phases[len(logs):]:
        def tagged(stage: str, step: int, steps: int, figures: dict[str, float], name: str = phase.name) -> None:
            progress(f"{name} {stage}", step, steps, figures)

        logs.append(train(phase.spec, where, phase.name, tagged, record_arm, rollouts).summary())
        write_log(out / LOG_NAME, logs)
    return logs


def finished_phases(phases: list[tuple[Phase, Path]], out: Path) -> list[dict[str, Any]]:
    """The leading phases of ``phases`` that ``out/train_log.json`` records as finished with the spec each has now,
    whose checkpoint is where the phase writes it: a phase is logged only after its checkpoint is written, and a
    phase depends on nothing but its spec and the checkpoint before it (it seeds its own generators), so going on
    from there gives what one uninterrupted run gives. The first phase that differs and every one after it run
    again."""
    path = out / LOG_NAME
    if not path.is_file():
        return []
    logged = read_log(path)
    kept: list[dict[str, Any]] = []
    for (phase, where), record in zip(phases, logged):
        spec = json.loads(json.dumps(asdict(phase.spec)))
        written = all((where / name).is_file() for name in ("config.json", "model.safetensors"))
        if record.get("name") != phase.name or record.get("spec") != spec or not written:
            break
        kept.append(record)
    return kept


def train(spec: TrainSpec, out: Path, name: str, progress: StageProgress = lambda *args: None,
          record_arm: ArmRecording = record_arm_demos, rollouts: Rollouts | None = None) -> PhaseLog:
    """One phase ``name``: every stage ``spec`` runs, the checkpoint written to ``out``. Meta-World's
    demonstrations are recorded first: the state token's statistics come from them."""
    if spec.drives_policy and rollouts is None:
        raise ValueError(f"phase {name}: DAgger needs the runtime to drive the policy (vla-edge train gives it)")
    started = time.perf_counter()
    arm_demos = record_arm(name, arm_episodes(spec)) if spec.world == METAWORLD else []
    recorded = time.perf_counter() - started
    config = phase_config(spec, arm_demos)
    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    log = PhaseLog(name, asdict(spec))
    model = VlaModel(config, AURA_DIM)
    trained_memory = {group for group in MEMORY_GROUPS if group in spec.stages}
    if spec.init_from is not None:
        trained_memory |= load_weights(model, Path(spec.init_from), fresh_memory=spec.aura.fresh)
    if spec.blind:
        model.close_camera()
    wording = phase_wording(spec, config, out)
    started = time.perf_counter()
    if spec.world == METAWORLD:
        demos = [replace(demo, prompt=wording.spoken(description(demo.task))) for demo in arm_demos]
    elif set(spec.stages) - {"perception"}:
        demos = record_demos([TaskSpec(name=task) for task in spec.tasks], spec.episodes, spec.seed,
                             config.vision.image_size, wording, config.action.chunk)
    else:
        demos = []
    log.seconds["demos"] = recorded + time.perf_counter() - started
    log.demos = {"episodes": len(demos), "frames": int(sum(len(d.frames) for d in demos)),
                 "expert_success": float(np.mean([d.success for d in demos])) if demos else None}
    def run(stage: str, steps: int, body: Callable[[Callable[[int, dict[str, float]], None]], None]) -> None:
        """Stage ``stage`` of ``steps`` steps in all (aura's include its memory warm-up, which runs first)."""
        if stage not in spec.stages:
            return
        rows: list[dict[str, float]] = []

        def step(index: int, figures: dict[str, float]) -> None:
            rows.append(figures)
            progress(stage, len(rows) - 1, steps, figures)

        begin = time.perf_counter()
        body(step)
        log.stages[stage] = rows
        log.seconds[stage] = time.perf_counter() - begin

    if spec.world == METAWORLD:  # single frames of the demonstrations: fresh layouts need a world we can pose
        run("perception", spec.perception.steps, lambda step: demo_perception(model, demos, spec.perception, rng, step))
    else:
        run("perception", spec.perception.steps,
            lambda step: perception(model, spec.perception, rng, spec.tasks, wording, step))
    run("bc", spec.bc.steps, lambda step: behaviour_cloning(model, demos, spec.bc, rng, step))

    def collection(tag: str, tasks: Sequence[str], count: int, policy: str) -> Callable[[int], list[Demo]]:
        """A collection of the policy's own episodes for a stage (``tag``): its ``round_``-th exports the weights as
        they are now, with the tokenizer, and drives ``count`` fresh layouts with them through the runtime (``tasks``
        alternating, each worded as its demonstration would be; memory ``policy``, ``spec.dagger``'s configuration
        and cost), each episode back labelled."""
        def collect(round_: int) -> list[Demo]:
            where = out / DAGGER_DIR / f"round-{round_}"
            export(model, config, where, spec, trained_memory)
            for file in TOKENIZER_FILES:
                if (out / file).exists():  # a phase without words has none
                    shutil.copyfile(out / file, where / file)
            seeds = [int(seed) for seed in rng.integers(2**31, 2**62, size=count)]
            episodes = ([arm_episode(spec, i, seed, noise=0.0, tasks=tasks) for i, seed in enumerate(seeds)]
                        if spec.world == METAWORLD
                        else [planar_episode(spec, wording, tasks[i % len(tasks)], seed) for i, seed in enumerate(seeds)])
            assert rollouts is not None  # checked on entry
            driven = rollouts(f"{name}-{tag}{round_}", where, episodes, spec.dagger, policy)
            shutil.rmtree(where)  # its episodes are saved (OUT/demos); the weights of the time are not needed again
            log.dagger.append({"round": round_, "episodes": len(driven),
                               "frames": int(sum(len(d.frames) for d in driven)),
                               "policy_success": float(np.mean([d.success for d in driven])),
                               **({} if tag == "dagger" else {"stage": tag})})
            if spec.world == METAWORLD:
                driven = [replace(demo, prompt=wording.spoken(description(demo.task))) for demo in driven]
            return driven

        return collect

    dagger_collect = collection("dagger", spec.tasks, spec.dagger.episodes, "fifo")
    run("dagger", spec.dagger.steps, lambda step: dagger(
        model, demos, spec.dagger, rng,
        lambda round_: [piece for demo in dagger_collect(round_) for piece in pieces(demo, spec.dagger.window)], step))
    aura_collect = collection("aura", spec.aura.tasks or spec.tasks, spec.aura.dagger_episodes, "aura")
    run("aura", spec.aura.memory_warmup + spec.aura.steps,
        lambda step: train_aura(model, demos, spec.aura, rng, step, aura_collect))
    shutil.rmtree(out / DAGGER_DIR, ignore_errors=True)
    run("dms", spec.dms.steps, lambda step: train_dms(model, demos, spec.dms, rng, step))
    export(model, config, out, spec, trained_memory)
    return log


def planar_episode(spec: TrainSpec, wording: Wording, task: str, seed: int) -> PlanarEpisode:
    """A collection's 2-D episode of ``task`` from ``seed``, told what its demonstration would be told
    (``demos.record_demo``'s wording)."""
    env = CueReachEnv(TaskSpec(name=task), seed)
    prompt = wording.prompt(wording.instruction(env, np.random.default_rng([seed, 3])))
    return PlanarEpisode(task, seed, spec.image_size, spec.chunk, prompt)


def phase_config(spec: TrainSpec, arm_demos: Sequence[Demo] = ()) -> ModelConfig:
    """The model a phase trains: its preset, its frames' size (4 x 4 patches), the action head and chunk it names
    (written to config.json's ``vla.action``, so the engine decodes the chunk) in the world's action (the 2-D
    world's 2-D velocity, the arm's 4-D action), and the state token when it reads one: the odometry normalised by
    the 2-D world's geometry, or the arm's state by its statistics (``arm_state_statistics`` of the phase's
    demonstrations, or of the checkpoint it starts from, whose weights learned those)."""
    config = preset(spec.preset)
    arm = spec.world == METAWORLD
    action = replace(config.action, head=spec.head, chunk=spec.chunk, dof=len(ACTION) if arm else config.action.dof,
                     mlp_hidden=spec.mlp_hidden if spec.head == "mlp" else 0)
    vision = replace(config.vision, image_size=spec.image_size, patch_size=spec.image_size // 4)
    config = replace(config, action=action, vision=vision)
    if spec.state:
        config = replace(config, state=arm_state(spec, arm_demos) if arm else odometry_statistics(TaskSpec()))
    config.validate_vla()
    return config


def arm_state(spec: TrainSpec, demos: Sequence[Demo]) -> StateConfig:
    """The arm's state normalisation: the starting checkpoint's, when it reads the state, else the demonstrations'."""
    if spec.init_from is not None:
        started = load_model_config(spec.init_from).state
        if started is not None:
            return started
    return arm_state_statistics(demos)


def phase_wording(spec: TrainSpec, config: ModelConfig, out: Path) -> Wording:
    """How the phase words its sequences. The tokenizer, when the phase has one, is in ``out`` before any
    sequence is made: the one of the checkpoint it starts from (its embeddings learned those ids), else a new
    one trained on the phase's instructions (``wording.corpus``), or on Meta-World's task descriptions
    (``wording.arm_corpus``), which a ``world: metaworld`` phase always words its episodes with."""
    source = None if spec.init_from is None else Path(spec.init_from)
    arm = spec.world == METAWORLD  # its instruction is always in words: each task's description
    if source is not None and (source / "tokenizer.json").is_file():
        if not spec.instructions and not arm:
            raise ValueError(f"{source} was trained on instructions in words: give the phase its instructions")
        out.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            shutil.copyfile(source / name, out / name)
    elif spec.instructions or arm:
        write_tokenizer(out, arm_corpus() if arm else corpus(spec.instructions), config.vocab_size)
    tokenizer = InstructionTokenizer.load(out, config.vocab_size) if (out / "tokenizer.json").is_file() else None
    return Wording(spec.instructions, spec.prompt_ids, tokenizer)


def load_weights(model: VlaModel, model_dir: Path, fresh_memory: bool = False) -> set[str]:
    """Copy a checkpoint's tensors into ``model`` (all it exports, so every one must be there); its config
    must be the one ``model`` was built with, or that one without the state token, or with another action head.
    ``where_head`` keeps its fresh initialisation: it is training-only and not exported. So do the state
    projection of a model that starts reading the state, the action head of a model whose head (or chunk, or
    hidden width) differs from the checkpoint's (``TrainSpec.head``: linear -> mlp; the decoder's last hidden
    state is what both heads read, so the rest carries over), and the aura memory with ``fresh_memory``
    (``AuraSpec.fresh``) or when the checkpoint's has another feature layout (``memory/aura.py``; a checkpoint
    of an earlier ``vla-edge train``, or one without the state token, which widens the query): that memory
    cannot be carried over, and the aura stage trains this one from its start. A memory the checkpoint lacks
    (no stage trained it: ``export``) stays fresh too. Returns the memories (``MEMORY_GROUPS``) carried over."""
    checkpoint = load_checkpoint(model_dir)
    adds_state = checkpoint.config.state is None and model.c.state is not None
    new_head = checkpoint.config.action != model.c.action
    expected = replace(model.c, state=None if adds_state else model.c.state, action=checkpoint.config.action)
    if checkpoint.config != expected:
        raise ValueError(f"{model_dir}: its config.json differs from the preset this run trains (TrainSpec.preset, "
                         f"TrainSpec.state)")
    state = model.exported_state()
    fresh = (("state_proj.",) if adds_state else ()) + (("action_head.",) if new_head else ())
    if fresh:
        state = {name: tensor for name, tensor in state.items() if not name.startswith(fresh)}
    if fresh_memory or any(checkpoint.tensors[name].shape != tuple(tensor.shape) for name, tensor in state.items()
                           if name.startswith("aura.") and name in checkpoint.tensors):
        state = {name: tensor for name, tensor in state.items() if not name.startswith("aura.")}
    for group in MEMORY_GROUPS:  # a memory no stage trained is not in the checkpoint (``export``): keep it fresh
        if not any(in_group(name, group) for name in checkpoint.tensors):
            state = {name: tensor for name, tensor in state.items() if not in_group(name, group)}
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
    return {group for group in MEMORY_GROUPS if any(in_group(name, group) for name in state)}


def in_group(name: str, group: str) -> bool:
    """Whether tensor ``name`` belongs to the memory policy ``group`` of ``MEMORY_GROUPS``."""
    return name.startswith("aura.") if group == "aura" else ".self_attn.dms_gate." in name


def export(model: VlaModel, config: ModelConfig, out: Path, spec: TrainSpec,
           memory: Collection[str] = MEMORY_GROUPS) -> Path:
    """The model's tensors under their checkpoint names (HF's for the decoder) as an HF directory, with the
    memories of ``memory`` (of ``MEMORY_GROUPS``) only: those a stage trained. An initialisation is never
    written where a policy would read it as learned (dms then scores by key novelty, aura refuses)."""
    left_out = [group for group in MEMORY_GROUPS if group not in memory]
    arrays = {name: tensor.detach().numpy().astype(np.float32) for name, tensor in model.exported_state().items()
              if not any(in_group(name, group) for group in left_out)}
    metadata = {"format": "pt", "producer": "vla-edge train", "seed": str(spec.seed)}
    return write_model(out, config, arrays, spec.dtype, metadata)
