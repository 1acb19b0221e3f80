"""Checkpoint matrices onto the device in each ``reasoning.weights`` format, and the CUDA decoder over them.

The decoder runs under Numba's CUDA simulator on a one-layer model with tied embeddings (so the int table
serves both the embedding gather and lm_head) whose widths are not multiples of the int4 group; it must match the same backend over fp32 copies of the
dequantized matrices (``weight_formats.dequantize``, the twin of every kernel over the packed layouts).
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from dataclasses import replace  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("numba.cuda", reason="numba-cuda is not installed")
pytest.importorskip("torch")  # writes the tiny model
pytest.importorskip("transformers")

from hf_models import VARIANTS, write_hf_model  # noqa: E402
from vla_edge_ros import kernels  # noqa: E402
from vla_edge_ros.model.arena import KVArena  # noqa: E402
from vla_edge_ros.model.checkpoint import load_checkpoint  # noqa: E402
from vla_edge_ros.model.cuda_backend import CudaBackend  # noqa: E402
from vla_edge_ros.model.cuda_weights import device_matrix  # noqa: E402
from vla_edge_ros.model.safetensors_io import StoredTensor  # noqa: E402
from vla_edge_ros.numerics.bf16 import bf16_bits  # noqa: E402
from vla_edge_ros.numerics.weight_formats import FORMATS, dequantize, pack  # noqa: E402


def _bf16(rng: np.random.Generator, *shape: int) -> StoredTensor:
    return StoredTensor("BF16", bf16_bits(rng.standard_normal(shape).astype(np.float32)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_device_matrix_uploads_the_packed_fusion_in_each_format(fmt: str) -> None:
    rng = np.random.default_rng(0)
    gate, up = _bf16(rng, 5, 70), _bf16(rng, 3, 70)
    weight = device_matrix(gate, up, fmt=fmt, group=32)
    want = pack(np.concatenate([gate.to_float32(), up.to_float32()]), fmt, 32)
    assert weight.shape == (8, 70) and weight.nbytes == want.nbytes
    np.testing.assert_array_equal(weight.data.copy_to_host(), want.data)
    if want.scales is None:
        assert weight.scales is None
    else:
        np.testing.assert_array_equal(weight.scales.copy_to_host(), want.scales)


def test_device_matrix_auto_keeps_a_shared_storage_dtype_else_widens() -> None:
    rng = np.random.default_rng(1)
    bf16, fp16 = _bf16(rng, 4, 6), StoredTensor("F16", rng.standard_normal((2, 6)).astype(np.float16))
    kept = device_matrix(bf16, bf16)
    assert kept.kind is kernels.WeightKind.BF16 and kept.shape == (8, 6)
    np.testing.assert_array_equal(kept.data.copy_to_host(), np.concatenate([bf16.array, bf16.array]))
    mixed = device_matrix(bf16, fp16)
    assert mixed.kind is kernels.WeightKind.FP32
    np.testing.assert_array_equal(mixed.data.copy_to_host(), np.concatenate([bf16.to_float32(), fp16.to_float32()]))


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory: pytest.TempPathFactory):
    """hidden 20, MLP 36, vocab 44, tied: every matrix's in-width leaves a partial int4 group of 32."""
    assert VARIANTS["head_dim_differs"]["tie_word_embeddings"]
    return write_hf_model(tmp_path_factory.mktemp("tied"), "head_dim_differs")


# ~25-50 s each on the simulator, so both run in `make test-slow`; the default suite proves each kernel over
# these layouts against its twin (test_kernels.py) and the uploads' bytes (test_budget.py).
@pytest.mark.slow
@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_cuda_backend_over_packed_weights_matches_it_over_their_dequantized_values(one_layer, weights: str) -> None:
    """Prefill 3 tokens then decode 1 (the GEMM and the GEMV), the tied int table gathered and projected."""
    packed = load_checkpoint(one_layer, require_vla=False, weights=weights, weights_group=32)
    dequantized = replace(packed, weights="auto", tensors={
        name: StoredTensor("F32", dequantize(pack(t.to_float32(), packed.format_of(name), 32)))
        if packed.is_matrix(name) else t for name, t in packed.tensors.items()})
    backends = [CudaBackend(checkpoint, KVArena(8)) for checkpoint in (packed, dequantized)]
    assert backends[0].layers[0].down_weight.kind is kernels.WeightKind(weights)
    assert backends[0].lm_head.kind is kernels.WeightKind.INT8  # int4 keeps the token tables in int8
    assert backends[0].lm_head is backends[0].embed
    results = []
    for backend in backends:
        prefill = backend.forward(np.arange(3), np.arange(3), token_ids=np.array([5, 40, 17])).hidden
        decode = backend.forward(np.array([3]), np.array([3]), token_ids=np.array([42])).hidden
        results.append((prefill, decode, backend.logits(decode[-1])))
    for ours, reference in zip(*results):
        np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-4)
