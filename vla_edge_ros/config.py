"""The one configuration schema: every knob, its type, range, description and whether it may change live.

The YAML file uses the ROS 2 parameter-file layout (``node_name: {ros__parameters: {...}}``) so the
same file feeds ``ros2 launch``, the ROS-free command line and the tests. It is validated here and
only here: unknown keys, wrong types and out-of-range values are errors that name the key and file.
The ROS layer declares exactly these parameters, with these descriptions and ranges.
"""

from __future__ import annotations

import dataclasses
import math
import os
import reprlib
import stat
import sys
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml
from yaml.composer import Composer
from yaml.nodes import MappingNode, Node

PACKAGE = "vla_edge_ros"
EXECUTIONS = ("auto", "sync", "chunk", "ensemble", "rtc")  # action_publisher.execution: how chunks become commands


class ConfigError(ValueError):
    """A configuration file or value that does not satisfy the schema."""


# What bad input raises anywhere in the package: every error of ours about a file, a value or a model is a
# ValueError (ConfigError, CheckpointError, BagError, ...), and the system's are OSErrors. An entry point
# turns these into one line and exit code 2; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, OSError)

_REPR = reprlib.Repr()  # a value in a message: a few items, levels and characters of it, whatever its size
_REPR.maxlevel = _REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4
_REPR.maxstring = _REPR.maxlong = _REPR.maxother = 40
SHOWN_CHARS = 80


def shown(value: Any) -> str:
    """``value`` as an error message shows it: the start of its repr. A config value may be a megabyte long
    (or, built from YAML aliases, billions of items), and the message that refuses it must stay one short
    line, cheap to build."""
    return _cut(_REPR.repr(value))


def _cut(text: str) -> str:
    """At most SHOWN_CHARS characters of ``text`` (a name or a parser's words about a file may be long too)."""
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


@dataclass(frozen=True)
class Param:
    """One declared parameter."""

    name: str
    default: Any
    description: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str | int, ...] = ()
    read_only: bool = True
    item: type | None = None  # element type of a list parameter: int, float or str
    items: tuple[int, int] = (1, 1024)  # a list parameter's allowed length, inclusive
    path: bool = False  # a file or directory: relative values resolve against the YAML file, then the share

    @property
    def kind(self) -> type:
        return type(self.default)

    def check(self, value: Any, where: str) -> Any:
        """Return ``value`` coerced to this parameter's type, or raise ConfigError saying why."""
        if self.kind is list:
            # ROS hands array parameters over as array.array, YAML as list: any non-text sequence will do
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise ConfigError(f"{where}: {self.name} must be a list of {self.item.__name__}, got {shown(value)}")
            low, high = self.items
            if not low <= len(value) <= high:
                wanted = f"{low}" if low == high else f"{low} to {high}"
                raise ConfigError(f"{where}: {self.name} must have {wanted} values, got {len(value)}")
            return [self._check_one(v, self.item, where, f"{self.name}[{i}]") for i, v in enumerate(value)]
        return self._check_one(value, self.kind, where, self.name)

    def _check_one(self, value: Any, kind: type, where: str, label: str) -> Any:
        given = value
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            try:
                value = float(value)  # `deadline_ms: 33` means 33.0
            except OverflowError:  # an integer beyond every float: refused as not finite, shown as written
                value = math.inf
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ConfigError(f"{where}: {label} must be of type {kind.__name__}, got {type(value).__name__} "
                              f"{shown(value)}")
        if kind is float and not math.isfinite(value):
            raise ConfigError(f"{where}: {label} must be a finite number, got {shown(given)}")
        if self.choices and value not in self.choices:
            raise ConfigError(f"{where}: {label} must be one of {list(self.choices)}, got {shown(value)}")
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(f"{where}: {label}={shown(value)} is below the minimum {self.minimum:g}")
        if self.maximum is not None and value > self.maximum:
            raise ConfigError(f"{where}: {label}={shown(value)} is above the maximum {self.maximum:g}")
        return value


SCHEMA: dict[str, tuple[Param, ...]] = {
    "camera_subscriber": (
        Param("image_topic", "camera/image_raw", "sensor_msgs/Image topic (relative names resolve in the node's "
              "namespace, so one per robot); sensor_msgs/CompressedImage is read "
              "from the same name + '/compressed' (image_transport convention)."),
        Param("qos", "sensor_data", "Subscription QoS: sensor_data (best effort, depth 1) or reliable (depth 1).",
              choices=("sensor_data", "reliable")),
        Param("frame_height", 480, "Height of the frame buffer; other frame sizes are resized to it.",
              minimum=8, maximum=8192),
        Param("frame_width", 640, "Width of the frame buffer; other frame sizes are resized to it.",
              minimum=8, maximum=8192),
        Param("stale_warn_ms", 1000.0, "Diagnostics turn WARN when no valid frame arrived for this long.",
              minimum=10.0, maximum=600000.0, read_only=False),
        Param("stale_error_ms", 5000.0, "Diagnostics turn ERROR when no valid frame arrived for this long.",
              minimum=10.0, maximum=600000.0, read_only=False),
        Param("extra_image_topics", [], "More cameras, after image_topic (the primary camera), in the order the "
              "checkpoint reads them (its vla.cameras counts all of them); each is read raw and on + '/compressed' "
              "with qos, and resized to the frame buffer's size. Empty: one camera.", item=str, items=(0, 15)),
        Param("sync_slop_ms", 20.0, "With extra cameras: frames form one observation when their header stamps lie "
              "within this of each other (message_filters' ApproximateTimeSynchronizer's slop). For cameras that "
              "are not triggered together, at least half the slowest camera's period.",
              minimum=0.0, maximum=10000.0),
        Param("state_topic", "", "The robot's state (the checkpoint's vla.state; models/sim reads odometry, "
              "state_type odometry): a sensor_msgs/JointState or nav_msgs/Odometry topic (state_type). Empty: no "
              "state, and a checkpoint that reads one is refused (the simulated robot, replay and evaluate give "
              "it the robot's odometry themselves). Best effort, depth 1 (it matches every publisher)."),
        Param("state_type", "joint_state", "Message on state_topic: joint_state (the positions of "
              "state_joint_names in order, then with state_joint_velocities their velocities) or odometry (x, y, "
              "yaw, vx, vy, wz).", choices=("joint_state", "odometry")),
        Param("state_joint_names", ["joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "joint_6", "gripper"],
              "For joint_state: the joints of the state, in the order the checkpoint reads them; every message "
              "must name them all.", item=str, items=(1, 256)),
        Param("state_joint_velocities", False, "For joint_state: the state also holds each joint's velocity, "
              "after all the positions."),
        Param("state_max_age_ms", 100.0, "An observation takes the state stamped nearest its primary frame only if "
              "that stamp is within this of the frame's (before or after); otherwise there is no observation "
              "(no_state).",
              minimum=1.0, maximum=60000.0),
    ),
    "action_publisher": (
        Param("command_topic", "vla/command", "Topic the commands are published on (relative names resolve in the "
              "node's namespace, so robots in two namespaces never share one)."),
        Param("command_type", "twist", "Message type of the commands.",
              choices=("twist", "float32_multi_array", "joint_trajectory")),
        Param("control_rate_hz", 30.0, "How often the current command is published.",
              minimum=1.0, maximum=1000.0, read_only=False),
        Param("action_timeout_ms", 200.0, "An action older than this is stale: a safe stop is published instead "
              "(zero twist, zero array, or hold position) and diagnostics turn ERROR.",
              minimum=1.0, maximum=60000.0, read_only=False),
        Param("action_min", [-1.0], "Lower clip limit per action dimension (one value applies to all).",
              minimum=-1e6, maximum=1e6, read_only=False, item=float),
        Param("action_max", [1.0], "Upper clip limit per action dimension (one value applies to all).",
              minimum=-1e6, maximum=1e6, read_only=False, item=float),
        Param("twist_dims", [0, 1, -1, -1, -1, -1], "For twist: the action dimension feeding linear.x, linear.y, "
              "linear.z, angular.x, angular.y, angular.z (-1: always zero).", minimum=-1, maximum=4095, item=int,
              items=(6, 6)),
        Param("joint_names", ["joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "joint_6", "gripper"],
              "For joint_trajectory: joint name of each action dimension, in order.", item=str),
        Param("execution", "auto", "How the model's action chunks become one command a tick (action i of a chunk "
              "is for its observation's time + i control periods): sync (the newest action, held while younger "
              "than action_timeout_ms: one action a cycle), chunk (switch to the newest chunk at once), ensemble "
              "(ACT's temporal ensembling: a weighted average of every chunk holding an action for the tick), rtc "
              "(real-time chunking: the new chunk's past actions dropped, those due while it was computed frozen, "
              "its overlap with the running plan blended toward it). auto: rtc for a chunked checkpoint, sync "
              "for one action a cycle. A safe stop when every chunk has run out (starvation).",
              choices=EXECUTIONS, read_only=False),
        Param("execution_horizon", 0, "s: how many of each chunk's actions, from its observation, are executed "
              "before the next chunk should take over; the reasoning gate starts the next cycle so that its chunk is "
              "ready by then. chunk: the chunk's plan ends there (a shorter s starves sooner unless the next chunk "
              "comes in time). rtc and ensemble: the rest of the chunk (H - s actions) is the overlap the next chunk "
              "is blended over, and what runs when it is late. 0: H in chunk, ceil(H / 2) in rtc and ensemble.",
              minimum=0, maximum=1024, read_only=False),
        Param("ensemble_decay", 0.01, "ensemble: chunk j of those holding an action for the tick (0 the oldest) "
              "weighs exp(-ensemble_decay * j), as ACT weighs them; above 0 favours older chunks (smoother), below "
              "0 newer ones.", minimum=-10.0, maximum=10.0, read_only=False),
        Param("chunk_safety.values_are", "auto", "What the action values command, for the velocity and "
              "acceleration limits: positions (velocity = change per second, acceleration = change of that) or "
              "velocities (velocity = the value, acceleration = its change per second). auto: positions for "
              "joint_trajectory, velocities otherwise.", choices=("auto", "positions", "velocities"),
              read_only=False),
        Param("chunk_safety.max_jump", [0.0], "Per action dimension (one value for all): the most a new chunk's "
              "first executed action may differ from the command being executed; 0: no limit. A chunk beyond any "
              "limit is rejected (counted by reason) and execution goes on with the previous one.",
              minimum=0.0, maximum=1e6, read_only=False, item=float),
        Param("chunk_safety.max_step", [0.0], "Per action dimension: the most two consecutive executed actions "
              "of a chunk may differ; 0: no limit.", minimum=0.0, maximum=1e6, read_only=False, item=float),
        Param("chunk_safety.max_velocity", [0.0], "Per action dimension, in units per second: the most velocity "
              "a chunk may command (see chunk_safety.values_are); 0: no limit.", minimum=0.0, maximum=1e6,
              read_only=False, item=float),
        Param("chunk_safety.max_acceleration", [0.0], "Per action dimension, in units per second squared: the "
              "most acceleration a chunk may command; 0: no limit.", minimum=0.0, maximum=1e9, read_only=False,
              item=float),
    ),
    "reasoning": (
        Param("model_dir", "models/sim", "Local HuggingFace Qwen2 directory (config.json + safetensors); a "
              "relative path resolves against the YAML file's directory, then the package's share directory "
              "(the default is the trained policy that ships there).", path=True),
        Param("vision_max_pixels", 224 * 224, "Qwen2-VL / Qwen2.5-VL checkpoints: the most pixels of a camera "
              "frame. Every frame is resized to one square S x S, S the largest multiple of 28 whose square is "
              "at most this (and the checkpoint's max_pixels, and not below its min_pixels), then preprocessed "
              "as transformers' image processor preprocesses it; so every frame is (S / 28)^2 visual tokens (one "
              "per 28x28 pixels after the 2x2 merge) plus vision start and end, known before the first frame. "
              "The default gives 224 x 224: 64 + 2 tokens. Unused by other checkpoints.",
              minimum=28 * 28, maximum=8192 * 8192),
        Param("allow_nonfinite_weights", False, "Debugging only: load a checkpoint whose weights hold NaN or "
              "Inf, which is otherwise refused at load. Cycles whose hidden state or logits are not finite "
              "still produce no action; they are counted as invalid."),
        Param("weights", "auto", "What the decoder's and a VL vision tower's weight matrices are held in: auto "
              "keeps the checkpoint's dtype (bf16 stays bf16; fp16 is widened to fp32 on numpy); float32; "
              "bfloat16; int8 (symmetric per output channel); int4 (symmetric per group of weights_group "
              "inputs; the embedding and lm_head in int8). Quantized as the checkpoint loads; norms and biases stay fp32 and every product "
              "accumulates in fp32. Decoding reads every weight once a token, so fewer bytes run faster: "
              "docs/engine.md has the figures and the accuracy of each.",
              choices=("auto", "float32", "bfloat16", "int8", "int4")),  # numerics/weight_formats.py's FORMATS
        Param("weights_group", 64, "int4 only: inputs that share one scale (as Q4_0 / GPTQ / AWQ group them); "
              "smaller groups are more accurate and take more bytes for scales.", minimum=32, maximum=128,
              choices=(32, 64, 128)),  # numerics/weight_formats.py's INT4_GROUPS
        Param("backend", "auto", "Compute backend: auto picks cuda when a GPU is present, else numpy.",
              choices=("auto", "numpy", "cuda")),
        Param("blas_threads", 1, "Threads of the BLAS library under the numpy backend. 1 keeps cycle times "
              "predictable when the camera, DDS and other processes share the cores (measured: oversubscribed "
              "BLAS threads spin and stretch a cycle ten-fold); 0 leaves the library default (every core).",
              minimum=0, maximum=256),
        Param("kernel_threads", 1, "Threads of the numpy backend's compiled kernels (every decode product, and "
              "the widening of narrow weights before a prefill's BLAS). 1 keeps cycles predictable on shared "
              "cores, as blas_threads does; 0 uses every core. Two threads run a 1.5B-shape layer 1.3-1.7x "
              "faster on an idle 2-core machine; keep blas_threads at 1 beside them (both pools spin).",
              minimum=0, maximum=256),
        Param("kv_capacity_tokens", 512, "Slots in the KV arena (prompt + frames + action scratch).",
              minimum=8, maximum=1 << 20),
        Param("kv_page_tokens", 16, "Tokens per KV page: the unit of memory the arena's pool hands to one "
              "(layer, KV head). The pool holds layers x kv_heads x ceil(kv_capacity_tokens / kv_page_tokens) "
              "pages; dms gives a head's pages back as it evicts, so it holds about the pages its heads read "
              "(a head wastes less than one page).", minimum=1, maximum=1024),
        Param("kv_pool_pages", 0, "Pages in the KV pool; 0: a page for every block of every (layer, KV head), "
              "the dense size every policy runs on. Fewer pages serve only dms (its heads hold their own tokens): "
              "when the pool runs short it forces whole tokens out, lowest keep score first. The memory plan and "
              "budget_bytes count these pages.", minimum=0, maximum=1 << 30),
        Param("budget_bytes", 5_000_000_000, "Memory budget for weights + KV arena + workspace; a plan over "
              "it is refused before anything loads.", minimum=1 << 20, maximum=1 << 42),
        Param("prompt_token_ids", [151, 9, 402, 77, 1030, 12], "The prompt as token ids, prefilled once and "
              "pinned in the cache: for a model without a tokenizer (whatever instruction says), or for any model "
              "when instruction is empty. A config file that gives token ids and no instruction clears the "
              "instruction, so its ids are the prompt.", minimum=0, maximum=(1 << 31) - 1, item=int,
              items=(1, 1 << 20)),
        Param("instruction", "please drive to the red target", "The instruction in words: the checkpoint's "
              "tokenizer.json and chat template make it the pinned prompt; a model without a tokenizer reads "
              "prompt_token_ids instead (said at start-up) and refuses a new instruction. Empty: "
              "prompt_token_ids is the prompt. Setting it live re-tasks the robot from the next cycle, as a "
              "message on instruction_topic does; a refused one leaves the current instruction in place.",
              read_only=False),
        Param("instruction_max_tokens", 64, "The most tokens an instruction may take once templated; a longer "
              "one is refused. The KV arena keeps room for this many prompt tokens when the model has a "
              "tokenizer.", minimum=1, maximum=1 << 16),
        Param("instruction_topic", "vla/instruction", "std_msgs/String topic of new instructions (relative: in "
              "the node's namespace). Each is checked on arrival; the newest is applied between cycles."),
        Param("deadline_ms", 33.0, "Control deadline: a cycle must produce its action within this long of its "
              "frame's arrival, or it is not started. A chunked checkpoint whose chunks are not executed in sync "
              "plans on the chunk's horizon instead (horizon_margin_ms).", minimum=1.0, maximum=1000.0,
              read_only=False),
        Param("horizon_margin_ms", 10.0, "Chunks (execution other than sync): the next chunk is wanted this long "
              "before the end of the held chunk's execution horizon (rtc, ensemble) or of the commands the action "
              "timeline holds (chunk): that moment is a cycle's deadline, and the next cycle starts when the time "
              "to it falls to its predicted cost plus this margin. Covers the hand-over to the publisher and jitter "
              "beyond the predicted cost.", minimum=0.0, maximum=1000.0, read_only=False),
        Param("ema_alpha", 0.1, "Weight of the newest measurement in the per-block cost estimate.",
              minimum=0.001, maximum=1.0, read_only=False),
        Param("margin_k", 3.0, "Safety margin: predicted cost = mean + margin_k x mean absolute deviation.",
              minimum=0.0, maximum=20.0, read_only=False),
        Param("warmup_cycles", 3, "Blocks of each kind admitted unconditionally while their cost is learned.",
              minimum=1, maximum=1000, read_only=False),
        Param("diagnostics.window_s", 5.0, "Diagnostics judge the share of frames refused or missed over this "
              "recent window.", minimum=0.5, maximum=3600.0, read_only=False),
        Param("diagnostics.refused_warn_share", 0.1, "Diagnostics turn WARN when more than this share of the "
              "window's frames were refused or stale (no action).", minimum=0.0, maximum=1.0, read_only=False),
        Param("diagnostics.refused_error_share", 0.5, "Diagnostics turn ERROR when more than this share of the "
              "window's frames were refused or stale.", minimum=0.0, maximum=1.0, read_only=False),
        Param("diagnostics.missed_warn_share", 0.0, "Diagnostics turn WARN when more than this share of the "
              "window's frames missed the deadline (0: any miss).", minimum=0.0, maximum=1.0, read_only=False),
        Param("diagnostics.missed_error_share", 0.1, "Diagnostics turn ERROR when more than this share of the "
              "window's frames missed the deadline.", minimum=0.0, maximum=1.0, read_only=False),
        Param("debug_image.enabled", False, "Publish vla/debug_image (sensor_msgs/Image, rgb8): the frame the "
              "latest cycle acted on, its command (an arrow for twist, bars otherwise), the gate's verdict and "
              "latency, and thumbnails of the frames the memory keeps (aura: of those written into its fast "
              "weights). Drawn on the executor thread, never the reasoning thread; while on, each camera frame "
              "is also copied small.", read_only=False),
        Param("debug_image.rate_hz", 5.0, "At most this many debug images a second (fewer when fewer cycles "
              "ran).", minimum=0.1, maximum=30.0, read_only=False),
        Param("debug_image.width", 640, "Width of the debug image in pixels; the frame keeps its aspect, the "
              "strip below it shows up to 32 thumbnails.", minimum=160, maximum=1920, read_only=False),
        Param("kv.policy", "fifo", "KV memory policy: fifo (oldest frame goes), cosine (most redundant frame "
              "goes), aura (prompt + current frame + constant-size fast weights), dms (keep/evict per token and "
              "KV head, enforced once the token leaves a window). A change takes effect at the next episode "
              "(~/reset_episode), never mid-episode.", choices=("fifo", "cosine", "aura", "dms"),
              read_only=False),
        Param("kv.on_instruction", "reset", "What a new instruction does to the episode memory: reset (a new "
              "episode under the new prompt) or keep (the kept frames move behind the new prompt and the memory "
              "goes on).", choices=("reset", "keep"), read_only=False),
        Param("kv.cosine.protect_recent_frames", 4, "cosine: the newest frames that are never evicted (must "
              "leave one frame of the arena evictable).", minimum=0, maximum=1 << 16, read_only=False),
        Param("kv.cosine.signature", "keys", "cosine: what a frame's signature averages over its tokens: keys "
              "(RoPE undone), values, or the frame-encoder embeddings.", choices=("keys", "values", "embeddings")),
        Param("kv.cosine.signature_layers", [-1], "cosine: layers whose keys/values form the signature "
              "(negative: from the last).", minimum=-1024, maximum=1023, item=int),
        Param("kv.aura.threshold", 0.5, "aura: write when the memory's prediction error ||v - (W k + b)|| "
              "exceeds this fraction of ||v|| (unused while the checkpoint's learned gate decides).",
              minimum=0.0, maximum=1e6, read_only=False),
        Param("kv.aura.beta", 0.5, "aura: delta-rule step size of a write.", minimum=1e-6, maximum=1.0,
              read_only=False),
        Param("kv.aura.target_write_rate", 0.0, "aura: if > 0, the gate tightens while the write rate "
              "exceeds this fraction of frames (one-sided: the threshold rises, or the learned logit is "
              "lowered); 0 keeps it fixed.", minimum=0.0, maximum=1.0, read_only=False),
        Param("kv.aura.use_learned_gate", True, "aura: the checkpoint's learned gate (aura.gate.*), when it "
              "has one, alone decides the writes (logit > 0); false, or no gate: kv.aura.threshold decides.",
              read_only=False),
        Param("kv.dms.window", 32, "dms: a token's eviction is enforced only once this many newer tokens have "
              "entered; until then every KV head reads it (prompt + window + one frame + action tokens must fit "
              "the arena).", minimum=1, maximum=1 << 20),
        Param("kv.dms.target_ratio", 4.0, "dms: compression target r (tokens seen / tokens kept); >= 1 sets the "
              "threshold to the (1 - 1/r) quantile of recent keep scores; 0 uses kv.dms.threshold as is.",
              minimum=0.0, maximum=1e6, read_only=False),
        Param("kv.dms.threshold", 0.0, "dms: keep a token in a KV head when its keep score there exceeds this "
              "(used when kv.dms.target_ratio is 0): key novelty in [0, 2], or minus the learned gate's "
              "eviction logit.", minimum=-1e6, maximum=1e6, read_only=False),
        Param("kv.dms.use_learned_gate", True, "dms: decide with the checkpoint's learned gate "
              "(model.layers.*.self_attn.dms_gate.*) when it has one; false: always key novelty."),
        Param("kv_store.dir", "", "Directory of the persistent KV block store (prompt KV, episode memory); "
              "empty: no store. A relative path resolves against the YAML file's directory.", path=True),
        Param("kv_store.encryption", "aes-256-gcm", "Block encryption: aes-256-gcm, or none (plain blocks with a "
              "SHA-256 checksum; logged as such).", choices=("aes-256-gcm", "none")),
        Param("kv_store.key_file", "", "File holding the 256-bit store key: 64 hex digits, base64 of 32 bytes, "
              "or 32 raw bytes that are not all printable text (`vla-edge kv-store keygen` writes one); must not be "
              "readable by group or others. Takes precedence over kv_store.key_env. A relative path resolves against "
              "the YAML file's directory.", path=True),
        Param("kv_store.key_env", "VLA_EDGE_KV_KEY", "Environment variable holding the store key (hex or base64) "
              "when kv_store.key_file is empty."),
        Param("kv_store.budget_bytes", 1 << 30, "Disk budget of the store; least recently used blocks are evicted "
              "to stay within it.", minimum=1 << 16, maximum=1 << 50),
        Param("kv_store.min_free_bytes", 256 << 20, "Free space the store always leaves on its filesystem.",
              minimum=0, maximum=1 << 50),
        Param("kv_store.prompt", True, "Load the pinned prompt's KV from the store instead of prefilling it "
              "(and store it after a prefill)."),
        Param("kv_store.memory", True, "Restore the stored episode memory on start; save it on shutdown and on "
              "~/save_memory."),
        Param("kv_store.memory_name", "episode", "Name of the episode-memory block (one per robot or task)."),
    ),
}




def default_of(node: str, name: str) -> Any:
    """The schema's default of one parameter (a copy, so a list default cannot be changed through it)."""
    for param in SCHEMA[node]:
        if param.name == name:
            return list(param.default) if isinstance(param.default, list) else param.default
    raise KeyError(f"{node}.{name} is not in the schema")


def choices_of(node: str, name: str) -> tuple[str, ...]:
    """The schema's choice list of one parameter: the only place such a list is written."""
    for param in SCHEMA[node]:
        if param.name == name:
            return param.choices
    raise KeyError(f"{node}.{name} is not in the schema")


class Settings:
    """Validated values per node, relative paths resolved: ``settings['reasoning']['deadline_ms']``."""

    def __init__(self, values: dict[str, dict[str, Any]], source: str) -> None:
        self.values = values
        self.source = source

    def __getitem__(self, node: str) -> dict[str, Any]:
        return self.values[node]

    def replace(self, node: str, changes: Mapping[str, Any]) -> Settings:
        """A copy with ``changes`` to one node's values, each checked by the schema (the others shared)."""
        specs = {p.name: p for p in SCHEMA[node]}
        unknown = sorted(set(changes) - set(specs))
        if unknown:
            raise ConfigError(f"{self.source}: unknown keys {node}.{shown(unknown)}")
        checked = {name: specs[name].check(value, f"{self.source}: {node}") for name, value in changes.items()}
        return Settings({**self.values, node: {**self.values[node], **checked}}, self.source)


def package_share() -> Path | None:
    """The package's share directory (config/, launch/, models/sim, package.xml), wherever it is installed.

    In order: the source checkout this module runs from (an editable install, or colcon's
    --symlink-install); the ``share/vla_edge_ros`` of the prefix it is installed in (colcon, ``pip
    install .``); those of ``AMENT_PREFIX_PATH``. None when no share directory is found.
    """
    here = Path(__file__).resolve().parent
    candidates = [here.parent]  # a checkout: the package sits beside package.xml
    candidates += [prefix / "share" / PACKAGE for prefix in here.parents]
    candidates.append(Path(sys.prefix) / "share" / PACKAGE)
    candidates += [Path(prefix) / "share" / PACKAGE
                   for prefix in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if prefix]
    for candidate in candidates:
        if (candidate / "package.xml").is_file() and (candidate / "config").is_dir():
            return candidate
    return None


def resolve_path(value: str, base: Path | None) -> str:
    """A path setting made absolute: as given if absolute or empty, else against ``base`` (the YAML file's
    directory) if it exists there, else against the package share if it exists there, else ``base`` (or
    the share with no YAML file), so that an error names the first place looked."""
    if not value:
        return value
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    share = package_share()
    candidates = [root / path for root in (base, share) if root is not None]
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    return str(candidates[0]) if candidates else str(Path.cwd() / path)


def _resolve_paths(settings: Settings, base: Path | None) -> Settings:
    for node, params in SCHEMA.items():
        for param in params:
            if param.path:
                settings.values[node][param.name] = resolve_path(settings.values[node][param.name], base)
    return settings


def defaults() -> Settings:
    """The schema's defaults, paths resolved against the package share (as config/default.yaml gives them)."""
    values = {node: {p.name: default_of(node, p.name) for p in params} for node, params in SCHEMA.items()}
    return _resolve_paths(Settings(values, "<defaults>"), None)


def parse_settings(raw: Any, source: str, base: Path | None = None) -> Settings:
    """Validate a parsed YAML document against SCHEMA; missing keys take their defaults. Relative paths
    resolve against ``base`` (the file's directory), then the package share."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: top level must be a mapping of node names")
    values = {node: {p.name: default_of(node, p.name) for p in params} for node, params in SCHEMA.items()}
    for node, section in raw.items():
        if node not in SCHEMA:
            raise ConfigError(f"{source}: unknown node {shown(node)}; known: {sorted(SCHEMA)}")
        params = section.get("ros__parameters") if isinstance(section, dict) else None
        if not isinstance(params, dict):
            raise ConfigError(f"{source}: {node} must contain a 'ros__parameters' mapping")
        specs = {p.name: p for p in SCHEMA[node]}
        try:
            flat = _flatten(params)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {node}: {exc}") from None
        for key, value in flat.items():
            if key not in specs:
                raise ConfigError(f"{source}: unknown key {node}.{_cut(key)}; known: {sorted(specs)}")
            values[node][key] = specs[key].check(value, f"{source}: {node}")
        if node == "reasoning" and "prompt_token_ids" in flat and "instruction" not in flat:
            values[node]["instruction"] = ""  # the file's prompt is its token ids
    for group in KNOB_GROUPS:  # the rules a group has beyond each value's range
        try:
            group.of(values[group.NODE])
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return _resolve_paths(Settings(values, source), base)


def _flatten(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested YAML mappings become dotted names, as ROS 2 parameter files do (``kv: {policy: x}`` -> ``kv.policy``).
    A name written both ways (``kv.policy: x`` beside ``kv: {policy: y}``) is refused: neither may win silently."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        for dotted, leaf in (_flatten(value, name + ".") if isinstance(value, dict) else {name: value}).items():
            if dotted in flat:
                raise ConfigError(f"{_cut(dotted)} is given twice")
            flat[dotted] = leaf
    return flat


MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: a config file is a few kilobytes; anything near this is not one
MAX_CONFIG_DEPTH = 32  # collections inside collections; the schema's deepest value is 7 levels down
MAX_CONFIG_NODES = 20_000  # keys, values and list items together; config/default.yaml has about 150


class _Refused(yaml.MarkedYAMLError):
    """Valid YAML that a config file may not hold (an anchor, an alias, a duplicate key, too deep or too big)."""


class _Bounded:
    """The rules a config file's YAML is composed and constructed under, whichever parser reads it.

    Anchors and aliases are refused outright: an alias of an alias makes a few hundred bytes stand for
    billions of values (the "billion laughs"), and a ROS 2 parameter file never needs one. Nesting and the
    node count are bounded before PyYAML's recursive composer can run out of stack or memory, and a key
    given twice in one mapping is an error instead of the last one silently winning."""

    _depth = 0
    _nodes = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if event.anchor is not None:  # &name on a node, or *name
            raise _Refused(problem="YAML anchors and aliases (&name, *name) are not allowed in a config file",
                           problem_mark=event.start_mark)
        self._depth += 1
        self._nodes += 1
        if self._depth > MAX_CONFIG_DEPTH:
            raise _Refused(problem=f"nested deeper than {MAX_CONFIG_DEPTH} levels", problem_mark=event.start_mark)
        if self._nodes > MAX_CONFIG_NODES:
            raise _Refused(problem=f"more than {MAX_CONFIG_NODES:,} YAML nodes (keys, values and list items)",
                           problem_mark=event.start_mark)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<`: PyYAML's merge, which overrides by design
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = first_lines.get(key)
            except TypeError:  # an unhashable key: PyYAML's own construction says so
                continue
            if first is not None:
                raise _Refused(problem=f"duplicate key {shown(key)} (first at line {first + 1})",
                               problem_mark=key_node.start_mark)
            first_lines[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


class PurePythonLoader(_Bounded, yaml.SafeLoader):
    """PyYAML's own parser and safe constructor, under the config rules."""


CONFIG_LOADERS: tuple[type, ...] = (PurePythonLoader,)
if yaml.__with_libyaml__:
    class LibyamlLoader(_Bounded, Composer, yaml.CSafeLoader):
        """libyaml's event parser (a megabyte in milliseconds, against a second in Python), with PyYAML's
        composer in place of libyaml's so that the config rules see every node."""

        def __init__(self, stream: str) -> None:
            yaml.CSafeLoader.__init__(self, stream)
            Composer.__init__(self)

    CONFIG_LOADERS += (LibyamlLoader,)
ConfigLoader = CONFIG_LOADERS[-1]


def read_yaml(path: Path) -> Any:
    """The one YAML document of file ``path`` (a config, a training recipe), read within bounds
    (MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, MAX_CONFIG_NODES; no anchors, aliases or duplicate keys), so that
    any file costs at most a short ConfigError line, quickly."""
    loader = ConfigLoader(_read_text(path))
    try:
        return loader.get_single_data()
    except _Refused as exc:
        raise ConfigError(f"{path}: {_yaml_problem(exc)}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from exc
    except ValueError as exc:  # a value Python cannot hold as written: an integer of more than 4300 digits
        raise ConfigError(f"{path}: cannot convert a value: {_cut(str(exc))}") from exc
    finally:
        loader.dispose()


def _read_text(path: Path) -> str:
    """The text of config file ``path``, read within MAX_CONFIG_BYTES. A FIFO, a device or a directory is
    refused before any read: a FIFO would block until a writer comes, /dev/zero never ends."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without waiting for a writer
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ConfigError(f"cannot read config {path}: not a regular file")
            with os.fdopen(fd, "rb", closefd=False) as file:
                data = file.read(MAX_CONFIG_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES:,} bytes, the most a config file may be")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file: {exc}") from exc


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A PyYAML error in one short line with its place (its own text spans lines and may quote a megabyte)."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return _cut(" ".join(str(exc).split()))
    words = ": ".join(_cut(part) for part in (exc.context, exc.problem) if part)
    mark = exc.problem_mark or exc.context_mark
    return f"line {mark.line + 1}, column {mark.column + 1}: {words}" if mark else words


def load_settings(path: str | Path | None) -> Settings:
    """Read (``read_yaml``: within bounds) and validate a YAML config file (None: the built-in defaults, which
    equal config/default.yaml)."""
    if path is None:
        return defaults()
    path = Path(path)
    return parse_settings(read_yaml(path), str(path), path.resolve().parent)


# Typed knob groups: each field is the schema parameter of the same name under the group's prefix. A group
# takes its values (or the schema's defaults) from a node's settings and checks each by the schema, however
# it is built; nothing here has a default of its own.

Group = TypeVar("Group", bound="KnobGroup")


@dataclass(frozen=True)
class KnobGroup:
    """Base of the typed knob groups: validated against the schema on construction."""

    NODE: ClassVar[str] = ""
    PREFIX: ClassVar[str] = ""

    def __post_init__(self) -> None:
        specs = {p.name: p for p in SCHEMA[self.NODE]}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, KnobGroup):
                continue
            checked = specs[self.PREFIX + field.name].check(list(value) if isinstance(value, tuple) else value,
                                                            self.NODE)
            object.__setattr__(self, field.name, tuple(checked) if isinstance(checked, list) else checked)
        self.check()

    def check(self) -> None:
        """Rules between a group's values, or on a value beyond its range (ConfigError naming the knob)."""

    @classmethod
    def of(cls: type[Group], values: Mapping[str, Any] | None = None) -> Group:
        """From a node's settings or any mapping of dotted names (other keys ignored, missing: defaults)."""
        values = values or {}
        kinds = typing.get_type_hints(cls)
        fields = {}
        for field in dataclasses.fields(cls):
            kind = kinds[field.name]
            if isinstance(kind, type) and issubclass(kind, KnobGroup):
                fields[field.name] = kind.of(values)
                continue
            name = cls.PREFIX + field.name
            fields[field.name] = values[name] if name in values else default_of(cls.NODE, name)
        return cls(**fields)

    @classmethod
    def keys(cls) -> list[str]:
        """The schema names this group reads (a test holds them equal to the schema's)."""
        kinds = typing.get_type_hints(cls)
        names = []
        for field in dataclasses.fields(cls):
            kind = kinds[field.name]
            nested = isinstance(kind, type) and issubclass(kind, KnobGroup)
            names += kind.keys() if nested else [cls.PREFIX + field.name]
        return names


@dataclass(frozen=True)
class GateKnobs(KnobGroup):
    """reasoning: the admission gate."""

    NODE: ClassVar[str] = "reasoning"
    deadline_ms: float
    ema_alpha: float
    margin_k: float
    warmup_cycles: int
    horizon_margin_ms: float


@dataclass(frozen=True)
class DiagnosticsKnobs(KnobGroup):
    """reasoning: diagnostics.* (when the reasoning node's status turns WARN or ERROR)."""

    NODE: ClassVar[str] = "reasoning"
    PREFIX: ClassVar[str] = "diagnostics."
    window_s: float
    refused_warn_share: float
    refused_error_share: float
    missed_warn_share: float
    missed_error_share: float

    def check(self) -> None:
        for what in ("refused", "missed"):
            warn, error = getattr(self, f"{what}_warn_share"), getattr(self, f"{what}_error_share")
            if warn > error:
                raise ConfigError(f"{self.NODE}: diagnostics.{what}_warn_share={warn:g} is above "
                                  f"diagnostics.{what}_error_share={error:g}")


@dataclass(frozen=True)
class DebugImageKnobs(KnobGroup):
    """reasoning: debug_image.* (the vla/debug_image topic)."""

    NODE: ClassVar[str] = "reasoning"
    PREFIX: ClassVar[str] = "debug_image."
    enabled: bool
    rate_hz: float
    width: int


@dataclass(frozen=True)
class CosineKnobs(KnobGroup):
    """reasoning: kv.cosine.*"""

    NODE: ClassVar[str] = "reasoning"
    PREFIX: ClassVar[str] = "kv.cosine."
    protect_recent_frames: int
    signature: str
    signature_layers: tuple[int, ...]


@dataclass(frozen=True)
class AuraKnobs(KnobGroup):
    """reasoning: kv.aura.*"""

    NODE: ClassVar[str] = "reasoning"
    PREFIX: ClassVar[str] = "kv.aura."
    threshold: float
    beta: float
    target_write_rate: float
    use_learned_gate: bool


@dataclass(frozen=True)
class DmsKnobs(KnobGroup):
    """reasoning: kv.dms.*"""

    NODE: ClassVar[str] = "reasoning"
    PREFIX: ClassVar[str] = "kv.dms."
    window: int
    target_ratio: float
    threshold: float
    use_learned_gate: bool

    def check(self) -> None:
        if not (self.target_ratio == 0 or self.target_ratio >= 1):
            raise ConfigError(f"{self.NODE}: kv.dms.target_ratio must be 0 (use kv.dms.threshold) or >= 1, "
                              f"got {shown(self.target_ratio)}")


@dataclass(frozen=True)
class MemoryKnobs(KnobGroup):
    """reasoning: kv.* (the policy and every policy's knobs)."""

    NODE: ClassVar[str] = "reasoning"
    PREFIX: ClassVar[str] = "kv."
    policy: str
    on_instruction: str
    cosine: CosineKnobs
    aura: AuraKnobs
    dms: DmsKnobs


@dataclass(frozen=True)
class ChunkSafetyKnobs(KnobGroup):
    """action_publisher: chunk_safety.* (the limits a chunk is checked against before it is used)."""

    NODE: ClassVar[str] = "action_publisher"
    PREFIX: ClassVar[str] = "chunk_safety."
    values_are: str
    max_jump: tuple[float, ...]
    max_step: tuple[float, ...]
    max_velocity: tuple[float, ...]
    max_acceleration: tuple[float, ...]

    LIMITS: ClassVar[tuple[str, ...]] = ("max_jump", "max_step", "max_velocity", "max_acceleration")


@dataclass(frozen=True)
class OutputKnobs(KnobGroup):
    """action_publisher: what each control tick commands."""

    NODE: ClassVar[str] = "action_publisher"
    command_type: str
    action_timeout_ms: float
    action_min: tuple[float, ...]
    action_max: tuple[float, ...]
    twist_dims: tuple[int, ...]
    joint_names: tuple[str, ...]
    execution: str
    execution_horizon: int
    ensemble_decay: float
    chunk_safety: ChunkSafetyKnobs

    def check(self) -> None:
        low, high = self.action_min, self.action_max
        if len(low) > 1 and len(high) > 1 and len(low) != len(high):
            raise ConfigError(f"{self.NODE}: action_min has {len(low)} values and action_max {len(high)}: give one "
                              "value for all dimensions, or one per dimension in both")
        for i in range(max(len(low), len(high))):
            a, b = low[i if len(low) > 1 else 0], high[i if len(high) > 1 else 0]
            if a > b:
                raise ConfigError(f"{self.NODE}: action_min is above action_max in dimension {i} ({a:g} > {b:g})")


@dataclass(frozen=True)
class ObservationKnobs(KnobGroup):
    """camera_subscriber: what one observation is made of (cameras, state) and how it is put together."""

    NODE: ClassVar[str] = "camera_subscriber"
    image_topic: str
    extra_image_topics: tuple[str, ...]
    sync_slop_ms: float
    state_topic: str
    state_type: str
    state_joint_names: tuple[str, ...]
    state_joint_velocities: bool
    state_max_age_ms: float

    @property
    def cameras(self) -> int:
        return 1 + len(self.extra_image_topics)

    @property
    def topics(self) -> tuple[str, ...]:
        """Every camera's topic, the primary first."""
        return (self.image_topic, *self.extra_image_topics)

    def check(self) -> None:
        for what, names in (("image_topic and extra_image_topics", self.topics),
                            ("state_joint_names", self.state_joint_names)):
            twice = sorted({name for name in names if names.count(name) > 1})
            if twice:
                raise ConfigError(f"{self.NODE}: {what} name {shown(twice)} more than once")
        if not all(self.topics) or not all(self.state_joint_names):
            raise ConfigError(f"{self.NODE}: a camera topic or a state joint name is empty")


KNOB_GROUPS: tuple[type[KnobGroup], ...] = (GateKnobs, DiagnosticsKnobs, DebugImageKnobs, MemoryKnobs,
                                             OutputKnobs, ObservationKnobs)  # every group a node has
