"""What decides one training run's weights: ``TrainSpec`` and one dataclass per stage's knobs, nested in it.

These dataclasses are the recipe file's schema (``recipe.py`` reads a file against them): every field
carries its meaning and range in ``knob`` metadata, so a key's default, type, range and description live
in one place. The rules between fields (a DAgger round that fills half a batch, prompt ids within the
vocabulary, ...) are checked on construction, however a spec is built.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, replace
from typing import Any

from ..model.init_model import PRESETS, STORAGE_DTYPES
from ..runtime.block_costs import parse_cost
from ..worlds.metaworld.camera import CAMERAS
from ..worlds.metaworld.spec import MAX_PATH_LENGTH
from ..worlds.metaworld.tasks import MT10
from ..worlds.metaworld.tasks import TASKS as ARM_TASKS
from .wording import DEFAULT_PROMPT, FIELD

STAGES = ("perception", "bc", "dagger", "aura", "dms")  # in the order they run
# training drives the simulator's 2-D velocity: a preset with a linear head of 2 degrees of freedom
TRAINABLE_PRESETS = tuple(name for name, config in PRESETS.items()
                          if config.action.head == "linear" and config.action.dof == 2)
TRAINABLE_HEADS = ("linear", "mlp")  # the continuous heads (model/action_head.py); bins is not trained here

DEMONSTRATED_TASKS = ("reach", "cue-reach", "lang-reach", "chase")  # the scripted expert demonstrates each
SIM, METAWORLD = "sim", "metaworld"  # the worlds a phase trains on: the package's 2-D world, Meta-World's arm
WORLDS = (SIM, METAWORLD)
WORLD_TASKS = {SIM: DEMONSTRATED_TASKS, METAWORLD: ARM_TASKS}  # each world's scripted experts
ARM_STAGES = ("perception", "bc", "dagger")  # the arm's stages; aura too where the goal is hidden (a memory task)
ROLLOUT_COST = "fixed:encode=8ms,decode=1ms"  # the cycle cost MT10's figures are measured at (docs/metaworld.md)
WORLD_CONFIGS = {SIM: "config/default.yaml", METAWORLD: "config/metaworld.yaml"}  # what each world's robot runs under


def knob(doc: str, default: Any = MISSING, *, minimum: float | None = None, maximum: float | None = None,
         choices: tuple[str, ...] = ()) -> Any:
    """A spec field with what a recipe file's value for it must satisfy (``choices``: of each item, for a tuple)."""
    metadata = {"doc": doc, "minimum": minimum, "maximum": maximum, "choices": choices}
    return field(metadata=metadata) if default is MISSING else field(default=default, metadata=metadata)


@dataclass(frozen=True)
class StageSpec:
    """The optimiser's share of a stage: AdamW for ``steps`` batches of ``batch`` at ``lr`` (5 % warm-up,
    cosine decay to a tenth)."""

    steps: int = knob("optimiser steps", minimum=1, maximum=1_000_000)
    batch: int = knob("samples per step (single frames for perception, sequences or episodes after it)",
                      minimum=1, maximum=4096)
    lr: float = knob("peak learning rate", minimum=1e-9, maximum=1.0)


@dataclass(frozen=True)
class EpisodeStageSpec(StageSpec):
    """A stage trained on sequences of demonstration frames."""

    max_frames: int = knob("frames per training sequence at most (a cue-reach demonstration has <= 99)", 100,
                           minimum=1, maximum=1000)


@dataclass(frozen=True)
class BcSpec(EpisodeStageSpec):
    """Behaviour cloning's sequences: ``EpisodeStageSpec``'s, thinned to the spacing of the engine's cycles."""

    max_stride: int = knob("keep every k-th of a sequence's frames, k drawn in [1, max_stride] per sequence and "
                           "counted back from its last frame: the engine's memory holds its cycles' frames, several "
                           "control ticks apart where a chunk spans many ticks (Meta-World); 1: consecutive frames",
                           1, minimum=1, maximum=1000)


@dataclass(frozen=True)
class DaggerSpec(BcSpec):
    """Behaviour cloning on the policy's own closed-loop episodes beside the demonstrations (DAgger, Ross et al.
    2011): ``rounds`` times, evenly spread, the policy as it is then drives ``episodes`` fresh layouts through the
    runtime as ``vla-edge evaluate`` does, and every step it visits is labelled as a demonstration's is there (the
    2-D world: the expert's chunk; the arm: the expert's plan)."""

    rounds: int = knob("collections of the policy's episodes, evenly spread over the steps, the first at step 0", 2,
                       minimum=1, maximum=1000)
    episodes: int = knob("the policy's episodes per collection, the phase's tasks alternating, on seeds drawn from "
                         "2**31 up (never an evaluation's or a demonstration's)", 100, minimum=1, maximum=100_000)
    window: int = knob("a collected episode is cut into pieces of at most this many steps, each sampled as a "
                       "demonstration is (its sequences end at its last frame): a failed episode runs to the step "
                       "limit, and bc's sequences reach back max_frames x max_stride frames at most", 128,
                       minimum=1, maximum=100_000)
    max_steps: int = knob("world metaworld: a collected episode ends at success or after this many steps "
                          "(evaluate's --max-steps; the 2-D world's end at their task's time limit)",
                          MAX_PATH_LENGTH, minimum=1, maximum=MAX_PATH_LENGTH)
    cost: str = knob("the fixed cost model the collected episodes' cycles are charged (evaluate's --cost)",
                     ROLLOUT_COST)
    config: str = knob("the runtime configuration the policy drives under (evaluate's --config; its model_dir is "
                       "replaced by the weights of the time): relative, against the recipe file, then the package "
                       "share; empty: the world's own (config/default.yaml, config/metaworld.yaml)", "")

    def __post_init__(self) -> None:
        if self.episodes < self.batch // 2:
            raise ValueError(f"dagger.episodes: {self.episodes} episodes a collection cannot fill half a batch of "
                             f"{self.batch} (dagger.batch)")
        if parse_cost(self.cost).fixed_ns is None:
            raise ValueError(f"dagger.cost: the collected episodes run on a fixed cost model (fixed:encode=...ms,"
                             f"decode=...ms), so they do not depend on the machine's load; got {self.cost!r}")


@dataclass(frozen=True)
class AuraSpec(EpisodeStageSpec):
    """How the aura stage trains: the frames' spacing, delta-rule step, write-rate target and penalty; whether
    the decoder learns too (with its own lr and frame-history sequences beside the episodes); whether writes are
    supervised with the privileged cue labels (``stages.write_labels``), after a warm-up of the memory alone;
    and DAgger."""

    max_stride: int = knob("keep every k-th frame, k drawn in [1, max_stride] per sequence: of an aura episode from "
                           "its first (the cue), of train_decoder's frame histories back from their last (as bc's): "
                           "the runtime stores a frame a cycle, every 12 ticks for a 24-action chunk; 1: every frame",
                           1, minimum=1, maximum=1000)
    beta: float = knob("delta-rule step of a write (kv.aura.beta)", 0.5, minimum=1e-6, maximum=1.0)
    rho: float = knob("target write rate: writes above it are penalised", 0.15, minimum=0.0, maximum=1.0)
    penalty: float = knob("weight of the one-sided write-rate penalty", 1.0, minimum=0.0, maximum=1000.0)
    train_decoder: bool = knob("the decoder, encoder and heads learn with the memory (else aura.* alone)", False)
    bc_batch: int = knob("train_decoder: frame-history sequences per step as bc draws them, so the decoder keeps "
                         "serving the KV policies (0: none)", 4, minimum=0, maximum=4096)
    decoder_lr: float = knob("train_decoder: the decoder's, encoder's and heads' learning rate", 1e-3,
                             minimum=1e-9, maximum=1.0)
    cue_writes: bool = knob("privileged write labels where the cue appears: writes forced on them first, then "
                            "the gate decides, its BCE toward them annealed to 0", False)
    forced_fraction: float = knob("cue_writes: share of the steps whose writes are forced, below 1", 0.5,
                                  minimum=0.0, maximum=1.0)
    label_weight: float = knob("cue_writes: weight of the gate's BCE toward the labels at the start", 1.0,
                               minimum=0.0, maximum=1000.0)
    memory_goal: float = knob("weight of the goal's position regressed from the memory token (0: off)", 0.0,
                              minimum=0.0, maximum=1000.0)
    memory_warmup: int = knob("cue_writes: steps of aura.* alone on that regression before the stage's steps", 0,
                              minimum=0, maximum=1_000_000)
    dagger_episodes: int = knob("closed-loop episodes of the policy per collection, half of each batch (0: off): the "
                                "weights of the time drive fresh layouts through the runtime with their aura memory, "
                                "as evaluate's aura row, under dagger.config at dagger.cost", 0, minimum=0,
                                maximum=4096)
    dagger_rounds: int = knob("dagger_episodes: collections, evenly spread, the first at step 0", 4,
                              minimum=1, maximum=1000)
    fresh: bool = knob("the memory starts from its initialisation, not from the weights the phase starts from",
                       False)
    tasks: tuple[str, ...] = knob("the tasks of the aura episodes, its warm-up and DAgger (empty: the phase's); "
                                  "train_decoder's frame histories keep every task of the phase", (),
                                  choices=DEMONSTRATED_TASKS + ARM_TASKS)

    def __post_init__(self) -> None:
        if self.forced_fraction >= 1:
            raise ValueError(f"aura.forced_fraction must be below 1 (the gate must decide the last steps), got "
                             f"{self.forced_fraction}")
        if self.memory_warmup and not self.cue_writes:
            raise ValueError("aura.memory_warmup needs aura.cue_writes: the warm-up writes where the cue labels say")
        if 0 < self.dagger_episodes < self.batch // 2:
            raise ValueError(f"aura.dagger_episodes: {self.dagger_episodes} episodes a round cannot fill half a "
                             f"batch of {self.batch} (aura.batch)")


@dataclass(frozen=True)
class DmsSpec(EpisodeStageSpec):
    """How the dms gates train: the window their decisions wait out, the compression they aim at."""

    window: int = knob("recent tokens always readable (kv.dms.window)", 32, minimum=1, maximum=8192)
    target_ratio: float = knob("tokens seen per token kept (kv.dms.target_ratio)", 4.0, minimum=1.0, maximum=1000.0)
    penalty: float = knob("weight of the one-sided keep-rate penalty", 1.0, minimum=0.0, maximum=1000.0)


@dataclass(frozen=True)
class MetaWorldSpec:
    """How a ``world: metaworld`` phase records its demonstrations (``train/arm_demos.py``)."""

    camera: str = knob("the camera the frames come from (evaluate drives the arm with corner2's)", "corner2",
                       choices=CAMERAS)
    noise: float = knob("std of the correlated noise added to the expert's displacement while recording (DART); every "
                        "frame is still labelled with the clean expert's plan from the state it shows (0: plain "
                        "behaviour cloning, the expert's own path)", 0.0, minimum=0.0, maximum=1.0)
    goal_shown_s: float | None = knob("the goal marker drawn for the first seconds of every episode only, in the "
                                      "demonstrations and the policy's own episodes (evaluate's --goal-shown-s: "
                                      "the memory variant, which the aura stage trains for); None: always drawn",
                                      None, minimum=0.0, maximum=10.0)


@dataclass(frozen=True)
class TrainSpec:
    """Everything that decides the trained weights of one phase. Defaults: ~30 min on a 2-core x86 CPU (the
    aura stage, unrolled frame by frame, ~1.4 s a step)."""

    seed: int = knob("seeds the demonstrations, the fresh weights and every sampled batch", 0,
                     minimum=0, maximum=2**32 - 1)
    world: str = knob("the world the demonstrations come from: sim (the 2-D world) or metaworld (Meta-World's arm: "
                      "4-D action and state, each task's description as the instruction)", SIM, choices=WORLDS)
    preset: str = knob("the model's shape (model/init_model.py)", "sim", choices=TRAINABLE_PRESETS)
    image_size: int = knob("the frames' side in pixels, cut into 4 x 4 patches (16 tokens a frame)", 64,
                           minimum=16, maximum=256)
    blind: bool = knob("the frame encoder's pixel weights held at zero, so every frame gives the same tokens: a "
                       "state-only baseline in the checkpoint format of the camera policy (needs state)", False)
    dtype: str = knob("storage dtype of model.safetensors", "bfloat16", choices=STORAGE_DTYPES)
    head: str = knob("the action head: linear (one action a cycle, tanh(W h + b), MSE) or mlp (OpenVLA-OFT's "
                     "continuous chunk head, L1); a phase whose head differs from its checkpoint's starts the "
                     "head afresh", "linear", choices=TRAINABLE_HEADS)
    chunk: int = knob("actions per cycle, one control period apart (vla.action.chunk): 1 for linear", 1,
                      minimum=1, maximum=1024)
    mlp_hidden: int = knob("the mlp head's hidden width (vla.action.mlp_hidden); mlp only", 128,
                           minimum=1, maximum=65536)
    prompt_ids: tuple[int, ...] = knob("instruction tokens every sequence starts with", DEFAULT_PROMPT,
                                       minimum=0, maximum=1_000_000)
    instructions: tuple[str, ...] = knob(
        "instruction templates with {color} (train/wording.py): each episode's prompt is one of them, "
        "chat-templated by the checkpoint's tokenizer (trained on them unless the phase starts from a checkpoint "
        "with one), lang-reach's naming its goal; empty: every sequence starts with prompt_ids", ())
    state: bool = knob("the model reads the robot's odometry as one token after each frame (vla.state)", False)
    tasks: tuple[str, ...] = knob("the demonstrations alternate between these tasks (the world's: the 2-D world's, or "
                                  "Meta-World's names)", ("reach", "cue-reach"),
                                  choices=DEMONSTRATED_TASKS + ARM_TASKS)
    episodes: int = knob("scripted-expert demonstrations for bc, aura and dms", 1200, minimum=1, maximum=100_000)
    stages: tuple[str, ...] = knob("the stages that run, always in the order perception, bc, dagger, aura, dms",
                                   tuple(stage for stage in STAGES if stage != "dagger"), choices=STAGES)
    init_from: str | None = knob("checkpoint whose weights the phase starts from (None: fresh weights)", None)
    perception: StageSpec = knob("single frames that show what to do", StageSpec(steps=1000, batch=64, lr=1e-3))
    bc: BcSpec = knob("behaviour cloning on whole and partial episodes", BcSpec(steps=900, batch=4, lr=1e-3))
    dagger: DaggerSpec = knob("bc on the policy's own closed-loop episodes beside the demonstrations",
                              DaggerSpec(steps=2000, batch=8, lr=3e-4, max_frames=16, max_stride=24))
    aura: AuraSpec = knob("the aura memory (and with train_decoder the decoder)",
                          AuraSpec(steps=500, batch=8, lr=3e-3))
    dms: DmsSpec = knob("the dms gates on the frozen decoder", DmsSpec(steps=100, batch=2, lr=2e-2, max_frames=64))
    metaworld: MetaWorldSpec = knob("world metaworld: how its demonstrations are recorded", MetaWorldSpec())

    def __post_init__(self) -> None:
        if len(set(self.stages)) != len(self.stages):
            raise ValueError(f"stages: each stage at most once, got {list(self.stages)}")
        if self.head == "linear" and self.chunk != 1:
            raise ValueError(f"chunk: the linear head gives one action a cycle, got chunk {self.chunk}; a chunk "
                             f"needs head: mlp")
        vocabulary = PRESETS[self.preset].vocab_size
        if max(self.prompt_ids, default=0) >= vocabulary:
            raise ValueError(f"prompt_ids: every id must be below the vocabulary size {vocabulary} of preset "
                             f"{self.preset!r}, got {max(self.prompt_ids)}")
        if self.episodes < self.demo_batch:
            raise ValueError(f"episodes: {self.episodes} demonstrations cannot fill a batch of {self.demo_batch} "
                             f"distinct ones")
        for template in self.instructions:
            if template.count(FIELD) != 1:
                raise ValueError(f"instructions: each template holds {FIELD} once, got {template!r}")
        if "lang-reach" in self.tasks and not self.instructions:
            raise ValueError("tasks: lang-reach is told its goal in words; give instructions (templates with {color})")
        if not set(self.aura.tasks) <= set(self.tasks):
            raise ValueError(f"aura.tasks: the aura episodes are drawn from the phase's demonstrations ({list(self.tasks)}), "
                             f"got {list(self.aura.tasks)}")
        if self.aura.fresh and "aura" not in self.stages:
            raise ValueError("aura.fresh needs the aura stage: a fresh memory must be trained")
        if self.image_size % 4:
            raise ValueError(f"image_size: a frame is cut into 4 x 4 patches, so its side must be a multiple of 4, got "
                             f"{self.image_size}")
        if self.blind and not self.state:
            raise ValueError("blind: a model that sees no frames needs the robot's state (state: true)")
        self._check_world()

    def _check_world(self) -> None:
        """The rules a world puts on the tasks, stages, instructions and its own knobs."""
        strangers = [task for task in self.tasks if task not in WORLD_TASKS[self.world]]
        if strangers:
            known = "Meta-World's names, e.g. MT10's " if self.world == METAWORLD else ""
            shown = MT10 if self.world == METAWORLD else WORLD_TASKS[self.world]
            raise ValueError(f"tasks: {strangers} are not the {self.world} world's; its scripted experts demonstrate "
                             f"{known}{', '.join(shown)}")
        if self.world == SIM:
            if self.metaworld != MetaWorldSpec():
                raise ValueError("metaworld: its knobs are for world: metaworld")
            if self.dagger.max_steps != MAX_PATH_LENGTH:
                raise ValueError("dagger.max_steps: the 2-D world's episodes end at their task's time limit; "
                                 "max_steps is for world: metaworld")
            return
        hidden = self.metaworld.goal_shown_s is not None
        memory = [stage for stage in self.stages if stage not in ARM_STAGES and not (stage == "aura" and hidden)]
        if memory:
            raise ValueError(f"stages: {memory} learn a memory task; the metaworld world trains {list(ARM_STAGES)}, "
                             f"and aura where metaworld.goal_shown_s hides the goal after its first seconds")
        if self.instructions:
            raise ValueError("instructions: the metaworld world's instruction is each task's description "
                             "(worlds/metaworld DESCRIPTIONS); leave instructions empty")

    @property
    def drives_policy(self) -> bool:
        """Whether a stage collects the policy's own episodes through the runtime (DAgger): the dagger stage, or the
        aura stage with ``aura.dagger_episodes`` (both under ``dagger.config`` at ``dagger.cost``)."""
        return "dagger" in self.stages or ("aura" in self.stages and self.aura.dagger_episodes > 0)

    @property
    def demo_batch(self) -> int:
        """The demonstrations the stages that run need, so that each step draws distinct ones (0: none is
        needed); the tasks alternate, so ``aura.tasks`` has ``len(aura.tasks)`` of every ``len(tasks)``."""
        histories = self.aura.bc_batch if self.aura.train_decoder else 0
        shares = len(self.aura.tasks) or len(self.tasks)
        episodes = -(-self.aura.batch // shares) * len(self.tasks)
        drawn = {"bc": self.bc.batch, "dagger": self.dagger.batch - self.dagger.batch // 2,
                 "aura": max(episodes, histories), "dms": self.dms.batch}
        return max((drawn[name] for name in self.stages if name in drawn), default=0)

    def scaled(self, factor: float) -> TrainSpec:
        """The same spec with every stage's steps, the memory warm-up, the demonstrations and both DAgger's episodes
        scaled, as few as a batch still needs (smoke runs)."""
        def scale(count: int, least: int = 1) -> int:
            return max(least, round(count * factor)) if count else 0

        aura = replace(self.aura, steps=scale(self.aura.steps), memory_warmup=scale(self.aura.memory_warmup),
                       dagger_episodes=scale(self.aura.dagger_episodes, self.aura.batch // 2))
        dagger = replace(self.dagger, steps=scale(self.dagger.steps),
                         episodes=scale(self.dagger.episodes, self.dagger.batch // 2))
        return replace(self, episodes=scale(self.episodes, self.demo_batch),
                       perception=replace(self.perception, steps=scale(self.perception.steps)),
                       bc=replace(self.bc, steps=scale(self.bc.steps)), dagger=dagger, aura=aura,
                       dms=replace(self.dms, steps=scale(self.dms.steps)))
