"""Real VL checkpoints that ``vla-edge plan`` knows by name: their public config.json and preprocessor values.

Only shapes, no weights: a robot team can see whether Qwen2-VL-2B (the backbone of DexVLA and ChatVLA)
or Qwen2.5-VL-3B (NORA's) fits its memory before downloading anything. The values are those the hub's
``Qwen/Qwen2-VL-2B-Instruct`` and ``Qwen/Qwen2.5-VL-3B-Instruct`` ship in config.json and
preprocessor_config.json (both bf16, tied embeddings); they go through the same parser as a
checkpoint directory's files, so a plan by name is a plan of that directory.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..numerics.weight_formats import matrix_bytes
from .checkpoint import held_format, is_matrix, language_model_shapes, vl_shapes
from .config import ModelConfig, parse_model_config
from .vl.preprocess import ImageProcessing

_TOKENS = {"bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
           "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656}
_DECODER = {"hidden_act": "silu", "attention_dropout": 0.0, "initializer_range": 0.02, "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0, "sliding_window": 32768, "use_sliding_window": False, "tie_word_embeddings": True,
            "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 151936,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
_PREPROCESSOR = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
                 "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                 "image_std": [0.26862954, 0.26130258, 0.27577711], "image_processor_type": "Qwen2VLImageProcessor"}

KNOWN_MODELS: dict[str, dict[str, Any]] = {
    "qwen2-vl-2b": {
        "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl", **_TOKENS, **_DECODER,
        "hidden_size": 1536, "intermediate_size": 8960, "max_position_embeddings": 32768, "max_window_layers": 28,
        "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
        "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3,
                          "hidden_size": 1536, "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
                          "temporal_patch_size": 2},
    },
    "qwen2.5-vl-3b": {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", **_TOKENS, **_DECODER,
        "hidden_size": 2048, "intermediate_size": 11008, "max_position_embeddings": 128000, "max_window_layers": 70,
        "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 2,
        "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                          "num_heads": 16, "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14,
                          "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                          "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
    },
}
KNOWN_DTYPE_BYTES = 2  # bf16, as both ship


def known_model(name: str) -> tuple[ModelConfig, ImageProcessing]:
    """The config and image processing of a known checkpoint; ValueError naming the known ones otherwise."""
    if name not in KNOWN_MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))}")
    config = parse_model_config(KNOWN_MODELS[name], Path(f"{name}/config.json"))
    return config, ImageProcessing.from_dict(_PREPROCESSOR, f"{name}/preprocessor_config.json")


def weight_values(config: ModelConfig) -> tuple[int, int]:
    """(decoder values, vision tower values) of a checkpoint of ``config``: what its tensors hold."""
    count = lambda shapes: sum(math.prod(shape) for shape in shapes.values())  # noqa: E731
    return count(language_model_shapes(config)), count(vl_shapes(config))


def held_bytes(config: ModelConfig, weights: str, group: int) -> tuple[int, int]:
    """(all weights, the vision tower's) bytes of a checkpoint of ``config`` held as ``reasoning.weights`` says on
    the cuda backend: matrices in their format (``held_format``; auto: the bf16 they ship in), the rest in bf16."""
    def total(shapes: dict[str, tuple[int, ...]]) -> int:
        return sum(matrix_bytes(shape[0], shape[1], held_format(weights, (name,), ["BF16"]), group)
                   if is_matrix(name, shape) else math.prod(shape) * KNOWN_DTYPE_BYTES for name, shape in shapes.items())

    tower = total(vl_shapes(config))
    return total(language_model_shapes(config)) + tower, tower
