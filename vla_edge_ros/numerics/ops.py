"""The transformer's math in NumPy, fp32: the reference every faster path is held to.

Each function follows HuggingFace's Qwen2 definition (RMSNorm in fp32, RoPE with the
"rotate half" pairing (i, i + D/2), SiLU-gated MLP), written for whole [tokens, features] blocks so
that NumPy spends its time in BLAS rather than in Python. The Qwen2-VL vision tower adds LayerNorm,
QuickGELU, exact (erf) GELU, 2-D rotary angles and non-causal attention within segments.
"""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis."""
    variance = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
    return (x * (1.0 / np.sqrt(variance + np.float32(eps)))).astype(np.float32) * weight


def rope_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """1 / theta^(2i/D) for i < D/2, in fp32 as HuggingFace computes it."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    return (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)


def rope_cos_sin(positions: np.ndarray, inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of position * inv_freq, each [T, D/2] fp32; positions may be negative shifts."""
    angles = positions.astype(np.float32)[:, None] * inv_freq[None, :]
    return np.cos(angles), np.sin(angles)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate pairs (i, i + D/2) of x [T, heads, D] by the per-token angles in cos/sin [T, D/2].

    Rotations compose, so applying this with a position *shift* to an already rotated key moves
    it to the shifted position exactly (up to rounding): that is how the KV arena re-positions.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate((x1 * c - x2 * s, x2 * c + x1 * s), axis=-1)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (biased variance, as torch)."""
    centred = x - np.mean(x, axis=-1, keepdims=True, dtype=np.float32)
    variance = np.mean(np.square(centred), axis=-1, keepdims=True, dtype=np.float32)
    return (centred * (1.0 / np.sqrt(variance + np.float32(eps)))).astype(np.float32) * weight + bias


def quick_gelu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(1.702 x): the Qwen2-VL tower's MLP activation."""
    return x / (1.0 + np.exp(np.float32(-1.702) * x))


# Chebyshev fit of erfc(z) = t * exp(-z^2 + P(t)), t = 1 / (1 + z/2), z >= 0: relative error < 1.2e-7
# everywhere (Press et al., Numerical Recipes, "erfcc"). NumPy has no erf and SciPy is not a dependency.
_ERFC_COEFFS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277)


def erf(x: np.ndarray) -> np.ndarray:
    """erf(x) to within 1.2e-7 (absolute), computed in fp64 and returned in fp32."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    poly = np.zeros_like(t)
    for coeff in reversed(_ERFC_COEFFS):
        poly = poly * t + coeff
    return (np.sign(x) * (1.0 - t * np.exp(poly - z * z))).astype(np.float32)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, 0.5 x (1 + erf(x / sqrt 2)): the patch merger's activation (torch's nn.GELU())."""
    return np.float32(0.5) * x * (np.float32(1.0) + erf(x * np.float32(1.0 / np.sqrt(2.0))))


def rope_cos_sin_2d(rows: np.ndarray, cols: np.ndarray, inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [T, 2 F] of a vision patch's 2-D rotary angles: row * inv_freq, then col * inv_freq.

    With ``inv_freq`` = ``rope_inv_freq(head_dim // 2, theta)`` (F = head_dim / 4) this feeds
    ``apply_rope``'s (i, i + D/2) pairing exactly as Qwen2-VL's tower rotates: the first quarter of each
    half by the row, the second quarter by the column.
    """
    cos_r, sin_r = rope_cos_sin(rows, inv_freq)
    cos_c, sin_c = rope_cos_sin(cols, inv_freq)
    return np.concatenate((cos_r, cos_c), axis=-1), np.concatenate((sin_r, sin_c), axis=-1)


def segment_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, bounds: np.ndarray, scale: float) -> np.ndarray:
    """Non-causal multi-head attention of q, k, v [T, H, D] within segments: tokens bounds[i]:bounds[i+1]
    attend to each other and to nothing else (images, frames or windows packed in one sequence, HF's
    cu_seqlens). ``bounds`` runs from 0 to T, non-decreasing. Returns [T, H * D]."""
    tokens, heads, dim = q.shape
    out = np.empty((tokens, heads, dim), dtype=np.float32)
    for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if end == start:
            continue
        qs = (q[start:end] * np.float32(scale)).transpose(1, 0, 2)  # [H, L, D]
        scores = qs @ k[start:end].transpose(1, 2, 0)  # [H, L, L]
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        out[start:end] = (scores @ v[start:end].transpose(1, 0, 2)).transpose(1, 0, 2)
    return out.reshape(tokens, heads * dim)


def attention_bias(visible: np.ndarray) -> np.ndarray:
    """Additive mask [T, S]: 0 where a query may read a slot, -inf where it may not."""
    return np.where(visible, np.float32(0.0), np.float32(-np.inf))


def gqa_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray, scale: float) -> np.ndarray:
    """Grouped-query attention of q [T, Hq, D] over cached k, v [Hkv, S, D].

    ``bias`` [T, S] is the additive mask from ``attention_bias`` (which slots each query may read), or
    [Hkv, T, S] when KV heads read different slots (per-head eviction, ``dms``).
    Query head h reads KV head h // (Hq // Hkv); a query that may read nothing gets zeros.
    Scores are computed as k @ q^T (a tall product BLAS handles well) and reduced along rows.
    Returns [T, Hq * D].
    """
    tokens, q_heads, dim = q.shape
    kv_heads, slots, _ = k.shape
    group = q_heads // kv_heads
    out = np.empty((tokens, kv_heads, group, dim), dtype=np.float32)
    queries = (q * np.float32(scale)).reshape(tokens, kv_heads, group, dim)
    for head in range(kv_heads):
        rows = queries[:, head].reshape(tokens * group, dim)
        scores = np.ascontiguousarray((k[head] @ rows.T).T).reshape(tokens, group, slots)
        scores += (bias[head] if bias.ndim == 3 else bias)[:, None, :]
        peak = scores.max(axis=-1, keepdims=True)
        scores -= np.where(np.isfinite(peak), peak, np.float32(0.0))
        np.exp(scores, out=scores)
        total = scores.sum(axis=-1, keepdims=True)
        scores /= np.where(total > 0, total, np.float32(1.0))
        out[:, head] = (scores.reshape(tokens * group, slots) @ v[head]).reshape(tokens, group, dim)
    return out.reshape(tokens, q_heads * dim)


def attention_weights(q: np.ndarray, k: np.ndarray, bias: np.ndarray, scale: float) -> np.ndarray:
    """Softmax weights [Hq, S] of one token's queries q [Hq, D] over cached k [Hkv, S, D] (bias [S], or
    [Hkv, S] per KV head)."""
    q_heads, kv_heads = q.shape[0], k.shape[0]
    group = q_heads // kv_heads
    scores = np.einsum("hgd,hsd->hgs", q.reshape(kv_heads, group, -1), k).reshape(q_heads, -1) * np.float32(scale)
    scores = scores + (np.repeat(bias, group, axis=0) if bias.ndim == 2 else bias[None, :])
    peak = scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores - np.where(np.isfinite(peak), peak, 0.0))
    total = weights.sum(axis=-1, keepdims=True)
    return (weights / np.where(total > 0, total, 1.0)).astype(np.float32)
