"""Small Qwen2 checkpoints written by HuggingFace ``transformers`` itself, for parity tests.

Weights are random (seeded); norms and biases are perturbed away from HF's 1/0 init so that a
forward pass that ignored them would be caught.
"""

from __future__ import annotations

from pathlib import Path

VARIANTS: dict[str, dict] = {
    # name: Qwen2Config overrides (plus "dtype" for storage). Kept tiny: the CUDA backend is tested on
    # these under Numba's simulator, which runs every GPU thread as a Python thread.
    "gqa2_tied": dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=64, tie_word_embeddings=True),
    "odd_heads_untied": dict(hidden_size=24, intermediate_size=40, num_hidden_layers=1, num_attention_heads=3,
                             num_key_value_heads=3, vocab_size=48, tie_word_embeddings=False),
    "one_kv_head": dict(hidden_size=24, intermediate_size=32, num_hidden_layers=1, num_attention_heads=6,
                        num_key_value_heads=1, vocab_size=40, tie_word_embeddings=False),
    "head_dim_differs": dict(hidden_size=20, intermediate_size=36, num_hidden_layers=1, num_attention_heads=5,
                             num_key_value_heads=1, head_dim=12, vocab_size=44, tie_word_embeddings=True),
    "bf16_storage": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=56, tie_word_embeddings=False, dtype="bfloat16"),
}


def write_hf_model(out: Path, name: str, seed: int = 0) -> Path:
    """Build variant ``name`` with transformers and save it as a local HF directory."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    overrides = dict(VARIANTS[name])
    dtype = overrides.pop("dtype", "float32")
    config = Qwen2Config(rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=512, **overrides)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif param_name.endswith(".bias"):
                param.copy_(0.1 * torch.randn_like(param))
            else:
                param.copy_(0.15 * torch.randn_like(param))
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(out))
    return out
