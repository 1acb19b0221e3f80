"""The transformer's math in NumPy, fp32: the reference every faster path is held to.

Each function follows HuggingFace's Qwen2 definition (RMSNorm in fp32, RoPE with the
"rotate half" pairing (i, i + D/2), SiLU-gated MLP), written for whole [tokens, features] blocks so
that NumPy spends its time in BLAS rather than in Python.
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


def mrope_cos_sin(rope_positions: np.ndarray, inv_freq: np.ndarray,
                  mrope_section: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [T, D/2] of multimodal RoPE (Qwen2-VL's M-RoPE) for ids ``rope_positions`` [3, T].

    The D/2 frequencies are cut into consecutive bands of ``mrope_section`` sizes; band b turns by
    position component b % 3 (temporal, height, width), so frequency i rotates by
    ``rope_positions[band(i)] * inv_freq[i]``. When all three ids are equal this is ``rope_cos_sin``.
    """
    if sum(mrope_section) != inv_freq.size:
        raise ValueError(f"mrope_section {list(mrope_section)} sums to {sum(mrope_section)}, "
                         f"not head_dim / 2 = {inv_freq.size}")
    component = np.repeat(np.arange(len(mrope_section)) % 3, mrope_section)  # [D/2]: which id each frequency reads
    angles = rope_positions.astype(np.float32)[component].T * inv_freq[None, :]
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
