"""Small Qwen2 checkpoints written by HuggingFace ``transformers`` itself, for parity tests.

Weights are random (seeded); norms and biases are perturbed away from HF's 1/0 init so that a
forward pass that ignored them would be caught.
"""

from __future__ import annotations

from pathlib import Path

VARIANTS: dict[str, dict] = {
    # name: Qwen2Config overrides (plus "dtype" for storage)
    "gqa2_tied": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=300, tie_word_embeddings=True),
    "odd_heads_untied": dict(hidden_size=60, intermediate_size=100, num_hidden_layers=3, num_attention_heads=3,
                             num_key_value_heads=3, vocab_size=280, tie_word_embeddings=False),
    "one_kv_head": dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
                        num_key_value_heads=1, vocab_size=260, tie_word_embeddings=False),
    "head_dim_differs": dict(hidden_size=40, intermediate_size=72, num_hidden_layers=2, num_attention_heads=5,
                             num_key_value_heads=1, head_dim=24, vocab_size=270, tie_word_embeddings=True),
    "bf16_storage": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=320, tie_word_embeddings=False, dtype="bfloat16"),
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
