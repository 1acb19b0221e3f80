"""The vision-language part of a Qwen2-VL / Qwen2.5-VL ``config.json``: the ViT tower and M-RoPE.

Two layouts exist and both are read:

- the hub's legacy flat layout (what Qwen/Qwen2-VL-2B-Instruct ships): the decoder's fields at the top
  level, ``rope_scaling: {"type": "mrope", "mrope_section": [...]}``, a ``vision_config`` mapping
  (``in_chans`` for the channel count);
- transformers 5's nested layout: ``text_config`` (with ``rope_parameters`` carrying ``mrope_section``)
  and ``vision_config`` (with ``rope_parameters: {"rope_type": "axial", ...}``).

The two families name the tower's widths differently; ``VisionTowerConfig`` holds them under one
naming. Facts HF hard-codes rather than configures (the tower's norm eps of 1e-6) are fields here so
that every implementation reads them from one place. Anything we do not reproduce exactly (another
activation, another rope type, windows that HF's arithmetic would make empty) is refused with the
offending key named.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config_error import ModelConfigError

VL_FAMILIES = ("qwen2_vl", "qwen2_5_vl")
# The hub's token ids, HF's defaults when a config.json leaves them out.
_DEFAULT_TOKEN_IDS = {"image_token_id": 151655, "vision_start_token_id": 151652, "vision_end_token_id": 151653}
_VISION_ACT = {"qwen2_vl": "quick_gelu", "qwen2_5_vl": "silu"}  # the only activation each family's tower uses
_VISION_EPS = 1e-6  # both towers' LayerNorm / RMSNorm and the merger's ln_q, fixed in HF's code


@dataclass(frozen=True)
class VisionTowerConfig:
    """A Qwen2-VL / Qwen2.5-VL ViT under one naming.

    ``family`` qwen2_vl: LayerNorm, QuickGELU MLP (fc1/fc2), full attention in every block, LayerNorm ln_q.
    ``family`` qwen2_5_vl: RMSNorm, SwiGLU MLP (gate/up/down, with biases), window attention except in
    ``fullatt_block_indexes``, RMSNorm ln_q. For qwen2_vl ``fullatt_block_indexes`` lists every block and
    ``window_size`` is 0, so "block i attends within windows" reads the same for both families.
    """

    family: str
    depth: int
    embed_dim: int  # the blocks' width (qwen2_vl: embed_dim; qwen2_5_vl: vision hidden_size)
    num_heads: int
    mlp_dim: int  # qwen2_vl: embed_dim * mlp_ratio; qwen2_5_vl: intermediate_size
    out_hidden_size: int  # the merger's output: the decoder's hidden size
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    window_size: int = 0  # pixels per window side (qwen2_5_vl)
    fullatt_block_indexes: tuple[int, ...] = ()
    rope_theta: float = 10000.0
    eps: float = _VISION_EPS
    hidden_act: str = "quick_gelu"

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values per patch as the processor lays them out: channels x frames x rows x cols."""
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size

    @property
    def merge_unit(self) -> int:
        """Patches merged into one decoder token."""
        return self.spatial_merge_size ** 2

    @property
    def merged_dim(self) -> int:
        """Width of the merger's input: one token's patches side by side."""
        return self.embed_dim * self.merge_unit

    @property
    def window_units(self) -> int:
        """Side of an attention window in merged tokens (HF's floor division; 0 for qwen2_vl)."""
        return self.window_size // self.spatial_merge_size // self.patch_size

    def windowed(self, block: int) -> bool:
        """Whether ``block`` attends within windows rather than within the whole image."""
        return block not in self.fullatt_block_indexes

    def to_hf_dict(self) -> dict[str, Any]:
        """This tower as the ``vision_config`` its family's HF config reads."""
        common = dict(depth=self.depth, num_heads=self.num_heads, patch_size=self.patch_size,
                      temporal_patch_size=self.temporal_patch_size, spatial_merge_size=self.spatial_merge_size,
                      in_channels=self.in_channels, hidden_act=self.hidden_act,
                      rope_parameters={"rope_type": "axial", "rope_theta": self.rope_theta})
        if self.family == "qwen2_vl":
            ratio = self.mlp_dim / self.embed_dim
            return dict(common, embed_dim=self.embed_dim, hidden_size=self.out_hidden_size,
                        mlp_ratio=int(ratio) if ratio.is_integer() else ratio)
        return dict(common, hidden_size=self.embed_dim, intermediate_size=self.mlp_dim,
                    out_hidden_size=self.out_hidden_size, window_size=self.window_size,
                    fullatt_block_indexes=list(self.fullatt_block_indexes))

    def validate(self) -> None:
        for name in ("depth", "embed_dim", "num_heads", "mlp_dim", "out_hidden_size", "patch_size",
                     "temporal_patch_size", "spatial_merge_size", "in_channels"):
            if getattr(self, name) <= 0:
                raise ModelConfigError(f"config.json: vision_config {name} must be positive, got {getattr(self, name)}")
        if self.embed_dim % self.num_heads or self.head_dim % 4:
            raise ModelConfigError(
                f"config.json: vision_config width {self.embed_dim} over {self.num_heads} heads must give a head "
                "dimension that is a multiple of 4 (2-D rotary embeddings split it into row and column halves)")
        if any(not 0 <= i < self.depth for i in self.fullatt_block_indexes):
            raise ModelConfigError(
                f"config.json: vision_config.fullatt_block_indexes {list(self.fullatt_block_indexes)} "
                f"must lie in [0, depth={self.depth})")
        if self.family == "qwen2_5_vl" and self.window_units < 1:
            raise ModelConfigError(
                f"config.json: vision_config.window_size {self.window_size} is smaller than one merged token "
                f"(patch_size {self.patch_size} x spatial_merge_size {self.spatial_merge_size})")


@dataclass(frozen=True)
class VlConfig:
    """What a VL checkpoint adds to the decoder: the tower, M-RoPE's split and the vision tokens."""

    vision: VisionTowerConfig
    mrope_section: tuple[int, int, int]  # rotary pairs driven by the temporal, height and width position
    image_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int

    @property
    def family(self) -> str:
        return self.vision.family

    def to_hf_dict(self) -> dict[str, Any]:
        """The top-level entries a hub (flat layout) ``config.json`` adds to a Qwen2 one for this VL model."""
        architecture = {"qwen2_vl": "Qwen2VLForConditionalGeneration",
                        "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}[self.family]
        return {"architectures": [architecture], "model_type": self.family,
                "rope_scaling": {"type": "mrope", "mrope_section": list(self.mrope_section)},
                "vision_config": self.vision.to_hf_dict(), "image_token_id": self.image_token_id,
                "vision_start_token_id": self.vision_start_token_id, "vision_end_token_id": self.vision_end_token_id}

    def validate(self, hidden_size: int, head_dim: int, vocab_size: int) -> None:
        """Refuse a tower or M-RoPE split that does not fit the decoder."""
        self.vision.validate()
        if self.vision.out_hidden_size != hidden_size:
            field = "hidden_size" if self.family == "qwen2_vl" else "out_hidden_size"
            raise ModelConfigError(
                f"config.json: vision_config.{field} ({self.vision.out_hidden_size}) must equal the decoder's "
                f"hidden_size ({hidden_size})")
        if any(s <= 0 for s in self.mrope_section) or sum(self.mrope_section) != head_dim // 2:
            raise ModelConfigError(
                f"config.json: mrope_section {list(self.mrope_section)} must be 3 positive counts summing to "
                f"head_dim / 2 = {head_dim // 2}")
        for name in _DEFAULT_TOKEN_IDS:
            value = getattr(self, name)
            if not 0 <= value < vocab_size:
                raise ModelConfigError(f"config.json: {name} {value} is outside the vocabulary [0, {vocab_size})")


def _int(section: dict[str, Any], key: str, where: str, source: Path, default: int | None = None) -> int:
    if key not in section:
        if default is None:
            raise ModelConfigError(f"{source}: missing required key {where}{key!r}")
        return default
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelConfigError(f"{source}: {where}{key} must be an integer, got {value!r}")
    return value


def _vision_rope_theta(vision: dict[str, Any], source: Path) -> float:
    params = vision.get("rope_parameters")
    if params is None:
        return float(vision.get("rope_theta", 10000.0))
    if not isinstance(params, dict):
        raise ModelConfigError(f"{source}: vision_config.rope_parameters must be a mapping")
    kind = params.get("rope_type", "axial")
    if kind != "axial":
        raise ModelConfigError(f"{source}: vision_config.rope_parameters.rope_type {kind!r} is not supported (only 'axial')")
    return float(params.get("rope_theta", 10000.0))


def parse_vision_config(family: str, vision: Any, source: Path) -> VisionTowerConfig:
    """The tower of ``vision_config`` (either layout; the keys are the same in both)."""
    if not isinstance(vision, dict):
        raise ModelConfigError(f"{source}: vision_config must be a mapping, got {type(vision).__name__}")
    where = "vision_config."
    act = vision.get("hidden_act", _VISION_ACT[family])
    if act != _VISION_ACT[family]:
        raise ModelConfigError(
            f"{source}: vision_config.hidden_act {act!r} is not supported for {family} (only {_VISION_ACT[family]!r})")
    depth = _int(vision, "depth", where, source)
    common = dict(
        family=family,
        depth=depth,
        num_heads=_int(vision, "num_heads", where, source),
        patch_size=_int(vision, "patch_size", where, source),
        temporal_patch_size=_int(vision, "temporal_patch_size", where, source, 2),
        spatial_merge_size=_int(vision, "spatial_merge_size", where, source, 2),
        in_channels=_int(vision, "in_channels", where, source, _int(vision, "in_chans", where, source, 3)),
        rope_theta=_vision_rope_theta(vision, source),
        hidden_act=act,
    )
    if family == "qwen2_vl":
        embed = _int(vision, "embed_dim", where, source)
        ratio = vision.get("mlp_ratio", 4)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
            raise ModelConfigError(f"{source}: vision_config.mlp_ratio must be a number, got {ratio!r}")
        return VisionTowerConfig(embed_dim=embed, mlp_dim=int(embed * ratio),
                                 out_hidden_size=_int(vision, "hidden_size", where, source),
                                 fullatt_block_indexes=tuple(range(depth)), **common)
    indexes = vision.get("fullatt_block_indexes")
    if not isinstance(indexes, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in indexes):
        raise ModelConfigError(f"{source}: vision_config.fullatt_block_indexes must be a list of block indexes, got {indexes!r}")
    return VisionTowerConfig(embed_dim=_int(vision, "hidden_size", where, source),
                             mlp_dim=_int(vision, "intermediate_size", where, source),
                             out_hidden_size=_int(vision, "out_hidden_size", where, source),
                             window_size=_int(vision, "window_size", where, source),
                             fullatt_block_indexes=tuple(indexes), **common)


def _mrope_section(text: dict[str, Any], source: Path) -> tuple[int, int, int]:
    """M-RoPE's split from ``rope_scaling`` (hub) or ``rope_parameters`` (transformers 5)."""
    key = "rope_parameters" if isinstance(text.get("rope_parameters"), dict) else "rope_scaling"
    params = text.get(key)
    if not isinstance(params, dict):
        raise ModelConfigError(f"{source}: {key} must be a mapping with the M-RoPE mrope_section")
    for field in ("type", "rope_type"):  # transformers 5 writes rope_type "default" next to type "mrope"
        if field in params and params[field] not in ("mrope", "default"):
            raise ModelConfigError(f"{source}: {key}.{field} {params[field]!r} is not supported (only M-RoPE)")
    section = params.get("mrope_section")
    if not isinstance(section, (list, tuple)) or len(section) != 3 or \
            not all(isinstance(s, int) and not isinstance(s, bool) for s in section):
        raise ModelConfigError(f"{source}: {key}.mrope_section must be 3 integers, got {section!r}")
    return tuple(section)


def _text_rope_theta(text: dict[str, Any]) -> float:
    params = text.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(text.get("rope_theta", 1000000.0))  # HF's default for both VL text configs


def split_vl_config(raw: dict[str, Any], source: Path) -> tuple[dict[str, Any], VlConfig]:
    """(the decoder's fields, the VL config) of a VL ``config.json`` in either layout.

    The decoder's fields come back as a flat Qwen2-style mapping: the rope entries are resolved here (M-RoPE
    is not rope scaling), ``rope_theta`` is set and ``tie_word_embeddings`` is read where either layout
    puts it (the top level, or inside ``text_config`` in saves before transformers 5).
    """
    family = raw.get("model_type")
    if family not in VL_FAMILIES:
        raise ModelConfigError(f"{source}: model_type {family!r} is not a supported VL family {VL_FAMILIES}")
    nested = raw.get("text_config")
    if nested is None:
        text = {k: v for k, v in raw.items() if k != "vision_config"}
    elif isinstance(nested, dict):
        text = dict(nested)
        if text.get("model_type", f"{family}_text") != f"{family}_text":
            raise ModelConfigError(f"{source}: text_config.model_type {text['model_type']!r} does not match {family!r}")
    else:
        raise ModelConfigError(f"{source}: text_config must be a mapping")
    mrope = _mrope_section(text, source)
    theta = _text_rope_theta(text)
    tie = bool(raw.get("tie_word_embeddings", False)) or bool(text.get("tie_word_embeddings", False))
    text = {k: v for k, v in text.items() if k not in ("rope_scaling", "rope_parameters", "model_type")}
    text.update(rope_theta=theta, tie_word_embeddings=tie)
    if "vision_config" not in raw:
        raise ModelConfigError(f"{source}: missing required key 'vision_config'")
    tokens = {}
    for name, default in _DEFAULT_TOKEN_IDS.items():
        tokens[name] = _int(raw, name, "", source, _int(text, name, "", source, default))
    return text, VlConfig(parse_vision_config(family, raw["vision_config"], source), mrope, **tokens)
