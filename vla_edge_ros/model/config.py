"""Model configuration: the Qwen2 fields of a HuggingFace ``config.json`` plus our VLA section.

Only what the engine actually implements is accepted. Anything that would change the forward pass
in a way we do not reproduce (another model type, rope scaling, sliding-window attention) is refused
here with the offending key named, so a checkpoint can never run silently wrong.

A Qwen2-VL / Qwen2.5-VL ``config.json`` (``model_type`` qwen2_vl / qwen2_5_vl, either layout) gives the
decoder's fields from its text part and the tower and M-RoPE in ``ModelConfig.vl`` (``vl/config.py``);
a plain Qwen2 checkpoint has ``vl`` None.

An observation is what one cycle prefills: each of the checkpoint's ``vla.cameras`` frames
(``tokens_per_frame`` tokens each, the primary camera's first), then, when the checkpoint reads the
robot's state (``vla.state``), one state token. ``observation_tokens`` is that count: the unit the memory
policies keep or evict and the memory plan sizes. A checkpoint without the two keys sees one camera and
no state, as every checkpoint did before them.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .config_error import ModelConfigError
from .vl.config import VL_FAMILIES, VlConfig, split_vl_config

NUM_ACTION_BINS = 256
ACTION_HEADS = ("bins", "linear", "mlp")
MAX_CHUNK = 1024  # actions a chunk may hold (a 1 s chunk at 1 kHz)


@dataclass(frozen=True)
class VisionConfig:
    """Frame encoder geometry: image -> patches -> pooled ``tokens_per_frame`` embeddings."""

    image_size: int = 64
    patch_size: int = 8
    tokens_per_frame: int = 16
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @property
    def patch_dim(self) -> int:
        return self.patch_size * self.patch_size * 3

    @property
    def pool_grid(self) -> int:
        """Side of the square grid of pooled tokens (tokens_per_frame = pool_grid ** 2)."""
        return math.isqrt(self.tokens_per_frame)


@dataclass(frozen=True)
class ActionConfig:
    """How the last hidden state becomes a robot action, or a chunk of ``chunk`` future actions (H)."""

    head: str = "bins"  # "bins" (OpenVLA-style tokens), "linear" (continuous) or "mlp" (continuous chunk)
    dof: int = 7
    q01: tuple[float, ...] = ()
    q99: tuple[float, ...] = ()
    normalize_mask: tuple[bool, ...] = ()
    chunk: int = 1  # H: actions per inference, one control period apart (linear: 1)
    mlp_hidden: int = 0  # the mlp head's hidden width (its fc1 rows); only the mlp head has one

    def bounds(self) -> tuple[tuple[float, ...], tuple[float, ...], tuple[bool, ...]]:
        """Per-dimension (q01, q99, mask), defaulting to the identity map on [-1, 1]."""
        q01 = self.q01 or (-1.0,) * self.dof
        q99 = self.q99 or (1.0,) * self.dof
        mask = self.normalize_mask or (True,) * self.dof
        return q01, q99, mask


@dataclass(frozen=True)
class StateConfig:
    """The robot's state as the checkpoint reads it: ``dim`` values, each normalised as (x - mean) / std (mean 0
    and std 1 when left out), then projected by ``state_proj`` into one token."""

    dim: int
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()


MAX_CAMERAS = 16


@dataclass(frozen=True)
class ModelConfig:
    """Everything the engine needs to know about a Qwen2-family checkpoint."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    vision: VisionConfig = field(default_factory=VisionConfig)
    action: ActionConfig = field(default_factory=ActionConfig)
    vl: VlConfig | None = None  # the ViT tower and M-RoPE of a Qwen2-VL / Qwen2.5-VL checkpoint
    cameras: int = 1  # frames per observation (vla.cameras)
    state: StateConfig | None = None  # the robot's state token (vla.state); None: the model reads no state

    @property
    def observation_tokens(self) -> int:
        """Tokens one observation prefills: every camera's frame, then the state token if the model reads one."""
        return self.cameras * self.vision.tokens_per_frame + int(self.state is not None)

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def validate(self) -> None:
        """Refuse shapes that cannot form a valid grouped-query attention model."""
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "vocab_size", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ModelConfigError(f"config.json: {name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelConfigError(
                f"config.json: num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ModelConfigError(f"config.json: head_dim must be even for RoPE, got {self.head_dim}")
        if self.vl is not None:
            self.vl.validate(self.hidden_size, self.head_dim, self.vocab_size)

    def validate_vla(self) -> None:
        """Refuse a frame encoder or action head that cannot work with this decoder. A VL checkpoint's frame
        encoder is its vision tower, whose frame geometry the runtime derives (``vl/frames.py``)."""
        vision = self.vision
        if self.vl is None and vision.pool_grid ** 2 != vision.tokens_per_frame:
            raise ModelConfigError(
                f"config.json: vla.vision.tokens_per_frame must be a square, got {vision.tokens_per_frame}")
        patches_per_side = vision.image_size // vision.patch_size
        if self.vl is None and (vision.image_size % vision.patch_size or patches_per_side % vision.pool_grid):
            raise ModelConfigError(
                "config.json: vla.vision.image_size must be a multiple of patch_size, and the patch grid "
                f"({patches_per_side}) a multiple of sqrt(tokens_per_frame) ({vision.pool_grid})")
        action = self.action
        self._validate_head(action)
        if action.head == "bins" and self.vocab_size < NUM_ACTION_BINS:
            raise ModelConfigError(f"config.json: a 'bins' action head needs vocab_size >= {NUM_ACTION_BINS}")
        for name in ("q01", "q99", "normalize_mask"):
            values = getattr(action, name)
            if values and len(values) != action.dof:
                raise ModelConfigError(f"config.json: vla.action.{name} has {len(values)} entries, dof is {action.dof}")
        for name, values in (("vision.mean", vision.mean), ("vision.std", vision.std),
                             ("action.q01", action.q01), ("action.q99", action.q99)):
            if not all(math.isfinite(v) for v in values):
                raise ModelConfigError(f"config.json: vla.{name} must hold finite numbers, got {list(values)}")
        if any(v <= 0 for v in vision.std):
            raise ModelConfigError(f"config.json: vla.vision.std must be positive, got {list(vision.std)}")
        q01, q99, _ = action.bounds()
        if any(lo >= hi for lo, hi in zip(q01, q99)):
            raise ModelConfigError("config.json: vla.action.q01 must be below q99 in every dimension")
        if not 1 <= self.cameras <= MAX_CAMERAS:
            raise ModelConfigError(f"config.json: vla.cameras must be 1 to {MAX_CAMERAS}, got {self.cameras}")
        if self.state is not None:
            self._validate_state(self.state)

    @staticmethod
    def _validate_head(action: ActionConfig) -> None:
        """The head, its chunk length H and (mlp) hidden width: ``linear`` gives one action a cycle; ``bins`` decodes
        a chunk of H > 1 in parallel (``action_head.py``)."""
        if action.head not in ACTION_HEADS:
            raise ModelConfigError(f"config.json: vla.action.head must be one of {list(ACTION_HEADS)}, "
                                   f"got {action.head!r}")
        for name, low, high in (("dof", 1, 4096), ("chunk", 1, MAX_CHUNK), ("mlp_hidden", 0, 1 << 20)):
            value = getattr(action, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ModelConfigError(f"config.json: vla.action.{name} must be an integer from {low} to {high}, "
                                       f"got {value!r:.40}")
        if action.head == "linear" and action.chunk != 1:
            raise ModelConfigError(f"config.json: vla.action.chunk is {action.chunk}, but the 'linear' head "
                                   "gives one action a cycle (chunk 1); a chunk needs the 'mlp' or 'bins' head")
        if (action.head == "mlp") != (action.mlp_hidden > 0):
            raise ModelConfigError("config.json: vla.action.mlp_hidden (the mlp head's hidden width) must be set for "
                                   f"the 'mlp' head and only for it, got {action.mlp_hidden} with head {action.head!r}")

    @staticmethod
    def _validate_state(state: StateConfig) -> None:
        if state.dim < 1:
            raise ModelConfigError(f"config.json: vla.state.dim must be at least 1, got {state.dim}")
        for name in ("mean", "std"):
            values = getattr(state, name)
            if values and len(values) != state.dim:
                raise ModelConfigError(f"config.json: vla.state.{name} has {len(values)} entries, dim is {state.dim}")
            if not all(math.isfinite(v) for v in values):
                raise ModelConfigError(f"config.json: vla.state.{name} must hold finite numbers, got {list(values)}")
        if any(v <= 0 for v in state.std):
            raise ModelConfigError(f"config.json: vla.state.std must be positive, got {list(state.std)}")

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` content HuggingFace ``Qwen2Config`` reads (plus our ``vla`` section); with ``vl``,
        what ``Qwen2VLConfig`` / ``Qwen2_5_VLConfig`` read, in the hub's flat layout."""
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "use_sliding_window": False,
            "attention_dropout": 0.0,
            "vla": self._vla_dict(),
            **(self.vl.to_hf_dict() if self.vl is not None else {}),
        }


    def _vla_dict(self) -> dict[str, Any]:
        """Our ``vla`` section; ``cameras``, ``state``, the action's ``chunk`` and ``mlp_hidden`` only when they differ
        from one camera, no state, one action and no hidden layer, so a checkpoint without them is written (and
        fingerprinted) as before they existed."""
        vla: dict[str, Any] = {} if self.vl is not None else {"vision": asdict(self.vision)}
        vla["action"] = {key: value for key, value in asdict(self.action).items()
                         if not (key == "chunk" and value == 1 or key == "mlp_hidden" and not value)}
        if self.cameras != 1:
            vla["cameras"] = self.cameras
        if self.state is not None:
            vla["state"] = asdict(self.state)
        return vla


_UNSUPPORTED_IF_SET = {
    "rope_scaling": "rope scaling (YaRN/dynamic/linear) is not implemented",
    "use_sliding_window": "sliding-window attention is not implemented",
}


def _required(raw: dict[str, Any], key: str, source: Path) -> Any:
    if key not in raw:
        raise ModelConfigError(f"{source}: missing required key {key!r}")
    return raw[key]


def _rope_theta(raw: dict[str, Any]) -> float:
    """rope_theta lives at the top level in older configs and under rope_parameters in newer ones."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict):
        kind = params.get("rope_type", "default")
        if kind != "default":
            raise ModelConfigError(f"config.json: rope_parameters.rope_type {kind!r} is not implemented")
        if "rope_theta" in params:
            return float(params["rope_theta"])
    return float(raw.get("rope_theta", 10000.0))


def _vla_section(raw: dict[str, Any], source: Path) -> tuple[VisionConfig, ActionConfig, int, StateConfig | None]:
    section = raw.get("vla", {})
    if not isinstance(section, dict):
        raise ModelConfigError(f"{source}: 'vla' must be a mapping")
    cameras = section.get("cameras", 1)
    if isinstance(cameras, bool) or not isinstance(cameras, int):
        raise ModelConfigError(f"{source}: vla.cameras must be an integer, got {cameras!r}")
    state = section.get("state")
    if state is not None and (not isinstance(state, dict) or isinstance(state.get("dim"), bool)
                              or not isinstance(state.get("dim"), int)):
        raise ModelConfigError(f"{source}: vla.state must be a mapping with an integer dim, got {state!r:.80}")
    try:
        vision = dict(section.get("vision", {}))
        for key in ("mean", "std"):
            if key in vision:
                vision[key] = tuple(float(x) for x in vision[key])
        action = dict(section.get("action", {}))
        for key in ("q01", "q99"):
            if key in action:
                action[key] = tuple(float(x) for x in action[key])
        if "normalize_mask" in action:
            action["normalize_mask"] = tuple(bool(x) for x in action["normalize_mask"])
        if state is not None:
            state = StateConfig(**{key: tuple(float(x) for x in value) if key in ("mean", "std") else value
                                   for key, value in state.items()})
        return VisionConfig(**vision), ActionConfig(**action), cameras, state
    except TypeError as exc:  # unknown key in the section
        raise ModelConfigError(f"{source}: bad 'vla' section: {exc}") from exc


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Read and validate ``model_dir/config.json`` (Qwen2, or Qwen2-VL / Qwen2.5-VL in either layout)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelConfigError(f"model directory {model_dir} does not exist")
    source = model_dir / "config.json"
    if not source.is_file():
        raise ModelConfigError(f"{source} not found: not a HuggingFace model directory")
    try:
        raw = json.loads(source.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{source}: not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{source}: top level must be a JSON object")
    return parse_model_config(raw, source)


def parse_model_config(raw: dict[str, Any], source: Path) -> ModelConfig:
    """Validate a parsed ``config.json`` (``source`` names it in errors)."""
    model_type = raw.get("model_type")
    if model_type in VL_FAMILIES:
        text, vl = split_vl_config(raw, source)
    elif model_type == "qwen2":
        text, vl = raw, None
    else:
        raise ModelConfigError(
            f"{source}: model_type {model_type!r} is not supported (only 'qwen2', {', '.join(map(repr, VL_FAMILIES))})")
    for key, why in _UNSUPPORTED_IF_SET.items():
        if text.get(key):
            raise ModelConfigError(f"{source}: {key}={text[key]!r} set, but {why}")
    hidden_act = text.get("hidden_act", "silu")
    if hidden_act != "silu":
        raise ModelConfigError(f"{source}: hidden_act {hidden_act!r} is not supported (only 'silu')")
    heads = int(_required(text, "num_attention_heads", source))
    hidden = int(_required(text, "hidden_size", source))
    vision, action, cameras, state = _vla_section(raw, source)
    config = ModelConfig(
        hidden_size=hidden,
        intermediate_size=int(_required(text, "intermediate_size", source)),
        num_hidden_layers=int(_required(text, "num_hidden_layers", source)),
        num_attention_heads=heads,
        num_key_value_heads=int(text.get("num_key_value_heads") or heads),
        vocab_size=int(_required(text, "vocab_size", source)),
        head_dim=int(text.get("head_dim") or hidden // max(heads, 1)),
        rope_theta=_rope_theta(text),
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
        max_position_embeddings=int(text.get("max_position_embeddings", 32768)),
        vision=vision,
        action=action,
        vl=vl,
        cameras=cameras,
        state=state,
    )
    config.validate()
    return config
