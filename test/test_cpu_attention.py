"""``cpu_kernels.attention_layer`` against its NumPy twin: ``ops.apply_rope``, the row writes and
``ops.gqa_attention`` over the additive mask, as ``NumpyBackend.project`` and ``attention_inputs`` run them.

Both layouts' reads (a run of rows per head; rows through a block table, -1 past a head's length), holes,
entries after some queries, a query that may read nothing, decode and prefill token counts."""

from __future__ import annotations

import numpy as np
import pytest

from vla_edge_ros.cpu_kernels.attention import HIDDEN, attention_layer
from vla_edge_ros.numerics import ops

DIM, Q_HEADS, KV_HEADS, POOL = 32, 4, 2, 256


def twin(qkv, cos, sin, k_rows, v_rows, new_rows, read_rows, entry_positions, positions, scale):
    """The NumPy path: rotate, store the new rows, gather what each head reads, attend."""
    tokens = qkv.shape[0]
    q_end, k_end = Q_HEADS * DIM, (Q_HEADS + KV_HEADS) * DIM
    q = ops.apply_rope(qkv[:, :q_end].reshape(tokens, Q_HEADS, DIM), cos, sin)
    k = ops.apply_rope(qkv[:, q_end:k_end].reshape(tokens, KV_HEADS, DIM), cos, sin)
    k_rows[new_rows] = k.transpose(1, 0, 2)
    v_rows[new_rows] = qkv[:, k_end:].reshape(tokens, KV_HEADS, DIM).transpose(1, 0, 2)
    inside = np.maximum(read_rows, 0)
    visible = (read_rows >= 0)[:, None, :] & (entry_positions[:, None, :] <= positions[None, :, None])
    return ops.gqa_attention(q, k_rows[inside], v_rows[inside], ops.attention_bias(visible), scale)


def case(tokens: int, lengths: tuple[int, ...], seed: int = 0, holes: int = 3):
    """Heads holding ``lengths`` entries on rows spread over the pool (-1 past a head's length): context at
    positions below the new tokens' in no particular order, then the new tokens; ``holes`` of head 0's
    context entries emptied, and one of head 1's placed after every query."""
    rng = np.random.default_rng(seed)
    n = max(lengths)
    first = n - tokens  # the new tokens' first position: every context position is below it
    positions = np.arange(first, first + tokens, dtype=np.int32)
    qkv = rng.standard_normal((tokens, (Q_HEADS + 2 * KV_HEADS) * DIM)).astype(np.float32)
    rows = rng.permutation(POOL)[:KV_HEADS * n].reshape(KV_HEADS, n).astype(np.int64)
    entry_positions = np.full((KV_HEADS, n), HIDDEN, dtype=np.int32)
    for head, length in enumerate(lengths):
        rows[head, length:] = -1
        entry_positions[head, :length - tokens] = rng.choice(first, length - tokens, replace=False)
        entry_positions[head, length - tokens:length] = positions
    new_rows = np.stack([rows[head, length - tokens:length] for head, length in enumerate(lengths)])
    entry_positions[0, rng.permutation(lengths[0] - tokens)[:holes]] = HIDDEN
    entry_positions[1, 0] = positions[-1] + 5  # after every query: read by none
    cos, sin = ops.rope_cos_sin(positions, ops.rope_inv_freq(DIM, 10000.0))
    pool = rng.standard_normal((2, POOL, DIM)).astype(np.float32)
    return qkv, cos, sin, pool, new_rows, rows, entry_positions, positions


@pytest.mark.parametrize("tokens", [1, 3, 16])
@pytest.mark.parametrize("lengths", [(40, 40), (40, 25), (17, 30)])
def test_attention_layer_equals_the_numpy_twin(tokens, lengths):
    qkv, cos, sin, pool, new_rows, rows, entry_positions, positions = case(tokens, lengths)
    scale = np.float32(1.0 / np.sqrt(DIM))
    k_twin, v_twin = pool[0].copy(), pool[1].copy()
    want = twin(qkv, cos, sin, k_twin, v_twin, new_rows, rows, entry_positions, positions, scale)
    k_rows, v_rows = pool[0].copy(), pool[1].copy()
    got = np.empty_like(want)
    attention_layer(qkv, cos, sin, Q_HEADS, k_rows, v_rows, new_rows, rows, entry_positions, positions, scale, got)
    assert np.array_equal(k_rows, k_twin) and np.array_equal(v_rows, v_twin)  # RoPE'd keys bit for bit
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * float(np.abs(want).max()))


def test_a_query_that_may_read_nothing_gets_zeros():
    qkv, cos, sin, pool, new_rows, rows, entry_positions, positions = case(2, (20, 20))
    entry_positions[:] = HIDDEN  # not even itself
    out = np.full((2, Q_HEADS * DIM), np.nan, dtype=np.float32)
    attention_layer(qkv, cos, sin, Q_HEADS, pool[0], pool[1], new_rows, rows, entry_positions, positions,
                    np.float32(0.5), out)
    assert not out.any()



def test_a_nan_key_shows_in_every_query_that_reads_it():
    qkv, cos, sin, pool, new_rows, rows, entry_positions, positions = case(1, (20, 20))
    entry_positions[0, :19] = HIDDEN  # head 0's queries read only the new token, whose key is NaN
    qkv[:, (Q_HEADS * DIM):(Q_HEADS + 1) * DIM] = np.nan
    out = np.empty((1, Q_HEADS * DIM), dtype=np.float32)
    attention_layer(qkv, cos, sin, Q_HEADS, pool[0], pool[1], new_rows, rows, entry_positions, positions,
                    np.float32(0.5), out)
    group = Q_HEADS // KV_HEADS
    assert np.isnan(out[:, :group * DIM]).all() and np.isfinite(out[:, group * DIM:]).all()  # KV head 1's is finite
