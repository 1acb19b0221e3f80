"""Each CUDA kernel against its NumPy twin, under Numba's CUDA simulator on tiny shapes.

The simulator runs every CUDA thread as a Python thread and each __syncthreads as a GIL hand-off,
so shapes stay tiny and the thread switch interval is shortened while this module runs. The twins
themselves are checked against independent formulations (float64, dense masks, HF's own RoPE).
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


import numpy as np
import pytest

cuda = pytest.importorskip("numba.cuda", reason="numba-cuda is not installed")
if not cuda.is_available():
    pytest.skip("no CUDA GPU and the CUDA simulator is off", allow_module_level=True)

import vla_edge_ros.kernels as K  # noqa: E402
from vla_edge_ros.kernels import reference as ref  # noqa: E402
from vla_edge_ros.kernels.dtypes import WeightKind  # noqa: E402
from vla_edge_ros.numerics import ops  # noqa: E402
from vla_edge_ros.numerics import weight_formats as wf  # noqa: E402
from vla_edge_ros.numerics.bf16 import bf16_bits, bf16_bits_to_float32  # noqa: E402

F32 = np.float32
KINDS = list(K.ELEMENT_KINDS)
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _stored(values: np.ndarray, kind: WeightKind) -> np.ndarray:
    """fp32 values rounded into the storage of `kind`."""
    if kind is WeightKind.BF16:
        return bf16_bits(values)
    return values.astype(kind.storage_dtype)


def _weight(rng: np.random.Generator, shape: tuple[int, ...], kind: WeightKind):
    """(device weight in `kind`, the exact fp32 values it holds)."""
    host = _stored(rng.standard_normal(shape).astype(F32) * F32(0.5), kind)
    return K.to_device_weight(host, kind), K.to_float32(host, kind)


def _dev(array: np.ndarray):
    return cuda.to_device(np.ascontiguousarray(array))


def _randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(F32)


# --- weight storage --------------------------------------------------------------------------


def test_bf16_bits_round_to_nearest_even_like_torch() -> None:
    torch = pytest.importorskip("torch")
    values = np.concatenate(
        [
            _randn(_rng(1), 1000) * F32(1e3),
            np.array([0.0, -0.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, np.inf, -np.inf, 3.4e38], F32),
        ]
    )
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy()
    np.testing.assert_array_equal(bf16_bits(values), expected.view(np.uint16))
    back = bf16_bits_to_float32(bf16_bits(values))
    np.testing.assert_array_equal(back, torch.from_numpy(values).to(torch.bfloat16).float().numpy())
    assert np.isnan(bf16_bits_to_float32(bf16_bits(np.array([np.nan], F32))))[0]


def test_weight_kind_is_read_from_storage_dtype_and_checked() -> None:
    for kind in KINDS:
        host = np.zeros((2, 3), kind.storage_dtype)
        assert K.weight_kind_of(K.to_device_weight(host, kind)) is kind
    with pytest.raises(TypeError):
        K.to_device_weight(np.zeros(3, np.float32), WeightKind.BF16)
    with pytest.raises(TypeError):
        K.weight_kind_of(np.zeros(3, np.int8))
    vec = K.to_device_vector(bf16_bits(np.array([1.5, -2.0], F32)), WeightKind.BF16)
    np.testing.assert_array_equal(vec.copy_to_host(), np.array([1.5, -2.0], F32))


# --- embedding, norm, element-wise -----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_embedding_gather(kind: WeightKind) -> None:
    rng = _rng(2)
    table, table32 = _weight(rng, (11, 40), kind)
    ids = np.array([3, 0, 10, 3], np.int32)
    out = cuda.device_array((4, 40), F32)
    K.embedding_gather(table, _dev(ids), out)
    np.testing.assert_array_equal(out.copy_to_host(), ref.embedding_gather(table32, ids))


@pytest.mark.parametrize("hidden", [50, 300, 1100])  # 32, 64 and 128 threads per row
def test_rmsnorm_matches_twin_and_float64(hidden: int) -> None:
    rng = _rng(3)
    x, weight = _randn(rng, 3, hidden), _randn(rng, hidden)
    out = cuda.device_array((3, hidden), F32)
    K.rmsnorm(_dev(x), _dev(weight), 1e-6, out)
    expected = ref.rmsnorm(x, weight, 1e-6)
    np.testing.assert_allclose(out.copy_to_host(), expected, **TOL)
    x64 = x.astype(np.float64)
    exact = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * weight
    np.testing.assert_allclose(expected, exact, rtol=1e-5, atol=1e-6)


def test_rmsnorm_in_place() -> None:
    x, weight = _randn(_rng(4), 2, 20), _randn(_rng(5), 20)
    dx = _dev(x)
    K.rmsnorm(dx, _dev(weight), 1e-5, dx)
    np.testing.assert_allclose(dx.copy_to_host(), ref.rmsnorm(x, weight, 1e-5), **TOL)


def test_swiglu_and_add_inplace() -> None:
    rng = _rng(6)
    gate_up = _randn(rng, 3, 2 * 21) * F32(4)
    out = cuda.device_array((3, 21), F32)
    K.swiglu(_dev(gate_up), out)
    np.testing.assert_allclose(out.copy_to_host(), ref.swiglu(gate_up), **TOL)
    g64, u64 = gate_up[:, :21].astype(np.float64), gate_up[:, 21:].astype(np.float64)
    np.testing.assert_allclose(
        ref.swiglu(gate_up), g64 / (1 + np.exp(-g64)) * u64, rtol=1e-5, atol=1e-6
    )
    x, y = _randn(rng, 3, 70), _randn(rng, 3, 70)
    dx = _dev(x)
    K.add_inplace(dx, _dev(y))
    np.testing.assert_array_equal(dx.copy_to_host(), ref.add(x, y))


# --- linear ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize(
    "tokens, n_out, depth, with_bias",
    [
        (1, 9, 520, True),
        (1, 9, 150, True),
        (1, 5, 33, False),
        (3, 37, 45, True),
        (20, 70, 40, False),
    ],
    ids=["gemv-packed", "gemv-unpacked", "gemv-nobias", "gemm", "gemm-2x3-tiles"],
)
def test_linear(kind: WeightKind, tokens: int, n_out: int, depth: int, with_bias: bool) -> None:
    rng = _rng(7)
    w, w32 = _weight(rng, (n_out, depth), kind)
    x = _randn(rng, tokens, depth)
    bias = _randn(rng, n_out) if with_bias else None
    out = cuda.device_array((tokens, n_out), F32)
    K.linear(_dev(x), w, None if bias is None else _dev(bias), out)
    np.testing.assert_allclose(out.copy_to_host(), ref.linear(x, w32, bias), **TOL)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_linear_on_a_row_slice_of_the_weight(kind: WeightKind) -> None:
    """lm_head restricted to the last vocabulary rows (the action bins) is a view, not a copy."""
    rng = _rng(17)
    w, w32 = _weight(rng, (11, 24), kind)
    x = _randn(rng, 1, 24)
    out = cuda.device_array((1, 4), F32)
    K.linear(_dev(x), w[7:], None, out)
    np.testing.assert_allclose(out.copy_to_host(), ref.linear(x, w32[7:], None), **TOL)


def test_linear_wide_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 64 x 64 tile with a 4 x 4 register tile per thread, which large shapes select."""
    from vla_edge_ros.kernels import matmul

    monkeypatch.setattr(matmul, "_TARGET_BLOCKS", 1)
    assert matmul._gemm_tiles(40, 70) == (64, 64)
    rng = _rng(8)
    w, w32 = _weight(rng, (70, 36), WeightKind.BF16)
    x, bias = _randn(rng, 40, 36), _randn(rng, 70)
    out = cuda.device_array((40, 70), F32)
    K.linear(_dev(x), w, _dev(bias), out)
    np.testing.assert_allclose(out.copy_to_host(), ref.linear(x, w32, bias), **TOL)


def test_linear_rejects_mismatched_shapes() -> None:
    w, _ = _weight(_rng(9), (4, 8), WeightKind.FP32)
    with pytest.raises(ValueError, match="axis 1"):
        K.linear(_dev(np.zeros((2, 7), F32)), w, None, cuda.device_array((2, 4), F32))
    with pytest.raises(ValueError, match="bias"):
        K.linear(
            _dev(np.zeros((2, 8), F32)), w, _dev(np.zeros(5, F32)), cuda.device_array((2, 4), F32)
        )


# --- linear over packed int8 / int4 weights ----------------------------------------------------


def _packed(rng: np.random.Generator, shape: tuple[int, int], fmt: str, group: int = 64) -> wf.PackedMatrix:
    """Random weights packed in `fmt`, columns scaled by a ramp so that every group's scale differs; int8
    data is then overwritten with every byte value (-128 too, which pack never makes) to pin the sign."""
    w = rng.standard_normal(shape).astype(F32) * np.linspace(0.1, 2.0, shape[1], dtype=F32)
    matrix = wf.pack(w, fmt, group)
    if fmt == "int8":
        matrix.data[...] = rng.integers(-128, 128, shape, dtype=np.int8)
    return matrix


# in: a multiple of 8 (int8 eight a word), of 4 only, of neither; never a multiple of the int4 group.
# out: never a multiple of the GEMV's 4 rows a block.
@pytest.mark.parametrize(
    "fmt, group, n_out, depth",
    [("int8", 0, 9, 48), ("int8", 0, 7, 44), ("int8", 0, 5, 45),
     ("int4", 32, 9, 80), ("int4", 64, 7, 150), ("int4", 128, 5, 200), ("bfloat16", 0, 5, 44)],
    ids=["int8x8", "int8x4", "int8x1", "int4-g32", "int4-g64", "int4-g128", "bf16-packed"],
)
@pytest.mark.parametrize("tokens, with_bias", [(1, True), (1, False), (3, True)], ids=["gemv", "gemv-nobias", "gemm"])
def test_linear_over_packed_weights_matches_reference_linear(
        fmt: str, group: int, n_out: int, depth: int, tokens: int, with_bias: bool) -> None:
    rng = _rng(31)
    matrix = _packed(rng, (n_out, depth), fmt, group or wf.DEFAULT_INT4_GROUP)
    x = _randn(rng, tokens, depth)
    bias = _randn(rng, n_out) if with_bias else None
    out = cuda.device_array((tokens, n_out), F32)
    K.linear(_dev(x), K.to_device_packed(matrix), None if bias is None else _dev(bias), out)
    np.testing.assert_allclose(out.copy_to_host(), wf.reference_linear(x, matrix, bias), **TOL)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_linear_on_a_row_slice_of_a_packed_weight(fmt: str) -> None:
    rng = _rng(32)
    matrix = _packed(rng, (11, 72), fmt, 32)
    x = _randn(rng, 1, 72)
    out = cuda.device_array((1, 4), F32)
    K.linear(_dev(x), K.to_device_packed(matrix)[7:], None, out)
    np.testing.assert_allclose(out.copy_to_host(), wf.reference_linear(x, wf.take_rows(matrix, slice(7, None))),
                               **TOL)


@pytest.mark.parametrize("fmt, group", [("int8", 0), ("int4", 32), ("int4", 128)])
def test_embedding_gather_dequantizes_packed_rows_exactly(fmt: str, group: int) -> None:
    matrix = _packed(_rng(33), (6, 45), fmt, group or wf.DEFAULT_INT4_GROUP)
    ids = np.array([5, 0, 3, 5], np.int32)
    out = cuda.device_array((4, 45), F32)
    K.embedding_gather(K.to_device_packed(matrix), _dev(ids), out)
    np.testing.assert_array_equal(out.copy_to_host(), wf.dequantize(matrix)[ids])


def test_device_weight_is_checked_against_its_shape() -> None:
    matrix = wf.pack(_randn(_rng(34), 4, 40), "int4", 32)
    weight = K.to_device_packed(matrix)
    assert weight.kind is WeightKind.INT4 and weight.shape == (4, 40) and weight.nbytes == matrix.nbytes
    x, out = _dev(np.zeros((1, 40), F32)), cuda.device_array((1, 4), F32)
    with pytest.raises(ValueError, match="scales"):
        K.linear(x, K.DeviceWeight(WeightKind.INT4, (4, 40), weight.data, _dev(np.zeros((4, 1), F32)), 32), None, out)
    with pytest.raises(ValueError, match="group"):
        K.linear(x, K.DeviceWeight(WeightKind.INT4, (4, 40), weight.data, weight.scales, 48), None, out)
    with pytest.raises(ValueError, match="scales"):
        K.linear(x, K.DeviceWeight(WeightKind.INT8, (4, 40), _dev(np.zeros((4, 40), np.int8))), None, out)
    with pytest.raises(TypeError):
        K.linear(x, _dev(np.zeros((4, 40), np.int8)), None, out)  # int8 values without their scales


# --- rope ------------------------------------------------------------------------------------

HEAD_DIM = 16
INV_FREQ = (1.0 / 10000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)).astype(F32)


def test_rope_twin_matches_hf_apply_rotary_pos_emb() -> None:
    torch = pytest.importorskip("torch")
    qwen2 = pytest.importorskip("transformers.models.qwen2.modeling_qwen2")
    rng = _rng(10)
    x, positions = _randn(rng, 4, 3, HEAD_DIM), np.array([0, 1, 7, 300], np.int32)
    freqs = positions.astype(F32)[:, None] * INV_FREQ[None, :]
    emb = torch.from_numpy(np.concatenate([freqs, freqs], axis=-1))
    xt = torch.from_numpy(x).transpose(0, 1)[None]  # [1, heads, T, D], HF's layout
    rotated, _ = qwen2.apply_rotary_pos_emb(xt, xt, emb.cos()[None], emb.sin()[None])
    expected = rotated[0].transpose(0, 1).numpy()
    np.testing.assert_allclose(ref.rope(x, positions, INV_FREQ), expected, rtol=1e-6, atol=1e-6)


def test_rope_matches_twin_in_place_and_out_of_place() -> None:
    rng = _rng(11)
    x, positions = _randn(rng, 3, 2, HEAD_DIM), np.array([0, 5, -3], np.int32)
    expected = ref.rope(x, positions, INV_FREQ)
    dx = _dev(x)
    out = cuda.device_array(x.shape, F32)
    K.rope(dx, _dev(positions), _dev(INV_FREQ), out)
    np.testing.assert_allclose(out.copy_to_host(), expected, **TOL)
    np.testing.assert_array_equal(dx.copy_to_host(), x)
    K.rope(dx, _dev(positions), _dev(INV_FREQ))
    np.testing.assert_allclose(dx.copy_to_host(), expected, **TOL)


def _cache_with_keys_at(rng: np.random.Generator, positions: np.ndarray) -> np.ndarray:
    """A [2, 10, D] key cache whose slots hold keys rotated to `positions` (one per slot)."""
    raw = _randn(rng, positions.shape[0], 2, HEAD_DIM)
    return ref.rope(raw, positions, INV_FREQ).transpose(1, 0, 2).copy()


def test_rope_cache_shift_matches_twin_and_leaves_other_slots() -> None:
    rng = _rng(12)
    cache = _cache_with_keys_at(rng, np.arange(10, dtype=np.int32))
    slots, deltas = np.array([1, 4, 7], np.int32), np.array([3, -2, 5], np.int32)
    dcache = _dev(cache)
    K.rope_cache_shift(dcache, _dev(slots), _dev(deltas), _dev(INV_FREQ))
    expected = ref.rope_cache_shift(cache, slots, deltas, INV_FREQ)
    np.testing.assert_allclose(dcache.copy_to_host(), expected, **TOL)
    untouched = np.setdiff1d(np.arange(10), slots)
    np.testing.assert_array_equal(dcache.copy_to_host()[:, untouched], cache[:, untouched])


def test_rope_shift_round_trip_and_composition() -> None:
    """Shifting by +d then -d recovers the key; shifting p -> p' equals rotating at p' directly."""
    rng = _rng(13)
    raw = _randn(rng, 10, 2, HEAD_DIM)
    old_pos = np.arange(20, 30, dtype=np.int32)
    new_pos = np.array([3, 4, 5, 6, 7, 20, 21, 40, 41, 2], np.int32)
    cache = ref.rope(raw, old_pos, INV_FREQ).transpose(1, 0, 2).copy()
    slots = np.arange(10, dtype=np.int32)
    dcache = _dev(cache)
    K.rope_cache_shift(dcache, _dev(slots), _dev(new_pos - old_pos), _dev(INV_FREQ))
    direct = ref.rope(raw, new_pos, INV_FREQ).transpose(1, 0, 2)
    np.testing.assert_allclose(dcache.copy_to_host(), direct, rtol=1e-5, atol=2e-5)
    K.rope_cache_shift(dcache, _dev(slots), _dev(old_pos - new_pos), _dev(INV_FREQ))
    np.testing.assert_allclose(dcache.copy_to_host(), cache, rtol=1e-5, atol=2e-5)


# --- KV pool and paged attention ------------------------------------------------------------


def test_copy_rows_scatters_gathers_and_moves_like_its_twin() -> None:
    rng = _rng(14)
    pool_k, pool_v = _randn(rng, 12, 8), _randn(rng, 12, 8)
    new_k, new_v = _randn(rng, 3, 8), _randn(rng, 3, 8)
    dk, dv = _dev(pool_k), _dev(pool_v)
    rows = _dev(np.arange(3, dtype=np.int32))
    K.copy_rows(_dev(new_k), _dev(new_v), rows, dk, dv, _dev(np.int32([11, 0, 5])))  # new tokens into the pool
    pool_k, pool_v = ref.copy_rows(new_k, new_v, [0, 1, 2], pool_k, pool_v, [11, 0, 5])
    np.testing.assert_array_equal(dk.copy_to_host(), pool_k)
    np.testing.assert_array_equal(dv.copy_to_host(), pool_v)
    out_k, out_v = cuda.device_array((3, 8), F32), cuda.device_array((3, 8), F32)
    K.copy_rows(dk, dv, _dev(np.int32([7, 0, 9])), out_k, out_v, rows)  # held rows out for the host
    zeros = np.zeros((3, 8), F32)
    np.testing.assert_array_equal(out_k.copy_to_host(), ref.copy_rows(pool_k, pool_v, [7, 0, 9], zeros, zeros,
                                                                       [0, 1, 2])[0])
    K.copy_rows(dk, dv, _dev(np.int32([10, 11])), dk, dv, _dev(np.int32([2, 4])))  # compaction within the pool
    pool_k, pool_v = ref.copy_rows(pool_k, pool_v, [10, 11], pool_k, pool_v, [2, 4])
    np.testing.assert_array_equal(dk.copy_to_host(), pool_k)
    np.testing.assert_array_equal(dv.copy_to_host(), pool_v)


def _arena(rng: np.random.Generator, kv_heads: int, head_dim: int, tokens: int, capacity: int = 24):
    """A layer's tokens after evictions, by slot: pinned prompt, kept middle slots with evicted ones between
    them, the newest tokens already written at the end; positions re-packed in cache order."""
    k_cache = _randn(rng, kv_heads, capacity, head_dim)
    v_cache = _randn(rng, kv_heads, capacity, head_dim)
    valid = np.zeros(capacity, np.uint8)
    slot_pos = np.full(capacity, 10_000, np.int32)  # stale positions of free slots
    kept = [0, 1, 2, 3, *range(8, capacity - tokens - 2, 3), *range(capacity - tokens, capacity)]
    valid[kept] = 1
    slot_pos[kept] = np.arange(len(kept), dtype=np.int32)
    slot_pos[5] = 4  # an evicted slot with a plausible position must still be ignored
    q_pos = slot_pos[capacity - tokens :].copy()
    return k_cache, v_cache, slot_pos, valid, q_pos


def _per_head_masks(valid: np.ndarray, tokens: int) -> np.ndarray:
    """[2, S] what two KV heads read after evicting different tokens (dms): head 0 every other kept middle
    slot, head 1 a prompt slot; the newest tokens stay readable by both."""
    masks = np.stack([valid, valid])
    middle = np.flatnonzero(valid[: valid.size - tokens])[4:]
    masks[0, middle[::2]] = 0
    masks[1, 1] = 0
    return masks


def _pages(rng: np.random.Generator, k_cache, v_cache, masks, page_tokens: int = 4, holes: int = 0):
    """The same layer as paged KV: each KV head lists the slots its mask shows, in a shuffled order, with
    ``holes`` entries holding no token among them, on pages scattered over a pool with spare pages; every
    row no entry fills holds garbage that must never be read. Returns the attention arguments."""
    kv_heads, _, head_dim = k_cache.shape
    lists = []
    for hk in range(kv_heads):
        listed = np.concatenate([rng.permutation(np.flatnonzero(masks[hk])), np.full(holes, -1)])
        lists.append(rng.permutation(listed).astype(np.int32))
    width = max(-(-len(listed) // page_tokens) for listed in lists) + 1
    pages = kv_heads * width + 3
    k_pool, v_pool = _randn(rng, pages, page_tokens, head_dim) * F32(1e3), _randn(rng, pages, page_tokens, head_dim)
    block_table = np.full((kv_heads, width), -1, np.int32)
    entry_slot = np.full((pages, page_tokens), -1, np.int32)
    order = rng.permutation(pages)
    for hk, listed in enumerate(lists):
        used = -(-len(listed) // page_tokens)
        block_table[hk, :used] = order[hk * width:hk * width + used]
        for e, slot in enumerate(listed):
            page, row = block_table[hk, e // page_tokens], e % page_tokens
            entry_slot[page, row] = slot
            if slot >= 0:
                k_pool[page, row], v_pool[page, row] = k_cache[hk, slot], v_cache[hk, slot]
    lengths = np.array([len(listed) for listed in lists], np.int32)
    return k_pool, v_pool, block_table, lengths, entry_slot


def _run_attention(q, paged, slot_pos, q_pos, scale, **kwargs) -> np.ndarray:
    out = cuda.device_array(q.shape, F32)
    K.attention(_dev(q), *(_dev(a) for a in paged), _dev(slot_pos), _dev(q_pos), scale, out, **kwargs)
    return out.copy_to_host()


def _dense_masked(q, k_cache, v_cache, masks, slot_pos, q_pos, scale) -> np.ndarray:
    """float64 softmax over the slots each KV head's mask shows, by slot: the independent oracle."""
    group = q.shape[1] // k_cache.shape[0]
    keys = np.repeat(k_cache, group, axis=0).astype(np.float64)  # [Hq, S, D]
    values = np.repeat(v_cache, group, axis=0).astype(np.float64)
    scores = np.einsum("thd,hsd->ths", q.astype(np.float64), keys) * scale
    mask = (np.repeat(masks, group, axis=0)[None] != 0) & (slot_pos[None, None, :] <= q_pos[:, None, None])
    scores = np.where(mask, scores, -np.inf)
    peak = scores.max(-1, keepdims=True)
    weights = np.exp(scores - np.where(np.isfinite(peak), peak, 0))
    total = weights.sum(-1, keepdims=True)
    return np.einsum("ths,hsd->thd", weights / np.where(total > 0, total, 1), values)


@pytest.mark.parametrize("group", [1, 2, 3])
@pytest.mark.parametrize(
    "tokens, splits",
    [(1, 1), (1, 3), (1, None), (4, 1), (4, 2)],
    ids=["decode", "decode-split3", "decode-auto", "prefill", "prefill-split2"],
)
def test_attention_reads_every_head_through_its_block_table(group: int, tokens: int, splits: int | None) -> None:
    rng = _rng(15 + group)
    kv_heads, head_dim = 2, 8
    k_cache, v_cache, slot_pos, valid, q_pos = _arena(rng, kv_heads, head_dim, tokens)
    paged = _pages(rng, k_cache, v_cache, np.stack([valid, valid]), holes=3)  # the dense layout's holes
    q = _randn(rng, tokens, kv_heads * group, head_dim)
    scale = head_dim**-0.5
    got = _run_attention(q, paged, slot_pos, q_pos, scale, num_splits=splits)
    np.testing.assert_allclose(got, ref.attention(q, *paged, slot_pos, q_pos, scale), **TOL)
    dense = _dense_masked(q, k_cache, v_cache, np.stack([valid, valid]), slot_pos, q_pos, scale)
    np.testing.assert_allclose(got, dense, **TOL)


@pytest.mark.parametrize("tokens, splits, page_tokens", [(1, 1, 4), (3, 2, 5), (1, 4, 1)])
def test_attention_online_softmax_across_chunks_and_pages(tokens: int, splits: int, page_tokens: int) -> None:
    """More entries than one shared-memory chunk holds, on pages that do not line up with chunks."""
    rng = _rng(19)
    k_cache, v_cache, slot_pos, valid, q_pos = _arena(rng, 1, 8, tokens, capacity=75)
    paged = _pages(rng, k_cache, v_cache, valid[None], page_tokens=page_tokens)
    q = _randn(rng, tokens, 2, 8) * F32(3)
    got = _run_attention(q, paged, slot_pos, q_pos, 0.5, num_splits=splits)
    np.testing.assert_allclose(got, ref.attention(q, *paged, slot_pos, q_pos, 0.5), **TOL)


def test_attention_prefill_with_several_row_tiles_then_decode_reusing_scratch() -> None:
    rng = _rng(20)
    k_cache, v_cache, slot_pos, valid, q_pos = _arena(rng, 2, 8, 5)
    paged = _pages(rng, k_cache, v_cache, np.stack([valid, valid]))
    q = _randn(rng, 5, 8, 8)  # 5 tokens x 4 heads per group = 20 rows: two row tiles
    scratch = K.AttentionScratch()
    for tokens in (5, 1):  # the decode call reuses a prefix of the prefill's buffers
        got = _run_attention(q[-tokens:], paged, slot_pos, q_pos[-tokens:], 0.3, num_splits=2, scratch=scratch)
        np.testing.assert_allclose(got, ref.attention(q[-tokens:], *paged, slot_pos, q_pos[-tokens:], 0.3), **TOL)


@pytest.mark.parametrize("splits", [1, 3])
def test_attention_without_visible_entries_outputs_zeros(splits: int) -> None:
    rng = _rng(21)
    k_cache, v_cache, slot_pos, valid, _ = _arena(rng, 1, 8, 2)
    paged = _pages(rng, k_cache, v_cache, valid[None], holes=2)
    q = _randn(rng, 2, 2, 8)
    q_pos = np.array([-1, 3], np.int32)  # the first query precedes every token
    got = _run_attention(q, paged, slot_pos, q_pos, 0.5, num_splits=splits)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[0], 0.0)
    np.testing.assert_allclose(got, ref.attention(q, *paged, slot_pos, q_pos, 0.5), **TOL)


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize(
    "tokens, splits", [(1, 1), (1, 3), (4, 2)], ids=["decode", "decode-split3", "prefill-split2"]
)
def test_attention_each_kv_head_reads_only_the_tokens_it_holds(group: int, tokens: int, splits: int) -> None:
    rng = _rng(23 + group)
    k_cache, v_cache, slot_pos, valid, q_pos = _arena(rng, 2, 8, tokens)
    masks = _per_head_masks(valid, tokens)
    paged = _pages(rng, k_cache, v_cache, masks)
    assert paged[3][0] < paged[3][1]  # head 0 evicted more: it holds fewer entries
    q = _randn(rng, tokens, 2 * group, 8)
    got = _run_attention(q, paged, slot_pos, q_pos, 0.4, num_splits=splits)
    np.testing.assert_allclose(got, ref.attention(q, *paged, slot_pos, q_pos, 0.4), **TOL)
    np.testing.assert_allclose(got, _dense_masked(q, k_cache, v_cache, masks, slot_pos, q_pos, 0.4), **TOL)
    for hk in range(2):  # the masks really differ: the other head's tokens would give something else
        heads = slice(hk * group, (hk + 1) * group)
        other = _dense_masked(q, k_cache, v_cache, masks[[1 - hk, 1 - hk]], slot_pos, q_pos, 0.4)
        assert not np.allclose(got[:, heads], other[:, heads], **TOL)


def test_attention_a_kv_head_that_holds_nothing_outputs_zeros_alone() -> None:
    rng = _rng(24)
    k_cache, v_cache, slot_pos, valid, q_pos = _arena(rng, 2, 8, 1)
    masks = np.stack([np.zeros_like(valid), valid])
    paged = _pages(rng, k_cache, v_cache, masks)
    assert paged[3][0] == 0
    q = _randn(rng, 1, 4, 8)
    got = _run_attention(q, paged, slot_pos, q_pos, 0.5, num_splits=2)
    np.testing.assert_array_equal(got[:, :2], 0.0)
    np.testing.assert_allclose(got[:, 2:], _dense_masked(q, k_cache, v_cache, masks, slot_pos, q_pos, 0.5)[:, 2:],
                               **TOL)


def test_attention_twin_matches_dense_masked_softmax() -> None:
    rng = _rng(25)
    k_cache, v_cache, slot_pos, valid, q_pos = _arena(rng, 2, 8, 3)
    masks = _per_head_masks(valid, 3)
    paged = _pages(rng, k_cache, v_cache, masks, page_tokens=3, holes=2)
    q = _randn(rng, 3, 4, 8)
    twin = ref.attention(q, *paged, slot_pos, q_pos, 0.4)
    np.testing.assert_allclose(twin, _dense_masked(q, k_cache, v_cache, masks, slot_pos, q_pos, 0.4),
                               rtol=1e-5, atol=1e-6)


def _shapes(kv_heads: int = 2, q_heads: int = 2):
    pool = np.zeros((3, 4, 8), F32)
    return (np.zeros((1, q_heads, 8), F32), pool, pool, np.zeros((kv_heads, 2), np.int32),
            np.zeros(kv_heads, np.int32), np.zeros((3, 4), np.int32), np.zeros(5, np.int32), np.zeros(1, np.int32))


def test_attention_rejects_block_tables_that_do_not_fit_the_pool_or_the_lengths() -> None:
    q, k, v, table, lengths, entry_slot, slot_pos, q_pos = _shapes()
    out = cuda.device_array((1, 2, 8), F32)
    for bad, message in ((dict(lengths=np.zeros(3, np.int32)), "lengths"),
                         (dict(entry_slot=np.zeros((3, 5), np.int32)), "entry_slot"),
                         (dict(table=np.zeros((2, 2), np.int64)), "block_table")):
        args = {**dict(table=table, lengths=lengths, entry_slot=entry_slot), **bad}
        with pytest.raises(ValueError, match=message):
            K.attention(_dev(q), _dev(k), _dev(v), _dev(args["table"]), _dev(args["lengths"]),
                        _dev(args["entry_slot"]), _dev(slot_pos), _dev(q_pos), 1.0, out)


def test_attention_rejects_bad_grouping() -> None:
    q, *rest = _shapes(q_heads=3)
    with pytest.raises(ValueError, match="group"):
        K.attention(_dev(q), *(_dev(a) for a in rest[:6]), _dev(rest[6]), 1.0, cuda.device_array((1, 3, 8), F32))


# --- vision tower: LayerNorm, GELUs, multi-axis rotary, segment attention ---------------------


@pytest.mark.parametrize("hidden", [50, 300, 1100])  # 32, 64 and 128 threads per row
def test_layernorm_matches_twin_torch_and_float64(hidden: int) -> None:
    torch = pytest.importorskip("torch")
    rng = _rng(30)
    x = _randn(rng, 3, hidden) * F32(3) + F32(20)  # a large mean next to the spread
    weight, bias = _randn(rng, hidden), _randn(rng, hidden)
    out = cuda.device_array((3, hidden), F32)
    K.layernorm(_dev(x), _dev(weight), _dev(bias), 1e-6, out)
    expected = ref.layernorm(x, weight, bias, 1e-6)
    np.testing.assert_allclose(out.copy_to_host(), expected, **TOL)
    x64 = x.astype(np.float64)
    centred = x64 - x64.mean(-1, keepdims=True)
    exact = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-6) * weight + bias
    np.testing.assert_allclose(expected, exact, rtol=1e-5, atol=1e-5)
    torch_ln = torch.nn.functional.layer_norm(torch.from_numpy(x), (hidden,), torch.from_numpy(weight),
                                              torch.from_numpy(bias), 1e-6).numpy()
    np.testing.assert_allclose(expected, torch_ln, rtol=1e-5, atol=1e-5)


def test_layernorm_in_place_and_rejects_a_missing_bias_shape() -> None:
    rng = _rng(31)
    x, weight, bias = _randn(rng, 2, 21), _randn(rng, 21), _randn(rng, 21)
    dx = _dev(x)
    K.layernorm(dx, _dev(weight), _dev(bias), 1e-5, dx)
    np.testing.assert_allclose(dx.copy_to_host(), ref.layernorm(x, weight, bias, 1e-5), **TOL)
    with pytest.raises(ValueError, match="bias"):
        K.layernorm(dx, _dev(weight), _dev(bias[:20]), 1e-5, dx)


def test_gelu_and_quick_gelu_match_twins_and_torch() -> None:
    torch = pytest.importorskip("torch")
    x = _randn(_rng(32), 3, 37) * F32(4)
    xt = torch.from_numpy(x)
    for launch, twin, oracle in ((K.gelu, ref.gelu, torch.nn.functional.gelu(xt)),
                                 (K.quick_gelu, ref.quick_gelu, xt * torch.sigmoid(1.702 * xt))):
        out = cuda.device_array(x.shape, F32)
        launch(_dev(x), out)
        np.testing.assert_allclose(out.copy_to_host(), twin(x), **TOL)
        np.testing.assert_allclose(twin(x), oracle.numpy(), rtol=1e-5, atol=1e-6)
        dx = _dev(x)
        launch(dx, dx)  # in place
        np.testing.assert_allclose(dx.copy_to_host(), twin(x), **TOL)
    assert not np.allclose(ref.gelu(x), ref.quick_gelu(x), rtol=1e-3)  # really two different curves


def test_pair_axes() -> None:
    np.testing.assert_array_equal(K.pair_axes([2, 3, 1]), [0, 0, 1, 1, 1, 2])
    assert K.pair_axes([4, 4]).dtype == np.int32
    with pytest.raises(ValueError, match="sections"):
        K.pair_axes([2, -1])


def _vision_rotary_oracle(x: np.ndarray, rows: np.ndarray, cols: np.ndarray, theta: float) -> np.ndarray:
    """HF's own Qwen2-VL vision rotary: the axial frequencies and apply_rotary_pos_emb_vision."""
    torch = pytest.importorskip("torch")
    vl = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
    head_dim = x.shape[-1]
    config = vl.Qwen2VLVisionConfig(embed_dim=head_dim * 2, num_heads=2)
    config.rope_parameters = {"rope_type": "axial", "rope_theta": theta}
    rotary = vl.Qwen2VLVisionRotaryEmbedding(config)
    ids = torch.from_numpy(np.stack([rows, cols], axis=-1).astype(np.int64))  # [T, 2]
    cos, sin = rotary(torch.from_numpy(x), ids)
    xt = torch.from_numpy(x)
    return vl.apply_rotary_pos_emb_vision(xt, xt, cos, sin)[0].numpy()


def test_rope_axes_twin_matches_hf_vision_rotary_and_mrope() -> None:
    torch = pytest.importorskip("torch")
    vl = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
    rng = _rng(33)
    head_dim = 20
    x = _randn(rng, 7, 3, head_dim)
    rows, cols = rng.integers(0, 9, 7).astype(np.int32), rng.integers(0, 9, 7).astype(np.int32)
    vision_freq = ops.rope_inv_freq(head_dim // 2, 10000.0)  # D/4 frequencies, shared by rows and columns
    got = ref.rope_axes(x, np.stack([rows, cols]), K.pair_axes([head_dim // 4] * 2),
                        np.concatenate([vision_freq, vision_freq]))
    np.testing.assert_allclose(got, _vision_rotary_oracle(x, rows, cols, 10000.0), rtol=1e-6, atol=1e-6)

    section = [4, 3, 3]  # t, h, w pairs of head_dim 20
    config = vl.Qwen2VLTextConfig(hidden_size=head_dim * 3, num_attention_heads=3, num_key_value_heads=3,
                                  rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                                   "mrope_section": section})
    rotary = vl.Qwen2VLRotaryEmbedding(config)
    ids = rng.integers(-3, 50, (3, 7)).astype(np.int32)
    cos, sin = rotary(torch.from_numpy(x), torch.from_numpy(ids.astype(np.int64))[:, None, :])
    xt = torch.from_numpy(x).transpose(0, 1)[None]  # [1, heads, T, D]
    expected = vl.apply_rotary_pos_emb(xt, xt, cos, sin)[0][0].transpose(0, 1).numpy()
    inv_freq = ops.rope_inv_freq(head_dim, 1000.0)
    got = ref.rope_axes(x, ids, K.pair_axes(section), inv_freq)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    uniform = np.broadcast_to(ids[0], (3, 7))  # equal t/h/w ids: plain 1-D RoPE
    np.testing.assert_allclose(ref.rope_axes(x, uniform, K.pair_axes(section), inv_freq),
                               ref.rope(x, ids[0], inv_freq), rtol=1e-6, atol=1e-6)


def test_rope_axes_matches_twin_in_place_and_out_of_place() -> None:
    rng = _rng(34)
    x = _randn(rng, 5, 2, HEAD_DIM)
    ids = rng.integers(-4, 40, (3, 5)).astype(np.int32)
    pair_axis = K.pair_axes([2, 3, 3])
    expected = ref.rope_axes(x, ids, pair_axis, INV_FREQ)
    dx, out = _dev(x), cuda.device_array(x.shape, F32)
    K.rope_axes(dx, _dev(ids), _dev(pair_axis), _dev(INV_FREQ), out)
    np.testing.assert_allclose(out.copy_to_host(), expected, **TOL)
    np.testing.assert_array_equal(dx.copy_to_host(), x)
    K.rope_axes(dx, _dev(ids), _dev(pair_axis), _dev(INV_FREQ))
    np.testing.assert_allclose(dx.copy_to_host(), expected, **TOL)
    with pytest.raises(ValueError, match="pair_axis"):
        K.rope_axes(dx, _dev(ids), _dev(pair_axis[:-1]), _dev(INV_FREQ))


def test_mrope_keys_move_by_a_uniform_shift_with_the_cache_shift() -> None:
    """Shifting the t/h/w ids of a key by the same delta is what rope_cache_shift does to it."""
    rng = _rng(35)
    raw = _randn(rng, 6, 2, HEAD_DIM)
    ids = rng.integers(0, 30, (3, 6)).astype(np.int32)
    pair_axis = K.pair_axes([2, 3, 3])
    deltas = np.array([-5, 3, 0, 7, -1, 2], np.int32)
    cache = ref.rope_axes(raw, ids, pair_axis, INV_FREQ).transpose(1, 0, 2).copy()  # [Hkv, S, D]
    dcache = _dev(cache)
    K.rope_cache_shift(dcache, _dev(np.arange(6, dtype=np.int32)), _dev(deltas), _dev(INV_FREQ))
    moved = ref.rope_axes(raw, ids + deltas[None, :], pair_axis, INV_FREQ).transpose(1, 0, 2)
    np.testing.assert_allclose(dcache.copy_to_host(), moved, rtol=1e-5, atol=2e-5)


def _dense_segments(q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_seqlens: np.ndarray, scale: float) -> np.ndarray:
    """float64 softmax under a dense [T, T] same-segment mask: the independent oracle."""
    tokens = q.shape[0]
    segment = np.full(tokens, -1)
    for s, (start, end) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])):
        segment[start:end] = s
    mask = (segment[:, None] == segment[None, :]) & (segment[:, None] >= 0)
    scores = np.einsum("thd,shd->hts", q.astype(np.float64), k.astype(np.float64)) * scale
    scores = np.where(mask[None], scores, -np.inf)
    peak = scores.max(-1, keepdims=True)
    weights = np.exp(scores - np.where(np.isfinite(peak), peak, 0))
    total = weights.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", weights / np.where(total > 0, total, 1), v.astype(np.float64))


@pytest.mark.parametrize(
    "cu_seqlens, heads, head_dim",
    [([0, 5, 5, 41, 45], 2, 10), ([0, 20], 1, 80), ([0, 3, 9, 16, 17], 1, 6)],
    ids=["empty-and-long-segments", "head_dim80", "segments-inside-one-tile"],
)
def test_segment_attention_matches_twin_and_dense_mask(cu_seqlens: list[int], heads: int, head_dim: int) -> None:
    rng = _rng(36)
    tokens = cu_seqlens[-1]
    cu = np.array(cu_seqlens, np.int32)
    q, k, v = (_randn(rng, tokens, heads, head_dim) * F32(2) for _ in range(3))
    scale = head_dim**-0.5
    out = cuda.device_array(q.shape, F32)
    K.segment_attention(_dev(q), _dev(k), _dev(v), _dev(cu), scale, out)
    got = out.copy_to_host()
    np.testing.assert_allclose(got, ref.segment_attention(q, k, v, cu, scale), **TOL)
    np.testing.assert_allclose(got, _dense_segments(q, k, v, cu, scale), **TOL)


def test_segment_attention_leaves_uncovered_tokens_zero_and_checks_shapes() -> None:
    rng = _rng(37)
    q, k, v = (_randn(rng, 9, 1, 4) for _ in range(3))
    cu = np.array([2, 6], np.int32)  # tokens 0, 1 and 6..8 lie in no segment
    out = cuda.device_array(q.shape, F32)
    K.segment_attention(_dev(q), _dev(k), _dev(v), _dev(cu), 0.5, out)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got[[0, 1, 6, 7, 8]], 0.0)
    np.testing.assert_allclose(got, ref.segment_attention(q, k, v, cu, 0.5), **TOL)
    np.testing.assert_allclose(got, _dense_segments(q, k, v, cu, 0.5), **TOL)
    with pytest.raises(ValueError, match="cu_seqlens"):
        K.segment_attention(_dev(q), _dev(k), _dev(v), _dev(np.array([9], np.int32)), 0.5, out)
    with pytest.raises(ValueError, match="k has"):
        K.segment_attention(_dev(q), _dev(k[:8]), _dev(v), _dev(cu), 0.5, out)


# --- argmax ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "logits",
    [
        np.array([0.5, -1.0, 2.0, 2.0, 1.0], F32),
        np.zeros(7, F32),
        np.full(4, -np.inf, F32),
        np.where(np.arange(300) % 97 == 5, F32(3.0), np.linspace(-1, 1, 300, dtype=F32)),
        np.where(np.isin(np.arange(300), [150, 290]), F32(3.0), np.zeros(300, F32)),
    ],
    ids=["tie", "all-equal", "all-neg-inf", "tie-across-blocks", "tie-in-later-blocks"],
)
def test_argmax_rows(logits: np.ndarray) -> None:
    assert K.argmax_rows(_dev(logits)) == ref.argmax(logits)


@pytest.mark.parametrize("bad, where", [(np.nan, 0), (np.nan, 299), (np.inf, 150), (-np.inf, 5)])
def test_argmax_rows_refuses_a_non_finite_logit(bad: float, where: int) -> None:
    """One NaN or Inf anywhere (first, in the first block, in a later block, last) gives no token, on the
    kernel and its twin; NaN logits once gave the first bin, a confident command."""
    logits = np.linspace(-1, 1, 300, dtype=F32)
    logits[where] = bad
    assert ref.argmax(logits) == K.NO_TOKEN
    assert K.argmax_rows(_dev(logits)) == K.NO_TOKEN


def test_kernel_version_is_a_nonempty_string() -> None:
    assert isinstance(K.KERNEL_VERSION, str) and K.KERNEL_VERSION
