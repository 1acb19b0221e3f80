"""The two pieces of policy math with GPU kernels, behind one interface per backend.

``numpy`` runs the NumPy twins in ``kernels/reference.py``; ``cuda`` keeps the signature matrix and
the fast weights resident on the device and runs the Numba kernels, so a policy on the GPU backend
moves one signature (or one k, v pair) per frame, not its whole state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class SignatureIndex(ABC):
    """A fixed number of signature rows; ``put`` stores one and returns its cosine to every row."""

    @abstractmethod
    def put(self, row: int, signature: np.ndarray) -> np.ndarray:
        """Store ``signature`` in ``row``; cosine similarity of it to every row (rows never set: 0)."""

    @abstractmethod
    def rows(self, rows: np.ndarray) -> np.ndarray:
        """Host copy [len(rows), dim] of the given rows."""


class FastWeights(ABC):
    """A delta-rule associative memory W [d_v, d_k] plus bias b [d_v], read as r = W q + b."""

    def __init__(self, d_k: int, d_v: int) -> None:
        self.d_k, self.d_v = d_k, d_v

    @abstractmethod
    def step(self, k: np.ndarray, v: np.ndarray, beta: float, threshold: float, force: bool) -> tuple[float, bool]:
        """Offer (k, v): surprise = ||v - (W k + b)||; write one delta step if surprise > threshold or force."""

    @abstractmethod
    def read(self, q: np.ndarray) -> np.ndarray:
        """r = W q + b."""

    @abstractmethod
    def get(self) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of (W, b)."""

    @abstractmethod
    def set(self, weights: np.ndarray, bias: np.ndarray) -> None:
        """Replace the state (a new episode, or a restored snapshot)."""


class MemoryMath(ABC):
    """Factory of the backend's signature index and fast weights."""

    @staticmethod
    def for_device(device: str) -> MemoryMath:
        return CudaMemoryMath() if device == "cuda" else NumpyMemoryMath()

    @abstractmethod
    def signature_index(self, rows: int, dim: int) -> SignatureIndex: ...

    @abstractmethod
    def fast_weights(self, d_k: int, d_v: int) -> FastWeights: ...


class _NumpySignatures(SignatureIndex):
    def __init__(self, rows: int, dim: int) -> None:
        self.matrix = np.zeros((rows, dim), dtype=np.float32)

    def put(self, row: int, signature: np.ndarray) -> np.ndarray:
        from ..kernels import reference

        self.matrix[row] = signature
        return reference.cosine_similarities(self.matrix, self.matrix[row])

    def rows(self, rows: np.ndarray) -> np.ndarray:
        return self.matrix[rows].copy()


class _NumpyFastWeights(FastWeights):
    def __init__(self, d_k: int, d_v: int) -> None:
        super().__init__(d_k, d_v)
        self.weights = np.zeros((d_v, d_k), dtype=np.float32)
        self.bias = np.zeros(d_v, dtype=np.float32)

    def step(self, k: np.ndarray, v: np.ndarray, beta: float, threshold: float, force: bool) -> tuple[float, bool]:
        from ..kernels import reference

        self.weights, self.bias, surprise, written = reference.fast_weight_step(
            self.weights, self.bias, k, v, beta, threshold, force)
        return float(surprise), bool(written)

    def read(self, q: np.ndarray) -> np.ndarray:
        from ..kernels import reference

        return reference.fast_weight_read(self.weights, self.bias, q)

    def get(self) -> tuple[np.ndarray, np.ndarray]:
        return self.weights.copy(), self.bias.copy()

    def set(self, weights: np.ndarray, bias: np.ndarray) -> None:
        self.weights = np.array(weights, dtype=np.float32).reshape(self.d_v, self.d_k)
        self.bias = np.array(bias, dtype=np.float32).reshape(self.d_v)


class NumpyMemoryMath(MemoryMath):
    def signature_index(self, rows: int, dim: int) -> SignatureIndex:
        return _NumpySignatures(rows, dim)

    def fast_weights(self, d_k: int, d_v: int) -> FastWeights:
        return _NumpyFastWeights(d_k, d_v)


class _CudaSignatures(SignatureIndex):
    def __init__(self, rows: int, dim: int) -> None:
        from numba import cuda

        self.matrix = cuda.to_device(np.zeros((rows, dim), dtype=np.float32))
        self.out = cuda.device_array(rows, dtype=np.float32)

    def put(self, row: int, signature: np.ndarray) -> np.ndarray:
        from .. import kernels

        self.matrix[row].copy_to_device(np.ascontiguousarray(signature, dtype=np.float32))
        kernels.cosine_similarities(self.matrix, self.matrix.shape[0], self.matrix[row], self.out)
        return self.out.copy_to_host()

    def rows(self, rows: np.ndarray) -> np.ndarray:
        return self.matrix.copy_to_host()[rows]


class _CudaFastWeights(FastWeights):
    def __init__(self, d_k: int, d_v: int) -> None:
        from numba import cuda

        super().__init__(d_k, d_v)
        self.weights = cuda.to_device(np.zeros((d_v, d_k), dtype=np.float32))
        self.bias = cuda.to_device(np.zeros(d_v, dtype=np.float32))
        self.result = cuda.device_array(2, dtype=np.float32)
        self.out = cuda.device_array(d_v, dtype=np.float32)

    def step(self, k: np.ndarray, v: np.ndarray, beta: float, threshold: float, force: bool) -> tuple[float, bool]:
        from numba import cuda

        from .. import kernels

        kernels.fast_weight_step(self.weights, self.bias, cuda.to_device(np.ascontiguousarray(k, dtype=np.float32)),
                                 cuda.to_device(np.ascontiguousarray(v, dtype=np.float32)), beta, threshold,
                                 force, self.result)
        surprise, written = self.result.copy_to_host()
        return float(surprise), bool(written)

    def read(self, q: np.ndarray) -> np.ndarray:
        from numba import cuda

        from .. import kernels

        kernels.fast_weight_read(self.weights, self.bias, cuda.to_device(np.ascontiguousarray(q, dtype=np.float32)),
                                 self.out)
        return self.out.copy_to_host()

    def get(self) -> tuple[np.ndarray, np.ndarray]:
        return self.weights.copy_to_host(), self.bias.copy_to_host()

    def set(self, weights: np.ndarray, bias: np.ndarray) -> None:
        self.weights.copy_to_device(np.ascontiguousarray(weights, dtype=np.float32).reshape(self.d_v, self.d_k))
        self.bias.copy_to_device(np.ascontiguousarray(bias, dtype=np.float32).reshape(self.d_v))


class CudaMemoryMath(MemoryMath):
    def signature_index(self, rows: int, dim: int) -> SignatureIndex:
        return _CudaSignatures(rows, dim)

    def fast_weights(self, d_k: int, d_v: int) -> FastWeights:
        return _CudaFastWeights(d_k, d_v)
