"""The CUDA side of Qwen2-VL / Qwen2.5-VL under Numba's simulator: the vision tower against the NumPy tower and
transformers, and the decoder's M-RoPE against the NumPy backend and transformers.

The simulator runs every GPU thread as a Python thread, so the parity checks, small as they are (a few patches:
one window layout that really reorders, two frames of different sizes), run in the slow tier (``make
test-slow``), as the text-only cuda parity does; the default tier keeps the checks that launch no kernel.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("numba.cuda", reason="numba-cuda is not installed")

from hf_vl_models import load_hf_vl_model, write_hf_vl_model  # noqa: E402
from vla_edge_ros.model.arena import KVArena  # noqa: E402
from vla_edge_ros.model.backends import cuda_simulated, make_backend  # noqa: E402
from vla_edge_ros.model.checkpoint import CheckpointError, load_checkpoint  # noqa: E402
from vla_edge_ros.model.vl.cuda_vision import CudaVisionTower  # noqa: E402
from vla_edge_ros.model.vl.positions import rope_index  # noqa: E402
from vla_edge_ros.model.vl.tower import make_vision_tower  # noqa: E402
from vla_edge_ros.model.vl.vision import VisionTower  # noqa: E402
from vla_edge_ros.model.vl.vision_layout import VisionInputError, vision_layout  # noqa: E402
from vla_edge_ros.tools.parity import Agreement, run_parity  # noqa: E402

TINY = {"qwen2_vl": "qwen2_vl_tiny", "qwen2_5_vl": "qwen2_5_vl_tiny"}
# qwen2_vl: two frames of different sizes (two attention segments); qwen2_5_vl: 2 x 3 merged tokens, i.e. a
# 2 x 2 window and a partial 2 x 1 one, so the window order is not the image order.
GRIDS = {"qwen2_vl": [[1, 2, 2], [1, 2, 4]], "qwen2_5_vl": [[1, 4, 6]]}
CUDA_MIN_COSINE = 0.999


@pytest.fixture(scope="module")
def vl_dirs(tmp_path_factory: pytest.TempPathFactory):
    """Each tiny variant written once, on first use."""
    written = {}

    def get(family: str):
        if family not in written:
            written[family] = write_hf_vl_model(tmp_path_factory.mktemp(family), TINY[family], seed=2)
        return written[family]
    return get


def _patches(grid: list[list[int]], patch_dim: int, seed: int = 0) -> np.ndarray:
    count = int(np.prod(grid, axis=1).sum())
    return np.random.default_rng(seed).standard_normal((count, patch_dim)).astype(np.float32)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _hf_tower(model_dir, patches: np.ndarray, grid: list[list[int]]) -> np.ndarray:
    with torch.no_grad():
        return load_hf_vl_model(model_dir).model.visual(torch.from_numpy(patches),
                                                        grid_thw=torch.tensor(grid)).pooler_output.numpy()


# -- the vision tower ---------------------------------------------------------------------------------------


# ~20 s a family simulated (40 s on a loaded machine), so both run in the slow tier: the default suite keeps
# to its 10 minutes, and keeps the tower's checks that need no kernel run (storage precision, bad input).
@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_cuda_tower_matches_the_numpy_tower_and_transformers(vl_dirs, family):
    model_dir = vl_dirs(family)
    checkpoint = load_checkpoint(model_dir)
    grid = GRIDS[family]
    tower = make_vision_tower("cuda", checkpoint)
    assert isinstance(tower, CudaVisionTower)
    patches = _patches(grid, tower.config.patch_dim)
    order = vision_layout(tower.config, np.array(grid)).order
    assert order is None if family == "qwen2_vl" else (order != np.arange(order.size)).any()
    out = tower.encode(patches, np.array(grid))
    numpy_out = VisionTower.from_checkpoint(checkpoint).encode(patches, np.array(grid))
    assert out.dtype == np.float32 and out.shape == numpy_out.shape
    np.testing.assert_allclose(out, numpy_out, rtol=0, atol=1e-5 * np.abs(numpy_out).max())
    reference = _hf_tower(model_dir, patches, grid)
    assert _cosine(out, reference) >= 0.99999
    np.testing.assert_allclose(out, reference, rtol=0, atol=2e-5 * np.abs(reference).max())
    if family == "qwen2_vl":  # a smaller batch then runs on views of the same buffers
        one_token = patches[:tower.config.merge_unit]
        again = tower.encode(one_token, np.array([[1, 2, 2]]))
        expected = VisionTower.from_checkpoint(checkpoint).encode(one_token, np.array([[1, 2, 2]]))
        np.testing.assert_allclose(again, expected, rtol=0, atol=1e-5 * np.abs(again).max())


@pytest.mark.slow  # about a minute simulated: the merger's 640-wide GEMMs
def test_cuda_tower_at_the_real_head_dim_of_80(tmp_path):
    """Qwen2-VL-2B's ViT head_dim (80: rotary quarters of 20, attention tiles that are no power of two)."""
    model_dir = write_hf_vl_model(tmp_path / "head80", "qwen2_vl_head80")
    checkpoint = load_checkpoint(model_dir)
    tower = CudaVisionTower.from_checkpoint(checkpoint)
    assert tower.config.head_dim == 80
    grid = [[1, 2, 4]]
    patches = _patches(grid, tower.config.patch_dim, seed=5)
    out = tower.encode(patches, np.array(grid))
    numpy_out = VisionTower.from_checkpoint(checkpoint).encode(patches, np.array(grid))
    np.testing.assert_allclose(out, numpy_out, rtol=0, atol=1e-5 * np.abs(numpy_out).max())
    assert _cosine(out, _hf_tower(model_dir, patches, grid)) >= 0.99999


def test_cuda_tower_holds_the_weights_in_storage_precision_and_refuses_bad_input(vl_dirs, tiny_model):
    checkpoint = load_checkpoint(vl_dirs("qwen2_5_vl"))  # stored as bf16
    assert isinstance(make_vision_tower("numpy", checkpoint), VisionTower)
    tower = CudaVisionTower.from_checkpoint(checkpoint)
    stored = sum(t.array.nbytes for n, t in checkpoint.tensors.items() if n.startswith("visual.") and t.array.ndim > 1)
    vectors = sum(4 * t.array.size for n, t in checkpoint.tensors.items()
                  if n.startswith("visual.") and t.array.ndim == 1)
    assert tower.state_bytes() == stored + vectors  # matrices as bf16 bits, norms and biases widened to fp32
    with pytest.raises(VisionInputError, match="patches must be"):
        tower.encode(np.zeros((3, tower.config.patch_dim), np.float32), np.array([[1, 2, 2]]))
    with pytest.raises(VisionInputError, match="multiples of the spatial merge size"):
        tower.encode(np.zeros((6, tower.config.patch_dim), np.float32), np.array([[1, 2, 3]]))
    with pytest.raises(CheckpointError, match="no vision tower"):
        CudaVisionTower.from_checkpoint(load_checkpoint(tiny_model))


# -- the decoder's M-RoPE -----------------------------------------------------------------------------------


def _image_prompt(checkpoint) -> tuple[np.ndarray, np.ndarray]:
    """Text, one 1x2x4-patch image (2 tokens whose height and width ids differ), text: ids and M-RoPE ids."""
    vl = checkpoint.config.vl
    ids = np.array([7, vl.vision_start_token_id, vl.image_token_id, vl.image_token_id, vl.vision_end_token_id, 9])
    rope = rope_index(ids, np.array([[1, 2, 4]]), image_token_id=vl.image_token_id,
                      spatial_merge_size=vl.vision.spatial_merge_size)
    assert (rope[1] != rope[2]).any()
    return ids, rope


@pytest.mark.slow  # ~25 s a family simulated; the default tier keeps the tower's parity
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_cuda_decoder_with_mrope_matches_numpy(vl_dirs, family):
    checkpoint = load_checkpoint(vl_dirs(family), require_vla=False)
    ids, rope = _image_prompt(checkpoint)
    embeddings = np.random.default_rng(3).standard_normal((ids.size, checkpoint.config.hidden_size)).astype(np.float32)
    positions = np.arange(ids.size, dtype=np.int32)
    logits, keys = {}, {}
    for name in ("numpy", "cuda"):
        backend = make_backend(name, checkpoint, KVArena(ids.size))
        hidden = backend.forward(positions, positions, embeddings=embeddings, rope_positions=rope).hidden
        logits[name], keys[name] = backend.logits(hidden[-1:])[0], backend.read_kv(positions)[0]
    assert Agreement.of(logits["cuda"], logits["numpy"]).cosine >= 0.99999
    np.testing.assert_allclose(logits["cuda"], logits["numpy"], rtol=0, atol=1e-4 * np.abs(logits["numpy"]).max())
    np.testing.assert_allclose(keys["cuda"], keys["numpy"], rtol=0, atol=1e-4 * np.abs(keys["numpy"]).max())


@pytest.mark.slow
def test_cuda_decode_step_and_rerotated_mrope_key(vl_dirs):
    """A decode step (the GEMV path) with M-RoPE ids, and a cached key at (t, h, w) rotated by delta (the
    arena's re-numbering) equal to the key computed at (t, h, w) + delta."""
    checkpoint = load_checkpoint(vl_dirs("qwen2_vl"), require_vla=False)
    token, slot, delta = np.array([7]), np.array([0], dtype=np.int32), -5
    ids = np.array([[9], [13], [11]], dtype=np.int32)  # an image token: the three ids differ
    moved, direct, reference = (make_backend(name, checkpoint, KVArena(4)) for name in ("cuda", "cuda", "numpy"))
    hidden = moved.forward(np.array([3]), slot, token_ids=token, rope_positions=ids).hidden
    expected = reference.forward(np.array([3]), slot, token_ids=token, rope_positions=ids).hidden
    assert Agreement.of(moved.logits(hidden)[0], reference.logits(expected)[0]).cosine >= 0.99999
    before = moved.read_kv(slot)[0]
    moved.rotate_keys(slot, np.array([delta]))
    direct.forward(np.array([3]), slot, token_ids=token, rope_positions=ids + delta)
    (moved_k, moved_v), (direct_k, direct_v) = moved.read_kv(slot), direct.read_kv(slot)
    np.testing.assert_allclose(moved_k, direct_k, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(moved_v, direct_v)
    assert np.abs(before - direct_k).max() > 1e-2  # the rotation did move it


def test_cuda_refuses_rope_positions_on_a_text_model_and_in_a_wrong_shape(vl_dirs, tiny_model):
    text = make_backend("cuda", load_checkpoint(tiny_model), KVArena(4))
    with pytest.raises(ValueError, match="no M-RoPE"):
        text.forward(np.array([0]), np.array([0]), token_ids=np.array([1]), rope_positions=np.zeros((3, 1), int))
    vl = make_backend("cuda", load_checkpoint(vl_dirs("qwen2_vl"), require_vla=False), KVArena(4))
    with pytest.raises(ValueError, match=r"integer \[3, 2\]"):
        vl.forward(np.array([0, 1]), np.array([0, 1]), token_ids=np.array([1, 2]), rope_positions=np.zeros((2, 2), int))


# -- end to end against transformers (slow) -----------------------------------------------------------------

PROMPT = [7, 17, 9]
ONE_IMAGE = PROMPT + [None] + [11, 6]
THREE_FRAMES = PROMPT + [None, None, None]


def _write_processor(model_dir, tokens: tuple[int, int]) -> None:
    """A preprocessor_config.json bounding each image to ``tokens`` (min, max) merged tokens."""
    from transformers import Qwen2VLImageProcessor

    tower = load_checkpoint(model_dir, require_vla=False).config.vl.vision
    token_pixels = (tower.patch_size * tower.spatial_merge_size) ** 2
    Qwen2VLImageProcessor(patch_size=tower.patch_size, temporal_patch_size=tower.temporal_patch_size,
                          merge_size=tower.spatial_merge_size, min_pixels=tokens[0] * token_pixels,
                          max_pixels=tokens[1] * token_pixels).save_pretrained(str(model_dir))


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(TINY))
@pytest.mark.parametrize("prompt, images", [(ONE_IMAGE, 1), (THREE_FRAMES, 3)], ids=["one_image", "three_frames"])
def test_cuda_vl_forward_matches_transformers(vl_dirs, family, prompt, images):
    """The whole VL forward on the cuda backend (CUDA tower, prompt embedding, decoder with M-RoPE, then the
    prompt fed image by image into a fresh cache) against transformers: last-token logits cosine >= 0.999."""
    model_dir = vl_dirs(family)
    _write_processor(model_dir, (4, 6))
    report = run_parity(model_dir, prompt, backend="cuda", image_size=(56, 84))
    assert report.backend == "cuda" and len(report.image_grid_thw) == images
    assert Agreement.of(report.last_logits, run_parity(model_dir, prompt, image_size=(56, 84)).last_logits).cosine \
        >= 0.99999
    assert report.logits.cosine >= CUDA_MIN_COSINE, report.logits
    assert report.incremental.cosine >= CUDA_MIN_COSINE, report.incremental
    assert all(layer.cosine >= CUDA_MIN_COSINE for layer in report.layers), report.layers


@pytest.mark.slow
def test_cuda_tower_windows_with_partial_edges_match_transformers(vl_dirs):
    """qwen2_5_vl on a 10x14-patch image (5x7 tokens: 3x4 windows, partial at both edges) and a 6x4 one."""
    model_dir = vl_dirs("qwen2_5_vl")
    grid = [[1, 10, 14], [1, 6, 4]]
    tower = CudaVisionTower.from_checkpoint(load_checkpoint(model_dir))
    patches = _patches(grid, tower.config.patch_dim, seed=7)
    assert _cosine(tower.encode(patches, np.array(grid)), _hf_tower(model_dir, patches, grid)) >= 0.99999


@pytest.mark.slow
@pytest.mark.skipif(cuda_simulated(), reason="real GPU only (bench/gpu_check.sh): 1280-wide GEMMs take hours simulated")
def test_qwen2_vl_2b_slice_on_the_gpu_matches_transformers(tmp_path):
    """Qwen2-VL-2B's real widths (ViT 1280 x 16 heads of 80, decoder 1536), 2 blocks each, bf16: the CUDA tower
    on a 224x224 frame and a 4x6-patch one, then a prompt with one image end to end."""
    model_dir = write_hf_vl_model(tmp_path / "slice", "qwen2_vl_2b_slice")
    tower = CudaVisionTower.from_checkpoint(load_checkpoint(model_dir))
    assert tower.config.head_dim == 80
    grid = [[1, 16, 16], [1, 4, 6]]
    patches = _patches(grid, tower.config.patch_dim)
    out = tower.encode(patches, np.array(grid))
    assert out.shape == (70, 1536) and _cosine(out, _hf_tower(model_dir, patches, grid)) >= 0.99999
    report = run_parity(model_dir, ONE_IMAGE, backend="cuda", image_size=(56, 56))
    assert report.logits.cosine >= CUDA_MIN_COSINE and report.incremental.cosine >= CUDA_MIN_COSINE
