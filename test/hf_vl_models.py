"""Small Qwen2-VL / Qwen2.5-VL checkpoints written by HuggingFace ``transformers`` itself, for parity tests.

Weights are random (seeded), scaled by 1/sqrt(fan-in) so activations stay O(1) at any width; norms and
biases are perturbed away from HF's 1/0 init so that a forward pass that ignored them would be caught.
A ``bfloat16`` variant's weights are rounded to bf16 before saving, so HF loading the directory in fp32
holds exactly the values our loader widens.

``write_hf_vl_model`` saves as transformers 5 does: a nested config (``text_config``, ``vision_config``)
and the hub's tensor keys (``visual.*``, ``model.*``; transformers 5 converts back to them on save).
``write_legacy_layout`` rewrites such a directory into the hub's flat config (``rope_scaling`` at the top
level, ``in_chans``), which is how Qwen/Qwen2-VL-2B-Instruct ships; ``write_module_key_layout`` renames the
tensors to the module paths (``model.visual.*``, ``model.language_model.*``) that transformers 4.52 to 4.57
saved; ``reshard`` splits the weights over several files with an index.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np

from vla_edge_ros.model.safetensors_io import StoredTensor, read_safetensors, write_safetensors

# Vision special tokens kept below the last 256 ids, which the 'bins' action head reads.
_TOKENS = dict(vision_start_token_id=3, vision_end_token_id=4, image_token_id=5)

VARIANTS: dict[str, dict] = {
    # name: family, text and vision config overrides, storage dtype. Odd sizes on purpose.
    "qwen2_vl_tiny": dict(
        family="qwen2_vl", dtype="float32",
        text=dict(hidden_size=40, intermediate_size=56, num_hidden_layers=2, num_attention_heads=5,
                  num_key_value_heads=1, vocab_size=320, mrope_section=[2, 1, 1]),
        vision=dict(depth=2, embed_dim=24, num_heads=2, mlp_ratio=3, hidden_size=40, patch_size=4,
                    temporal_patch_size=2, spatial_merge_size=2),
        tie_word_embeddings=True),
    "qwen2_5_vl_tiny": dict(
        family="qwen2_5_vl", dtype="bfloat16",
        text=dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=320, mrope_section=[2, 2, 2]),
        # window_size 8 = 2 merged tokens of 2x2 patches of 2 px: windows of 2x2 tokens, full attention in block 1
        vision=dict(depth=3, hidden_size=24, num_heads=3, intermediate_size=44, out_hidden_size=48, patch_size=2,
                    temporal_patch_size=2, spatial_merge_size=2, window_size=8, fullatt_block_indexes=[1]),
        tie_word_embeddings=False),
    # The real ViT's head_dim of 80 (two heads) at a width the CUDA simulator runs in seconds.
    "qwen2_vl_head80": dict(
        family="qwen2_vl", dtype="bfloat16",
        text=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, vocab_size=320, mrope_section=[2, 3, 3]),
        vision=dict(depth=1, embed_dim=160, num_heads=2, mlp_ratio=1, hidden_size=32, patch_size=2,
                    temporal_patch_size=2, spatial_merge_size=2),
        tie_word_embeddings=True),
    # Qwen2-VL-2B's real widths (ViT 1280 x 16 heads, MLP 5120, patch 14; decoder 1536, 12 / 2 heads of 128,
    # MLP 8960, M-RoPE 16/24/24), 2 blocks each and a small vocabulary.
    "qwen2_vl_2b_slice": dict(
        family="qwen2_vl", dtype="bfloat16",
        text=dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=2, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=512, mrope_section=[16, 24, 24]),
        vision=dict(depth=2, embed_dim=1280, num_heads=16, mlp_ratio=4, hidden_size=1536, patch_size=14,
                    temporal_patch_size=2, spatial_merge_size=2),
        tie_word_embeddings=True),
}


def hf_classes(family: str) -> tuple[type, type]:
    """(config class, model class) of a VL family in transformers."""
    import transformers

    if family == "qwen2_vl":
        return transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration
    return transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration


def write_hf_vl_model(out: Path, name: str, seed: int = 0) -> Path:
    """Build variant ``name`` with transformers and save it (transformers 5 layout) as a local HF directory."""
    import torch

    spec = VARIANTS[name]
    text = dict(spec["text"])
    section = text.pop("mrope_section")
    text.update(rope_scaling={"type": "mrope", "mrope_section": section}, rope_theta=1000000.0, rms_norm_eps=1e-6,
                max_position_embeddings=4096, bos_token_id=None, eos_token_id=None)
    config_class, model_class = hf_classes(spec["family"])
    config = config_class(text_config=text, vision_config=dict(spec["vision"]),
                          tie_word_embeddings=spec["tie_word_embeddings"], **_TOKENS)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "norm" in param_name or "ln_q" in param_name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param) if param_name.endswith("weight")
                            else 0.1 * torch.randn_like(param))
            elif param_name.endswith(".bias"):
                param.copy_(0.1 * torch.randn_like(param))
            else:
                fan_in = math.prod(param.shape[1:])
                param.copy_(torch.randn_like(param) / math.sqrt(fan_in))
            if spec["dtype"] == "bfloat16":
                param.copy_(param.to(torch.bfloat16).float())
    model = model.to(getattr(torch, spec["dtype"]))
    model.save_pretrained(str(out))
    return out


def load_hf_vl_model(model_dir: Path):
    """The HF model of a directory written here (either layout), in fp32, eval mode."""
    import torch

    family = json.loads((model_dir / "config.json").read_text())["model_type"]
    return hf_classes(family)[1].from_pretrained(str(model_dir), dtype=torch.float32).eval()


def _all_tensors(model_dir: Path) -> dict[str, StoredTensor]:
    tensors = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        tensors.update({n: StoredTensor(t.dtype, np.array(t.array)) for n, t in read_safetensors(file).items()})
    return tensors


def write_legacy_layout(model_dir: Path, out: Path) -> Path:
    """Copy a transformers-5 directory into the hub's legacy layout: flat config, the same (hub) tensor keys."""
    raw = json.loads((model_dir / "config.json").read_text())
    text = raw.pop("text_config")
    rope = text.pop("rope_parameters")
    text.pop("model_type")
    vision = raw.pop("vision_config")
    vision.pop("model_type")
    vision["rope_theta"] = vision.pop("rope_parameters")["rope_theta"]
    vision["in_chans"] = vision.pop("in_channels")  # the hub's key
    flat = {**text, **raw, "vision_config": vision, "rope_theta": rope["rope_theta"],
            "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]}}
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(flat, indent=1))
    write_safetensors(out / "model.safetensors", _all_tensors(model_dir))
    return out


def write_module_key_layout(model_dir: Path, out: Path) -> Path:
    """Copy a directory with the tensors renamed to transformers 4.52-4.57's keys (config unchanged)."""
    out.mkdir(parents=True)
    shutil.copy(model_dir / "config.json", out / "config.json")
    tensors = {}
    for key, tensor in _all_tensors(model_dir).items():
        if key.startswith("visual."):
            key = "model." + key
        elif key.startswith("model."):
            key = "model.language_model." + key[len("model."):]
        tensors[key] = tensor
    write_safetensors(out / "model.safetensors", tensors)
    return out


def reshard(model_dir: Path, parts: int) -> None:
    """Spread a directory's tensors over ``parts`` files named by a model.safetensors.index.json."""
    tensors = _all_tensors(model_dir)
    for file in model_dir.glob("*.safetensors"):
        file.unlink()
    names = sorted(tensors)
    weight_map = {}
    for part in range(parts):
        file = f"model-{part + 1:05d}-of-{parts:05d}.safetensors"
        write_safetensors(model_dir / file, {n: tensors[n] for n in names[part::parts]})
        weight_map.update({n: file for n in names[part::parts]})
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def copy_model(model_dir: Path, out: Path) -> Path:
    shutil.copytree(model_dir, out)
    return out
