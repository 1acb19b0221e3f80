"""Write randomly initialised checkpoints in HuggingFace format, so nothing is ever downloaded.

Besides the decoder and the VLA parts, every checkpoint carries the aura memory's projections
(``aura.*``, random like the rest; no learned gate) so that every KV policy runs on it.

``sim`` is the shape ``vla-edge train`` fits to the 2-D simulator (continuous 2-D velocity head; the
trained checkpoint in models/sim is the embedded default); ``tiny`` is what the tests build (fast on
a 2-core CPU; untied embeddings, because a random tied model greedily repeats its input token and
every action dimension would read the same bin);
``qwen2.5-1.5b-shape`` has the exact shapes of Qwen2.5-1.5B (28 layers, 12 query / 2 KV heads of
128, vocab 151,936, tied) for timing and memory work; ``qwen2-vl-tiny`` is a small Qwen2-VL: the tiny
decoder with M-RoPE and a 2-block ViT tower, written as transformers writes a Qwen2-VL checkpoint (the
hub's flat config.json, a preprocessor_config.json, the tensors under transformers 5's keys
``model.language_model.*`` and ``model.visual.*``), so transformers loads it as it is; its ``vla``
section holds only the action head. Any preset may see several cameras per observation and read the
robot's state (``vla.cameras``, ``vla.state`` with a random ``state_proj``, its statistics the identity),
and may carry another action head: ``mlp`` with a chunk of H actions a cycle (``vla.action.chunk``).
The same seed always gives the same bytes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..numerics.bf16 import bf16_bits
from .checkpoint import language_model_shapes, vl_shapes, vl_stored_name, vla_shapes
from .config import ActionConfig, ModelConfig, StateConfig, VisionConfig
from .vl.config import VisionTowerConfig, VlConfig
from .memory_tensors import aura_shapes
from .safetensors_io import StoredTensor, write_safetensors

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, vocab_size=2048, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, max_position_embeddings=4096,
        vision=VisionConfig(image_size=64, patch_size=8, tokens_per_frame=16),
        action=ActionConfig(head="bins", dof=7),
    ),
    "sim": ModelConfig(
        hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, vocab_size=2048, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, max_position_embeddings=8192,
        vision=VisionConfig(image_size=64, patch_size=16, tokens_per_frame=16),
        action=ActionConfig(head="linear", dof=2),
    ),
    "qwen2.5-1.5b-shape": ModelConfig(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, head_dim=128, vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, max_position_embeddings=32768,
        vision=VisionConfig(image_size=224, patch_size=14, tokens_per_frame=16),
        action=ActionConfig(head="bins", dof=7),
    ),
    "qwen2-vl-tiny": ModelConfig(
        hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, vocab_size=2048, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, max_position_embeddings=4096,
        action=ActionConfig(head="bins", dof=7),
        vl=VlConfig(VisionTowerConfig(family="qwen2_vl", depth=2, embed_dim=64, num_heads=4, mlp_dim=256,
                                      out_hidden_size=256, fullatt_block_indexes=(0, 1)),
                    mrope_section=(8, 12, 12),  # Qwen2-VL's 16/24/24 split of head_dim / 2, halved
                    # below the last 256 ids, which the bins action head reads
                    image_token_id=1700, vision_start_token_id=1701, vision_end_token_id=1702),
    ),
}
# preprocessor_config.json of a written VL preset: the hub's Qwen2-VL values (CLIP mean and std)
VL_PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "do_rescale": True,
    "rescale_factor": 1 / 255, "do_normalize": True, "resample": 3, "do_convert_rgb": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
}
STORAGE_DTYPES = ("float32", "float16", "bfloat16")
_INIT_STD = 0.02
AURA_DIM = 32  # d_k = d_v of the aura memory's projections (4,224 B of fast-weight state)


def _encode(values: np.ndarray, dtype: str) -> StoredTensor:
    if dtype == "bfloat16":
        return StoredTensor("BF16", bf16_bits(values))
    if dtype == "float16":
        return StoredTensor("F16", values.astype(np.float16))
    return StoredTensor("F32", values.astype(np.float32))


def random_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Norm weights near 1, everything else N(0, 0.02), as HF's initializer does (plus jitter on norms)."""
    if name.endswith("norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(_INIT_STD)


def write_random_model(out: str | Path, config: ModelConfig, *, seed: int = 0, dtype: str = "bfloat16") -> Path:
    """Write config.json and model.safetensors for ``config`` with seeded random weights."""
    config.validate()
    config.validate_vla()
    rng = np.random.default_rng(seed)
    shapes = {**language_model_shapes(config), **vl_shapes(config), **vla_shapes(config),
              **aura_shapes(config, AURA_DIM, AURA_DIM, learned_gate=False)}
    return write_model(out, config, {name: random_tensor(name, shape, rng) for name, shape in shapes.items()}, dtype)


def write_model(out: str | Path, config: ModelConfig, arrays: dict[str, np.ndarray], dtype: str,
                metadata: dict[str, str] | None = None) -> Path:
    """Write ``arrays`` (fp32, checkpoint names) as model.safetensors in ``dtype``, and config.json (a VL
    model: under transformers 5's keys, with a preprocessor_config.json)."""
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"dtype must be one of {STORAGE_DTYPES}, got {dtype!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    hf = config.to_hf_dict()
    hf["torch_dtype"] = dtype
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    if config.vl is not None:
        (out / "preprocessor_config.json").write_text(json.dumps(VL_PREPROCESSOR, indent=2) + "\n")
        arrays = {vl_stored_name(name, new_layout=True): a for name, a in arrays.items()}
    write_safetensors(out / "model.safetensors", {name: _encode(a, dtype) for name, a in arrays.items()}, metadata)
    return out


def preset(name: str, layers: int | None = None, *, cameras: int = 1, state_dim: int = 0, head: str | None = None,
           chunk: int = 1, dof: int | None = None) -> ModelConfig:
    """Preset ``name``, with ``layers`` decoder layers if given, ``cameras`` frames per observation, a state
    token of ``state_dim`` values (0: none), and ``head`` (None: the preset's) giving ``chunk`` actions a cycle
    of ``dof`` values each (None: the preset's; 4 for the Meta-World arm, whose action no preset has).
    An ``mlp`` head's hidden layer is as wide as the decoder (OpenVLA-OFT's choice)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    config = PRESETS[name]
    config = replace(config, num_hidden_layers=layers) if layers else config
    if cameras != 1 or state_dim:
        config = replace(config, cameras=cameras, state=StateConfig(state_dim) if state_dim else None)
    if head is not None or chunk != 1:
        head = head or config.action.head
        config = replace(config, action=replace(config.action, head=head, chunk=chunk,
                                                mlp_hidden=config.hidden_size if head == "mlp" else 0))
    if dof is not None and dof != config.action.dof:
        config = replace(config, action=replace(config.action, dof=dof))
    config.validate_vla()
    return config
