"""Build a ready engine from validated settings: plan the memory, refuse what cannot fit, load, prefill."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from threadpoolctl import threadpool_limits

from ..config import MemoryKnobs, ObservationKnobs, OutputKnobs, Settings
from ..engine import VlaEngine
from ..kv_store import BlockStore, load_key, load_or_prefill_prompt, model_fingerprint, restore_memory
from ..memory import POLICIES, MemorySite, build_policy, check_knobs
from ..model.backends import resolve_backend
from ..model.budget import MemoryPlan, plan_config, plan_memory, require_fit
from ..model.checkpoint import Checkpoint, load_checkpoint
from ..model.config import ModelConfig
from ..model.instruction import InstructionError, InstructionTokenizer
from ..model.known_models import held_bytes, known_model
from ..model.vl.frames import frame_geometry, with_frame_geometry
from .action_output import check_fits_action
from .robot_state import state_reader

_LOG = logging.getLogger("vla_edge_ros.runtime")


class LoadedEngine(NamedTuple):
    engine: VlaEngine
    plan: MemoryPlan
    store: BlockStore | None
    prompt_from_store: bool = False
    memory_restored: bool = False
    tokenizer: InstructionTokenizer | None = None  # the checkpoint's, for instructions that arrive later


def load_model(settings: Settings) -> Checkpoint:
    """The configured checkpoint (tensor headers; weights memory-mapped) as the runtime sees it: for a VL
    checkpoint, with the frame geometry ``reasoning.vision_max_pixels`` gives it (``model/vl/frames.py``)."""
    node = settings["reasoning"]
    checkpoint = load_checkpoint(Path(node["model_dir"]), allow_nonfinite=node["allow_nonfinite_weights"],
                                 weights=node["weights"], weights_group=node["weights_group"])
    return with_frame_geometry(checkpoint, node["vision_max_pixels"])


def prompt_ids(settings: Settings, checkpoint: Checkpoint) -> np.ndarray:
    """The pinned prompt's token ids: ``reasoning.instruction`` through the checkpoint's tokenizer and chat
    template when it is set and the checkpoint has a tokenizer (``model/instruction.py``), else
    ``reasoning.prompt_token_ids`` (``reads_words`` says which)."""
    node = settings["reasoning"]
    if not reads_words(settings, checkpoint):
        return np.asarray(node["prompt_token_ids"], dtype=np.int32)
    with _reasoning_errors(settings):
        return checkpoint_tokenizer(checkpoint).prompt_ids(node["instruction"], node["instruction_max_tokens"])


def reads_words(settings: Settings, checkpoint: Checkpoint) -> bool:
    """Whether the prompt is ``reasoning.instruction`` (set, and the checkpoint has a tokenizer to read it)
    rather than ``prompt_token_ids``."""
    return bool(settings["reasoning"]["instruction"]) and checkpoint_tokenizer(checkpoint) is not None


def checkpoint_tokenizer(checkpoint: Checkpoint) -> InstructionTokenizer | None:
    """The checkpoint's tokenizer and chat template (None: it has no tokenizer.json), read once per file."""
    return _tokenizer(checkpoint.path, checkpoint.config.vocab_size, _mtime_ns(checkpoint.path / "tokenizer.json"))


@lru_cache(maxsize=4)
def _tokenizer(model_dir: Path, vocab_size: int, mtime_ns: int) -> InstructionTokenizer | None:
    return InstructionTokenizer.load(model_dir, vocab_size)  # mtime_ns: a file changed on disk is read again


def _mtime_ns(path: Path) -> int:
    return path.stat().st_mtime_ns if path.is_file() else 0


def prompt_room(settings: Settings, checkpoint: Checkpoint) -> int:
    """The most tokens the pinned prompt may take: the configured prompt's, or ``instruction_max_tokens``
    when the checkpoint can read instructions (one may arrive while the robot runs)."""
    tokens = len(prompt_ids(settings, checkpoint))
    if checkpoint_tokenizer(checkpoint) is None:
        return tokens
    return max(tokens, settings["reasoning"]["instruction_max_tokens"])


def plan_for(settings: Settings, checkpoint: Checkpoint | None = None) -> tuple[MemoryPlan, Checkpoint]:
    """The memory plan of the reasoning node's configuration (reads tensor headers only). ``checkpoint``:
    already loaded, by ``load_model`` or plain (a VL checkpoint gets its frame geometry here either way)."""
    node = settings["reasoning"]
    checkpoint = (with_frame_geometry(checkpoint, node["vision_max_pixels"]) if checkpoint is not None
                  else load_model(settings))
    largest = max(checkpoint.config.observation_tokens, prompt_room(settings, checkpoint))
    plan = plan_memory(checkpoint, resolve_backend(node["backend"]), node["kv_capacity_tokens"],
                       node["budget_bytes"], largest, node["kv_page_tokens"], node["kv_pool_pages"])
    return plan, checkpoint


def plan_known(settings: Settings, name: str) -> tuple[MemoryPlan, ModelConfig]:
    """The memory plan of known checkpoint ``name`` (``model/known_models.py``) under this configuration, as
    the cuda backend would hold it (``reasoning.weights``: auto keeps their bf16); the config at the configured
    frame geometry."""
    node = settings["reasoning"]
    config, processing = known_model(name)
    config = replace(config, vision=frame_geometry(processing, node["vision_max_pixels"]))
    weights, tower = held_bytes(config, node["weights"], node["weights_group"])
    prompt = node["instruction_max_tokens"] if node["instruction"] else len(node["prompt_token_ids"])
    largest = max(config.observation_tokens, prompt)  # no tokenizer without the checkpoint: its bound
    plan = plan_config(config, "cuda", weights, tower,
                       node["kv_capacity_tokens"], node["budget_bytes"], largest, node["kv_page_tokens"],
                       node["kv_pool_pages"])
    return plan, config


def open_kv_store(node: dict[str, Any], checkpoint: Checkpoint) -> BlockStore | None:
    """The configured KV block store bound to this checkpoint, or None when ``kv_store.dir`` is empty.

    A directory bound to another key, or to the other mode, raises StoreBindingError (a ValueError,
    with what to do about it) before anything in it is read or written: the node does not start."""
    if not node["kv_store.dir"]:
        return None
    aes_key = None
    if node["kv_store.encryption"] == "aes-256-gcm":
        aes_key = load_key(node["kv_store.key_file"], node["kv_store.key_env"])
    else:
        _LOG.warning("KV store %s is configured without encryption: blocks are stored in plain text",
                     node["kv_store.dir"])
    return BlockStore(node["kv_store.dir"], model_fingerprint(checkpoint), aes_key=aes_key,
                      budget_bytes=node["kv_store.budget_bytes"], min_free_bytes=node["kv_store.min_free_bytes"])


@contextmanager
def _reasoning_errors(settings: Settings) -> Iterator[None]:
    """A ValueError inside names the file and the reasoning node."""
    try:
        yield
    except ValueError as exc:
        raise ValueError(f"{settings.source}: reasoning: {exc}") from exc


def check_observation(knobs: ObservationKnobs, checkpoint: Checkpoint) -> None:
    """ValueError unless the configured observation is the one the checkpoint reads: as many cameras, a state
    topic exactly when it has a state projection, and a state of its length."""
    config, path = checkpoint.config, checkpoint.path
    if knobs.cameras != config.cameras:
        raise ValueError(f"{path} sees {config.cameras} camera{'s' if config.cameras > 1 else ''} per observation "
                         f"(vla.cameras), the configuration names {knobs.cameras} (image_topic and "
                         f"{len(knobs.extra_image_topics)} extra_image_topics)")
    if config.state is None:
        if knobs.state_topic:
            raise ValueError(f"state_topic is {knobs.state_topic!r}, but {path} reads no robot state (it has no "
                             "state_proj): clear state_topic, or use a checkpoint trained with the state")
        return
    if not knobs.state_topic:
        raise ValueError(f"{path} reads a robot state of {config.state.dim} values (state_proj, vla.state): set "
                         "state_topic to the robot's sensor_msgs/JointState or nav_msgs/Odometry topic")
    reader = state_reader(knobs.state_type, knobs.state_joint_names, knobs.state_joint_velocities)
    if reader.dim != config.state.dim:
        what = ("odometry gives x, y, yaw, vx, vy, wz" if knobs.state_type == "odometry" else
                f"{len(knobs.state_joint_names)} state_joint_names" + (", with velocities" if
                                                                      knobs.state_joint_velocities else ""))
        raise ValueError(f"{path} reads a state of {config.state.dim} values, state_type {knobs.state_type} gives "
                         f"{reader.dim} ({what})")


def check_settings(settings: Settings, checkpoint: Checkpoint, policies: Iterable[str] = POLICIES) -> None:
    """ValueError for what the settings ask of this checkpoint that it cannot do: an observation it does not
    read (``check_observation``), prompt ids beyond its vocabulary, commands its action does not fit, an arena
    or ``kv.*`` knobs a policy in ``policies`` cannot run with (an arena without room for one frame names
    ``kv_capacity_tokens``). Shapes only: ``load_engine`` checks this before building anything, and
    ``vla-edge plan`` refuses what it refuses."""
    try:
        check_observation(ObservationKnobs.of(settings["camera_subscriber"]), checkpoint)
    except ValueError as exc:
        raise ValueError(f"{settings.source}: camera_subscriber: {exc}") from exc
    node = settings["reasoning"]
    prompt = prompt_ids(settings, checkpoint)
    vocab = checkpoint.config.vocab_size
    if any(t >= vocab for t in prompt):
        raise ValueError(f"{settings.source}: reasoning.prompt_token_ids has ids >= vocab_size {vocab}")
    try:
        check_fits_action(OutputKnobs.of(settings["action_publisher"]), checkpoint.config.action.dof)
    except ValueError as exc:
        raise ValueError(f"{settings.source}: action_publisher: {exc} (the model's action has "
                         f"{checkpoint.config.action.dof} dimensions)") from exc
    with _reasoning_errors(settings):
        site = MemorySite(checkpoint, node["kv_capacity_tokens"], prompt_room(settings, checkpoint),
                          node["kv_page_tokens"], node["kv_pool_pages"])
        check_knobs(MemoryKnobs.of(node), site, policies)


def load_engine(settings: Settings, policies: Iterable[str] = POLICIES, checkpoint: Checkpoint | None = None
                ) -> LoadedEngine:
    """Plan, check the budget and ``check_settings``, load the engine, prefill (or load) the pinned prompt,
    warm up, restore memory.

    The ``kv.*`` knobs of every policy in ``policies`` are checked against this arena, not only the
    configured one's: a live node may switch to any of them at the next episode. An offline run that
    sizes the arena for one policy (evaluate's budgets) checks that policy alone. ``checkpoint``: the
    model's weights, already loaded (a worker that builds many engines reads them once)."""
    node = settings["reasoning"]
    plan, checkpoint = plan_for(settings, checkpoint)
    require_fit(plan)
    check_settings(settings, checkpoint, policies)
    if node["blas_threads"]:
        threadpool_limits(limits=node["blas_threads"], user_api="blas")  # process-wide, from here on
    from ..cpu_kernels import set_threads  # here, not above: numba is heavy, and a command refused early never needs it

    set_threads(node["kernel_threads"])  # process-wide too
    prompt = prompt_ids(settings, checkpoint)
    with _reasoning_errors(settings):
        engine = VlaEngine(checkpoint, backend=plan.backend, kv_capacity_tokens=node["kv_capacity_tokens"],
                           policy=build_policy(MemoryKnobs.of(node)), kv_page_tokens=node["kv_page_tokens"],
                           kv_pool_pages=node["kv_pool_pages"])
        store = open_kv_store(node, checkpoint)
    from_store = restored = False
    if store is not None and node["kv_store.prompt"]:
        from_store = load_or_prefill_prompt(engine, store, prompt)
    else:
        engine.set_prompt(prompt)
    invalid = engine.warm_up()
    if invalid:
        _LOG.error("the warm-up cycle on a blank frame gave no action: %s; every cycle whose output is not finite "
                   "is refused and counted as invalid", invalid)
    if store is not None and node["kv_store.memory"]:
        restored = restore_memory(engine, store, node["kv_store.memory_name"])
    return LoadedEngine(engine, plan, store, from_store, restored, checkpoint_tokenizer(checkpoint))
