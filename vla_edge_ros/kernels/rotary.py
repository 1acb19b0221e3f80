"""Rotary position embedding (HF "rotate_half" convention), for new tokens and for cached keys.

Rotations compose exactly, so after evicting tokens the cached keys are moved to their new
positions by rotating them by the position delta, with the same device function that applied the
original rotation. Angles are computed like HF: pos * inv_freq in fp32, then cos/sin in fp32.

Multi-axis rotary (``rope_axes``) gives each token several position ids and each rotated pair the
axis it reads: the ViT's 2-D rotary (the first half of the pairs turn with the patch row, the second
half with its column) and the decoder's M-RoPE (``mrope_section`` splits the pairs between the
temporal, height and width ids). A uniform shift of every axis is a 1-D rotation by that shift, so
cached M-RoPE keys still move with ``rope_cache_shift``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numba import cuda, float32

from vla_edge_ros.kernels._launch import DeviceArray, Stream, cdiv, check, check_array, dims

_THREADS = 128


@cuda.jit(device=True)
def _rotate_pair(src, dst, a, b, i, pos, inv_freq):
    """Rotate the pair (i, i + D/2) of the vector src[a, b, :] by pos * inv_freq[i] into dst."""
    half = inv_freq.shape[0]
    angle = float32(pos) * inv_freq[i]
    cos = math.cos(angle)
    sin = math.sin(angle)
    x1 = src[a, b, i]
    x2 = src[a, b, i + half]
    dst[a, b, i] = x1 * cos - x2 * sin
    dst[a, b, i + half] = x2 * cos + x1 * sin


@cuda.jit
def _rope_kernel(x, positions, inv_freq, out):
    half = inv_freq.shape[0]
    heads = x.shape[1]
    idx = cuda.grid(1)
    if idx < x.shape[0] * heads * half:
        i = idx % half
        th = idx // half
        h = th % heads
        t = th // heads
        _rotate_pair(x, out, t, h, i, positions[t], inv_freq)


@cuda.jit
def _rope_axes_kernel(x, ids, pair_axis, inv_freq, out):
    half = inv_freq.shape[0]
    heads = x.shape[1]
    idx = cuda.grid(1)
    if idx < x.shape[0] * heads * half:
        i = idx % half
        th = idx // half
        h = th % heads
        t = th // heads
        _rotate_pair(x, out, t, h, i, ids[pair_axis[i], t], inv_freq)


@cuda.jit
def _cache_shift_kernel(k_cache, slots, deltas, inv_freq):
    half = inv_freq.shape[0]
    kv_heads = k_cache.shape[0]
    idx = cuda.grid(1)
    if idx < slots.shape[0] * kv_heads * half:
        i = idx % half
        jh = idx // half
        h = jh % kv_heads
        j = jh // kv_heads
        _rotate_pair(k_cache, k_cache, h, slots[j], i, deltas[j], inv_freq)


def _check_inv_freq(inv_freq: DeviceArray, head_dim: int) -> None:
    check(head_dim % 2 == 0, f"head_dim must be even for RoPE, got {head_dim}")
    check_array(inv_freq, "inv_freq", (head_dim // 2,), (np.float32,))


def rope(
    x: DeviceArray,
    positions: DeviceArray,
    inv_freq: DeviceArray,
    out: DeviceArray | None = None,
    stream: Stream = 0,
) -> None:
    """Rotate x[T, heads, D] by positions[T] (may be negative); in place unless `out` is given."""
    tokens, heads, head_dim = dims(x, "x", 3)
    check_array(x, "x", (tokens, heads, head_dim), (np.float32,))
    check_array(positions, "positions", (tokens,), (np.int32,))
    _check_inv_freq(inv_freq, head_dim)
    target = x if out is None else out
    check_array(target, "out", (tokens, heads, head_dim), (np.float32,))
    n = tokens * heads * (head_dim // 2)
    if n:
        _rope_kernel[cdiv(n, _THREADS), _THREADS, stream](x, positions, inv_freq, target)


def pair_axes(sections: Sequence[int]) -> np.ndarray:
    """The axis each rotated pair reads, int32 [sum(sections)]: consecutive runs of sections[a] pairs
    read axis a (M-RoPE's ``mrope_section``; [D/4, D/4] for the ViT's row/column rotary)."""
    check(all(s >= 0 for s in sections), f"rotary sections must be >= 0, got {list(sections)}")
    return np.repeat(np.arange(len(sections), dtype=np.int32), list(sections))


def rope_axes(
    x: DeviceArray,
    ids: DeviceArray,
    pair_axis: DeviceArray,
    inv_freq: DeviceArray,
    out: DeviceArray | None = None,
    stream: Stream = 0,
) -> None:
    """Rotate x[T, heads, D]: pair (i, i + D/2) of token t turns by ids[pair_axis[i], t] * inv_freq[i].

    ids [A, T] int32 holds each token's position on A axes; pair_axis [D/2] int32 (see ``pair_axes``)
    must lie in [0, A). In place unless `out` is given.
    """
    tokens, heads, head_dim = dims(x, "x", 3)
    axes = dims(ids, "ids", 2)[0]
    check_array(x, "x", (tokens, heads, head_dim), (np.float32,))
    check_array(ids, "ids", (axes, tokens), (np.int32,))
    _check_inv_freq(inv_freq, head_dim)
    check_array(pair_axis, "pair_axis", (head_dim // 2,), (np.int32,))
    target = x if out is None else out
    check_array(target, "out", (tokens, heads, head_dim), (np.float32,))
    n = tokens * heads * (head_dim // 2)
    if n:
        _rope_axes_kernel[cdiv(n, _THREADS), _THREADS, stream](x, ids, pair_axis, inv_freq, target)


def rope_cache_shift(
    k_cache: DeviceArray,
    slots: DeviceArray,
    deltas: DeviceArray,
    inv_freq: DeviceArray,
    stream: Stream = 0,
) -> None:
    """Re-position cached keys in place: k_cache[:, slots[j], :] is rotated by deltas[j].

    Slots must be distinct; a delta of p' - p moves a key rotated for position p to position p'.
    """
    kv_heads, capacity, head_dim = dims(k_cache, "k_cache", 3)
    (count,) = dims(slots, "slots", 1)
    check_array(k_cache, "k_cache", (kv_heads, capacity, head_dim), (np.float32,))
    check_array(slots, "slots", (count,), (np.int32,))
    check_array(deltas, "deltas", (count,), (np.int32,))
    _check_inv_freq(inv_freq, head_dim)
    n = count * kv_heads * (head_dim // 2)
    if n:
        _cache_shift_kernel[cdiv(n, _THREADS), _THREADS, stream](k_cache, slots, deltas, inv_freq)
