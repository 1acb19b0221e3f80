"""NumPy twins of the kernels: the same semantics in plain fp32 NumPy, as the test oracle.

Twins take weights already widened to fp32 (see dtypes.to_float32) and return new arrays instead of
writing in place. Where the numpy backend already has the math (``numerics.ops``) the twin reuses it;
attention is written out loop by loop, an independent oracle for both the kernel and ``ops``.
"""

from __future__ import annotations

import numpy as np

from vla_edge_ros.numerics import ops

F32 = np.float32


def embedding_gather(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Rows of the fp32 table selected by ids."""
    return table[ids].astype(F32)


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x * rsqrt(mean(x^2) + eps) * weight, per row, in fp32."""
    return ops.rms_norm(x, weight, eps)


def layernorm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """(x - mean) / sqrt(biased var + eps) * weight + bias, per row, in fp32."""
    return ops.layer_norm(x, weight, bias, eps).astype(F32)


def linear(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """x @ w.T + bias."""
    out = x @ w.T
    return (out if bias is None else out + bias).astype(F32)


def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate x[T, heads, D] by positions[T], rotate_half convention, fp32 angles."""
    cos, sin = ops.rope_cos_sin(positions, inv_freq)
    return ops.apply_rope(x, cos, sin).astype(F32)


def rope_axes(x: np.ndarray, ids: np.ndarray, pair_axis: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate x[T, heads, D]: pair i of token t by ids[pair_axis[i], t] * inv_freq[i], fp32 angles."""
    angles = ids[pair_axis, :].T.astype(F32) * inv_freq[None, :]  # [T, D/2]
    return ops.apply_rope(x, np.cos(angles), np.sin(angles)).astype(F32)


def rope_cache_shift(
    k_cache: np.ndarray, slots: np.ndarray, deltas: np.ndarray, inv_freq: np.ndarray
) -> np.ndarray:
    """A copy of k_cache[Hkv, S, D] whose selected slots are rotated by their deltas."""
    shifted = k_cache.copy()
    selected = k_cache[:, slots, :].transpose(1, 0, 2)  # [n, Hkv, D]: one "token" per slot
    shifted[:, slots, :] = rope(selected, deltas, inv_freq).transpose(1, 0, 2)
    return shifted


def copy_rows(
    src_k: np.ndarray, src_v: np.ndarray, src_rows: np.ndarray, dst_k: np.ndarray, dst_v: np.ndarray,
    dst_rows: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Copies of dst_k, dst_v [rows, D] with row dst_rows[i] replaced by source row src_rows[i]."""
    k_new, v_new = dst_k.copy(), dst_v.copy()
    for src, dst in zip(src_rows, dst_rows):
        k_new[dst], v_new[dst] = src_k[src], src_v[src]
    return k_new, v_new


def attention(
    q: np.ndarray,
    k_pool: np.ndarray,
    v_pool: np.ndarray,
    block_table: np.ndarray,
    lengths: np.ndarray,
    entry_slot: np.ndarray,
    slot_pos: np.ndarray,
    q_pos: np.ndarray,
    scale: float,
) -> np.ndarray:
    """Grouped-query attention over paged KV, read through each KV head's block table.

    KV head hk reads its entries e < lengths[hk]: page block_table[hk, e // P], row e % P, holding
    the token of slot entry_slot[page, row] (-1: none), visible to query t iff
    slot_pos[token] <= q_pos[t]. A query that sees no entry gets zeros.
    """
    tokens, q_heads, head_dim = q.shape
    kv_heads = block_table.shape[0]
    page_tokens = entry_slot.shape[1]
    group = q_heads // kv_heads
    out = np.zeros((tokens, q_heads, head_dim), dtype=F32)
    for hk in range(kv_heads):
        entries = np.arange(lengths[hk])
        pages, rows = block_table[hk, entries // page_tokens], entries % page_tokens
        slots = entry_slot[pages, rows]
        keys, values = k_pool[pages, rows], v_pool[pages, rows]
        positions = np.where(slots >= 0, slot_pos[np.maximum(slots, 0)], 0)
        for t in range(tokens):
            visible = (slots >= 0) & (positions <= q_pos[t])
            if not visible.any():
                continue
            for h in range(hk * group, (hk + 1) * group):
                scores = (keys[visible] @ q[t, h]) * F32(scale)
                weights = np.exp(scores - scores.max())
                out[t, h] = (weights @ values[visible]) / weights.sum()
    return out


def segment_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_seqlens: np.ndarray,
                      scale: float) -> np.ndarray:
    """Per head, each token's softmax over the tokens of its own segment [cu[s], cu[s+1]), both
    directions; tokens outside every segment get zeros. q, k, v [T, H, D]."""
    out = np.zeros(q.shape, dtype=F32)
    for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        if start == end:
            continue
        for h in range(q.shape[1]):
            scores = (q[start:end, h] @ k[start:end, h].T) * F32(scale)
            weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
            out[start:end, h] = (weights @ v[start:end, h]) / weights.sum(axis=-1, keepdims=True)
    return out


def swiglu(gate_up: np.ndarray) -> np.ndarray:
    """silu(gate) * up for the fused [T, 2I] gate/up projection."""
    inter = gate_up.shape[1] // 2
    gate, up = gate_up[:, :inter], gate_up[:, inter:]
    return (ops.silu(gate) * up).astype(F32)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, x/2 * (1 + erf(x / sqrt 2))."""
    return ops.gelu(x).astype(F32)


def quick_gelu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(1.702 x)."""
    return ops.quick_gelu(x).astype(F32)


def add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The residual sum x + y."""
    return (x + y).astype(F32)


def argmax(logits: np.ndarray) -> int:
    """Index of the largest logit, ties to the lowest index; -1 when any logit is NaN or infinite."""
    return int(np.argmax(logits)) if np.isfinite(logits).all() else -1


def cosine_similarities(signatures: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Cosine of each row of signatures[F, D] with query[D]; 0.0 where either norm is zero."""
    signatures, query = signatures.astype(F32), query.astype(F32)
    norms = np.sqrt((signatures * signatures).sum(axis=1)) * np.sqrt(query @ query)
    out = np.zeros(signatures.shape[0], F32)
    np.divide(signatures @ query, norms, out=out, where=norms > 0)
    return out


def fast_weight_step(
    w: np.ndarray,
    b: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    beta: float,
    threshold: float,
    force: bool,
) -> tuple[np.ndarray, np.ndarray, float, bool]:
    """(W, b after the step, surprise, written): one delta-rule write iff forced or surprising."""
    err = (v - fast_weight_read(w, b, k)).astype(F32)
    surprise = F32(np.sqrt(err @ err))
    written = bool(force) or bool(surprise > F32(threshold))
    if not written:
        return w.copy(), b.copy(), float(surprise), False
    scaled = F32(beta) * err
    return (w + np.outer(scaled, k)).astype(F32), (b + scaled).astype(F32), float(surprise), True


def fast_weight_read(w: np.ndarray, b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """W q + b."""
    return (w @ q + b).astype(F32)
