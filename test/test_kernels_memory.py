"""The KV memory policy kernels (signature cosine, fast-weight memory) against their NumPy twins
and against hand-computed values, under Numba's CUDA simulator on tiny shapes."""

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

F32 = np.float32
TOL = {"rtol": 1e-5, "atol": 1e-5}
SENTINEL = F32(-7.0)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _dev(array: np.ndarray):
    return cuda.to_device(np.ascontiguousarray(array))


def _randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(F32)


# --- cosine similarities ---------------------------------------------------------------------


def _cosine(signatures: np.ndarray, count: int, query: np.ndarray) -> np.ndarray:
    out = _dev(np.full(signatures.shape[0], SENTINEL))
    K.cosine_similarities(_dev(signatures), count, _dev(query), out)
    return out.copy_to_host()


@pytest.mark.parametrize(
    "capacity, count, width",
    [(6, 4, 50), (3, 3, 300), (5, 5, 128), (4, 0, 10)],
    ids=["partial", "wider-than-block", "exact-block", "empty"],
)
def test_cosine_similarities_match_twin_and_leave_dead_rows(
    capacity: int, count: int, width: int
) -> None:
    rng = _rng(1)
    signatures, query = _randn(rng, capacity, width), _randn(rng, width)
    if count > 1:
        signatures[1] = 0.0  # a zero row scores 0, not NaN
    got = _cosine(signatures, count, query)
    expected = ref.cosine_similarities(signatures[:count], query)
    np.testing.assert_allclose(got[:count], expected, **TOL)
    np.testing.assert_array_equal(got[count:], SENTINEL)
    if count > 1:
        assert got[1] == 0.0
    s64, q64 = signatures[:count].astype(np.float64), query.astype(np.float64)
    norms = np.linalg.norm(s64, axis=1) * np.linalg.norm(q64)
    exact = np.divide(s64 @ q64, norms, out=np.zeros(count), where=norms > 0)
    np.testing.assert_allclose(expected, exact, rtol=1e-5, atol=1e-6)


def test_cosine_similarities_hand_computed_and_zero_query() -> None:
    signatures = np.array([[1, 0], [1, 1], [0, 0], [-2, 0], [0, 5]], F32)
    got = _cosine(signatures, 5, np.array([3, 0], F32))
    np.testing.assert_allclose(got, [1.0, 0.5**0.5, 0.0, -1.0, 0.0], **TOL)
    np.testing.assert_array_equal(_cosine(signatures, 5, np.zeros(2, F32)), np.zeros(5, F32))
    np.testing.assert_array_equal(
        ref.cosine_similarities(signatures, np.zeros(2, F32)), np.zeros(5, F32)
    )


def test_cosine_similarities_reject_bad_arguments() -> None:
    signatures, query = _dev(np.zeros((4, 8), F32)), _dev(np.zeros(8, F32))
    out = _dev(np.zeros(4, F32))
    with pytest.raises(ValueError, match="count"):
        K.cosine_similarities(signatures, 5, query, out)
    with pytest.raises(ValueError, match="count"):
        K.cosine_similarities(signatures, -1, query, out)
    with pytest.raises(ValueError, match="query"):
        K.cosine_similarities(signatures, 2, _dev(np.zeros(7, F32)), out)
    with pytest.raises(ValueError, match="out"):
        K.cosine_similarities(signatures, 2, query, _dev(np.zeros(3, F32)))
    with pytest.raises(ValueError, match="dtype"):
        K.cosine_similarities(_dev(np.zeros((4, 8))), 2, query, out)


# --- fast-weight memory ----------------------------------------------------------------------


class _Memory:
    """A device-resident fast-weight state with a step that returns what the kernel reported."""

    def __init__(self, w: np.ndarray, b: np.ndarray) -> None:
        self.w, self.b = _dev(w), _dev(b)
        self.result = _dev(np.zeros(2, F32))

    def step(
        self, k: np.ndarray, v: np.ndarray, beta: float, threshold: float, force: bool = False
    ) -> tuple[float, bool]:
        K.fast_weight_step(self.w, self.b, _dev(k), _dev(v), beta, threshold, force, self.result)
        surprise, flag = self.result.copy_to_host()
        assert flag in (0.0, 1.0)
        return float(surprise), bool(flag)

    def read(self, q: np.ndarray) -> np.ndarray:
        out = cuda.device_array(self.b.shape[0], F32)
        K.fast_weight_read(self.w, self.b, _dev(q), out)
        return out.copy_to_host()

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        return self.w.copy_to_host(), self.b.copy_to_host()


@pytest.mark.parametrize(
    "d_v, d_k", [(5, 7), (33, 20), (1, 3)], ids=["small", "64-threads", "1-thread"]
)
def test_fast_weight_steps_and_reads_match_twin(d_v: int, d_k: int) -> None:
    rng = _rng(2)
    w, b = _randn(rng, d_v, d_k) * F32(0.3), _randn(rng, d_v)
    memory = _Memory(w, b)
    # Forced, always (threshold 0), never (threshold inf), forced despite an infinite threshold.
    for threshold, force in ((1.0, True), (0.0, False), (np.inf, False), (np.inf, True)):
        k, v = _randn(rng, d_k), _randn(rng, d_v)
        w, b, surprise, written = ref.fast_weight_step(w, b, k, v, 0.25, threshold, force)
        got_surprise, got_written = memory.step(k, v, 0.25, threshold, force)
        assert got_written == written == (force or threshold == 0.0)
        np.testing.assert_allclose(got_surprise, surprise, **TOL)
        got_w, got_b = memory.state()
        np.testing.assert_allclose(got_w, w, **TOL)
        np.testing.assert_allclose(got_b, b, **TOL)
    q = _randn(rng, d_k)
    np.testing.assert_allclose(memory.read(q), ref.fast_weight_read(w, b, q), **TOL)


def test_fast_weight_read_on_a_wide_matrix() -> None:
    rng = _rng(3)
    w, b, q = _randn(rng, 3, 300), _randn(rng, 3), _randn(rng, 300)
    got = _Memory(w, b).read(q)
    np.testing.assert_allclose(got, ref.fast_weight_read(w, b, q), **TOL)
    np.testing.assert_allclose(got, w.astype(np.float64) @ q + b, rtol=1e-5, atol=1e-5)


# Two writes from zeros with beta = 1/2, all values exact in fp32:
#   k1 = [1, 2, 0], v1 = [2, -4]: err = v1, surprise = sqrt(20),
#     W1 = beta v1 k1^T = [[1, 2, 0], [-2, -4, 0]], b1 = beta v1 = [1, -2]
#   k2 = [0, 1, 1], v2 = [3, 1]: pred = W1 k2 + b1 = [3, -6], err = [0, 7], surprise = 7,
#     W2 = W1 + beta err k2^T = [[1, 2, 0], [-2, -0.5, 3.5]], b2 = b1 + beta err = [1, 1.5]
#   k2, v2 again: pred = [3, 4.5], err = [0, -3.5], surprise = 3.5; if written,
#     W3 = [[1, 2, 0], [-2, -2.25, 1.75]], b3 = [1, -0.25]
K1, V1 = np.array([1, 2, 0], F32), np.array([2, -4], F32)
K2, V2 = np.array([0, 1, 1], F32), np.array([3, 1], F32)
W2 = np.array([[1, 2, 0], [-2, -0.5, 3.5]], F32)
B2 = np.array([1, 1.5], F32)


def _memory_after_two_writes() -> _Memory:
    memory = _Memory(np.zeros((2, 3), F32), np.zeros(2, F32))
    surprise, written = memory.step(K1, V1, 0.5, 0.0)
    assert written and surprise == pytest.approx(20**0.5, rel=1e-6)
    w1, b1 = memory.state()
    np.testing.assert_array_equal(w1, [[1, 2, 0], [-2, -4, 0]])
    np.testing.assert_array_equal(b1, [1, -2])
    assert memory.step(K2, V2, 0.5, 6.9) == (7.0, True)
    return memory


def test_fast_weight_two_writes_by_hand() -> None:
    memory = _memory_after_two_writes()
    w2, b2 = memory.state()
    np.testing.assert_array_equal(w2, W2)
    np.testing.assert_array_equal(b2, B2)
    np.testing.assert_array_equal(memory.read(K2), [3, 4.5])
    w, b = np.zeros((2, 3), F32), np.zeros(2, F32)
    for k, v in ((K1, V1), (K2, V2)):
        w, b, _, written = ref.fast_weight_step(w, b, k, v, 0.5, 0.0, False)
        assert written
    np.testing.assert_array_equal(w, W2)
    np.testing.assert_array_equal(b, B2)


def test_fast_weight_no_write_at_threshold_then_forced_write() -> None:
    memory = _memory_after_two_writes()
    assert memory.step(K2, V2, 0.5, 3.5) == (3.5, False)  # surprise == threshold: no write
    w, b = memory.state()
    np.testing.assert_array_equal(w.view(np.uint32), W2.view(np.uint32))
    np.testing.assert_array_equal(b.view(np.uint32), B2.view(np.uint32))
    assert ref.fast_weight_step(W2, B2, K2, V2, 0.5, 3.5, False)[2:] == (3.5, False)
    assert memory.step(K2, V2, 0.5, 3.5, force=True) == (3.5, True)
    w3, b3 = memory.state()
    np.testing.assert_array_equal(w3, [[1, 2, 0], [-2, -2.25, 1.75]])
    np.testing.assert_array_equal(b3, [1, -0.25])


def test_fast_weight_rejects_bad_arguments() -> None:
    w, b = _dev(np.zeros((4, 6), F32)), _dev(np.zeros(4, F32))
    k, v, result = _dev(np.zeros(6, F32)), _dev(np.zeros(4, F32)), _dev(np.zeros(2, F32))
    with pytest.raises(ValueError, match="k"):
        K.fast_weight_step(w, b, _dev(np.zeros(5, F32)), v, 0.5, 0.0, False, result)
    with pytest.raises(ValueError, match="v"):
        K.fast_weight_step(w, b, k, _dev(np.zeros(6, F32)), 0.5, 0.0, False, result)
    with pytest.raises(ValueError, match="result"):
        K.fast_weight_step(w, b, k, v, 0.5, 0.0, False, _dev(np.zeros(1, F32)))
    with pytest.raises(ValueError, match="dtype"):
        K.fast_weight_step(w, _dev(np.zeros(4)), k, v, 0.5, 0.0, False, result)
    with pytest.raises(ValueError, match="at most"):
        big = cuda.device_array((1025, 6), F32)
        K.fast_weight_step(big, cuda.device_array(1025, F32), k, v, 0.5, 0.0, False, result)
    with pytest.raises(ValueError, match="at most"):
        wide = cuda.device_array((4, 1025), F32)
        K.fast_weight_step(wide, b, cuda.device_array(1025, F32), v, 0.5, 0.0, False, result)
    with pytest.raises(ValueError, match="q"):
        K.fast_weight_read(w, b, _dev(np.zeros(4, F32)), cuda.device_array(4, F32))
    with pytest.raises(ValueError, match="out"):
        K.fast_weight_read(w, b, k, cuda.device_array(6, F32))
