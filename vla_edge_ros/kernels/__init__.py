"""Numba-CUDA kernels for the Qwen2 decoder forward pass and the Qwen2-VL / Qwen2.5-VL vision tower:
fp32 activations and accumulation, weights in fp32, fp16, bf16 (as uint16 bits), int8 or int4 (dequantized
in registers), KV cache in fp32 pages.

Installed as ``vla_edge_ros.kernels`` and imported by absolute names: a checkout's root on sys.path
also exposes this folder as a top-level ``kernels``, which transformers probes for (HF's kernel hub
package); absolute imports keep that probe harmless.

Each launcher takes Numba device arrays, checks their shapes on the host, picks the launch
geometry and launches on an optional stream; reference.py holds a NumPy twin of each.
"""

from vla_edge_ros.kernels.dtypes import (
    ELEMENT_KINDS,
    DeviceWeight,
    WeightKind,
    to_device_packed,
    to_device_vector,
    to_device_weight,
    to_float32,
    weight_kind_of,
)
from vla_edge_ros.kernels.elementwise import add_inplace, gelu, quick_gelu, swiglu
from vla_edge_ros.kernels.embedding import embedding_gather
from vla_edge_ros.kernels.gqa_attention import MAX_HEAD_DIM, AttentionScratch, attention
from vla_edge_ros.kernels.greedy import NO_TOKEN, argmax_rows
from vla_edge_ros.kernels.kv_cache import copy_rows
from vla_edge_ros.kernels.matmul import linear
from vla_edge_ros.kernels.memory import cosine_similarities, fast_weight_read, fast_weight_step
from vla_edge_ros.kernels.norm import layernorm, rmsnorm
from vla_edge_ros.kernels.rotary import pair_axes, rope, rope_axes, rope_cache_shift
from vla_edge_ros.kernels.segment_attention import segment_attention

KERNEL_VERSION = "qwen2-f32kv-paged-3"
"""Changes whenever kernel numerics or the KV layout change; part of persisted-KV fingerprints."""

__all__ = [
    "ELEMENT_KINDS",
    "KERNEL_VERSION",
    "MAX_HEAD_DIM",
    "NO_TOKEN",
    "AttentionScratch",
    "DeviceWeight",
    "WeightKind",
    "add_inplace",
    "argmax_rows",
    "attention",
    "copy_rows",
    "cosine_similarities",
    "embedding_gather",
    "fast_weight_read",
    "fast_weight_step",
    "gelu",
    "layernorm",
    "linear",
    "pair_axes",
    "quick_gelu",
    "rmsnorm",
    "rope",
    "rope_axes",
    "rope_cache_shift",
    "segment_attention",
    "swiglu",
    "to_device_packed",
    "to_device_vector",
    "to_device_weight",
    "to_float32",
    "weight_kind_of",
]
