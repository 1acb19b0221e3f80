"""Qwen2-VL / Qwen2.5-VL preprocessing against transformers' own image processor.

Tolerance: none. ``pixel_values`` must be bit-equal, not close: the resize is the same Pillow call, and
every value goes through the same float64 rescale, float32 cast, and float32 subtract and divide that
transformers applies (model/vl/preprocess.py builds its value table with exactly those operations). Any
difference, even one ulp, means a different operation or order, which is what these tests are for.

The reference is ``Qwen2VLImageProcessorPil``: what ``Qwen2VLImageProcessor`` falls back to without
torchvision (as here), and the Pillow path Qwen's checkpoints were released with. The torchvision
backend resizes differently (model/vl/preprocess.py's docstring has the measured differences).
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from vla_edge_ros.config import ConfigError, default_of, parse_settings
from vla_edge_ros.model.vision import FrameError
from vla_edge_ros.model.vl.preprocess import (
    ImageProcessing,
    ProcessorConfigError,
    frame_tokens,
    image_grid,
    preprocess,
    smart_resize,
)

transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf_pil  # noqa: E402

HF = hf_pil.Qwen2VLImageProcessorPil

# preprocessor_config.json of Qwen/Qwen2-VL-2B-Instruct and Qwen/Qwen2.5-VL-3B-Instruct as published (the
# older layout: min_pixels / max_pixels at the top, no size); Qwen2.5-VL uses Qwen2-VL's image processor.
QWEN2_VL_2B = {
    "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor",
}
QWEN2_5_VL_3B = {**QWEN2_VL_2B, "processor_class": "Qwen2_5_VLProcessor"}


def _frame(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _hf(processor, image: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
    """transformers' pixel_values and image_grid_thw of one channels-last frame."""
    out = processor(images=image, input_data_format="channels_last", return_tensors="np")
    assert out["image_grid_thw"].shape == (1, 3)
    return out["pixel_values"], tuple(int(v) for v in out["image_grid_thw"][0])


def _assert_same(image: np.ndarray, processing: ImageProcessing, processor, max_pixels: int | None = None) -> None:
    want, want_grid = _hf(processor, image)
    got, grid = preprocess(image, processing, max_pixels)
    assert grid == want_grid
    assert got.dtype == np.float32 and want.dtype == np.float32
    assert got.shape == want.shape == (math.prod(grid), processing.patch_dim)
    assert np.array_equal(got, want), f"max |diff| {np.abs(got - want).max()}"
    assert frame_tokens(*image.shape[:2], processing, max_pixels) == got.shape[0] // processing.merge_size ** 2


@pytest.mark.parametrize("height, width, settings", [
    (37, 53, {}),  # odd sides; rounded area under min_pixels: the growing branch
    (480, 640, {}),  # a camera frame: rounded to 476 x 644
    (1, 200, {}),  # aspect ratio exactly 200, the most transformers accepts
    (200, 1, {}),
    (3, 5, {}),  # far below min_pixels
    (28, 28, {}),
    (56, 84, {}),  # already whole merge windows within the bounds: no resize
    (70, 42, {}),  # 2.5 and 1.5 factors: Python's round takes halves to even
    (1500, 2000, {}),  # above the default max_pixels (1003520): the shrinking branch
    (300, 517, {"max_pixels": 28 * 28 * 16}),  # above a small max_pixels
    (37, 53, {"resample": 2}),  # Pillow's other filters
    (37, 53, {"resample": 1}),
    (37, 53, {"resample": 0}),
    (37, 53, {"resample": 4}),
    (37, 53, {"resample": 5}),
    (37, 53, {"do_rescale": False}),
    (37, 53, {"do_normalize": False}),
    (37, 53, {"do_rescale": False, "do_normalize": False}),
    (37, 53, {"image_mean": 0.5, "image_std": 0.25, "rescale_factor": 1 / 256}),
    (45, 61, {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 1}),  # other geometries
    (45, 61, {"patch_size": 7, "merge_size": 3, "temporal_patch_size": 3}),
])
def test_pixel_values_and_grid_equal_transformers(height, width, settings):
    image = _frame(height, width, seed=height * 10007 + width)
    _assert_same(image, ImageProcessing.from_dict(settings), HF(**settings))


@pytest.mark.parametrize("published", [QWEN2_VL_2B, QWEN2_5_VL_3B], ids=["qwen2-vl-2b", "qwen2.5-vl-3b"])
def test_published_checkpoint_configs_load_and_match(tmp_path, published):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(published))
    processing = ImageProcessing.load(tmp_path)
    assert (processing.min_pixels, processing.max_pixels, processing.factor) == (3136, 12845056, 28)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        auto = transformers.AutoImageProcessor.from_pretrained(tmp_path)
    if not transformers.utils.is_torchvision_available():
        assert isinstance(auto, HF)  # the fallback this module reproduces
    processor = HF.from_pretrained(tmp_path)
    _assert_same(_frame(480, 640), processing, processor)
    # the runtime's cap: transformers with both bounds lowered to it
    cap = default_of("reasoning", "vision_max_pixels")
    _assert_same(_frame(480, 640), processing, HF.from_pretrained(tmp_path, min_pixels=3136, max_pixels=cap), cap)


def test_a_config_saved_by_transformers_and_key_precedence(tmp_path):
    """transformers 5 saves size: {shortest_edge, longest_edge}; older keys min_pixels / max_pixels win."""
    HF(min_pixels=1000, max_pixels=20000, resample=2, image_mean=[0.5, 0.4, 0.3]).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert saved["size"] == {"shortest_edge": 1000, "longest_edge": 20000} and "max_pixels" not in saved
    processing = ImageProcessing.load(tmp_path / "preprocessor_config.json")
    assert (processing.min_pixels, processing.max_pixels, processing.resample) == (1000, 20000, 2)
    _assert_same(_frame(333, 250), processing, HF.from_pretrained(tmp_path))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**saved, "max_pixels": 8000}))
    processing = ImageProcessing.load(tmp_path)
    assert (processing.min_pixels, processing.max_pixels) == (1000, 8000)
    _assert_same(_frame(333, 250), processing, HF.from_pretrained(tmp_path))


@pytest.mark.parametrize("height, width, cap", [
    (480, 640, 12544),
    (480, 640, 784),  # a cap under min_pixels lowers both bounds
    (14, 14, 784),  # ... so a small frame is not enlarged to the checkpoint's minimum: 1 token, not 4
    (20, 20, 100_000_000),  # a cap above the checkpoint's max_pixels leaves it
])
def test_the_cap_is_transformers_with_both_bounds_lowered(height, width, cap):
    processing = ImageProcessing()
    reference = HF(min_pixels=min(3136, cap), max_pixels=min(1003520, cap))
    _assert_same(_frame(height, width), processing, reference, cap)


def test_patch_rows_follow_the_merge_windows():
    """The layout, stated without transformers: rows by window row, window column, then the m x m patches of a
    window; a row is (channel, t, y, x) with the frame repeated over t."""
    processing = ImageProcessing(do_rescale=False, do_normalize=False)  # values stay the pixels
    image = _frame(56, 84, seed=3)  # whole windows within the bounds: not resized
    patches, grid = preprocess(image, processing)
    p, m, t = 14, 2, 2
    assert grid == (1, 4, 6)
    row = 0
    for wy in range(grid[1] // m):
        for wx in range(grid[2] // m):
            for y in range(m):
                for x in range(m):
                    top, left = (wy * m + y) * p, (wx * m + x) * p
                    tile = image[top:top + p, left:left + p].transpose(2, 0, 1).astype(np.float32)  # (c, y, x)
                    assert np.array_equal(patches[row].reshape(3, t, p, p), np.stack([tile] * t, axis=1)), row
                    row += 1


def test_smart_resize_equals_transformers_over_a_sweep():
    rng = np.random.default_rng(1)
    sizes = [(h, w) for h in range(1, 80) for w in range(1, 80)]
    sizes += [tuple(int(v) for v in rng.integers(1, 9000, 2)) for _ in range(2000)]
    sizes += [(1, 200), (1, 201), (2, 400), (2, 401), (41, 8192), (8192, 40)]
    for factor, low, high in [(28, 3136, 1003520), (28, 3136, 12544), (28, 784, 784), (32, 1, 10**9)]:
        for h, w in sizes:
            try:
                want = hf_pil.smart_resize(h, w, factor, low, high)
            except ValueError:
                with pytest.raises(FrameError, match="aspect ratio above 200"):
                    smart_resize(h, w, factor, low, high)
                continue
            assert smart_resize(h, w, factor, low, high) == want, (h, w, factor, low, high)
    assert smart_resize(480, 640) == hf_pil.smart_resize(480, 640)  # the same defaults


@pytest.mark.parametrize("image, message", [
    (np.zeros((8, 8, 3), np.float32), "uint8"),
    (np.zeros((8, 8, 4), np.uint8), r"shape \(8, 8, 4\)"),
    (np.zeros((8, 8), np.uint8), r"shape \(8, 8\)"),
    (np.zeros((3, 8, 8), np.uint8), r"shape \(3, 8, 8\)"),  # channels first
    ([[[0, 0, 0]]], "got shape None dtype list"),
    (np.zeros((0, 8, 3), np.uint8), "empty"),
    (np.zeros((1, 201, 3), np.uint8), "aspect ratio above 200"),
])
def test_bad_frames_raise_frame_error(image, message):
    with pytest.raises(FrameError, match=message):
        preprocess(image, ImageProcessing())


def test_bad_arguments_are_refused():
    with pytest.raises(FrameError, match="height must be a positive integer"):
        smart_resize(0, 5)
    with pytest.raises(FrameError, match="width must be a positive integer"):
        frame_tokens(5, 2.5, ImageProcessing())
    with pytest.raises(ValueError, match="factor must be a positive integer"):
        smart_resize(5, 5, factor=0)
    with pytest.raises(ValueError, match="max_pixels must be a positive integer or None"):
        preprocess(_frame(8, 8), ImageProcessing(), max_pixels=0)


@pytest.mark.parametrize("raw, message", [
    ({"do_pad": True}, r"unsupported keys \['do_pad'\]"),
    ({"image_processor_type": "SiglipImageProcessor"}, "image_processor_type 'SiglipImageProcessor'"),
    ({"resample": 7}, "resample must be one of"),
    ({"do_resize": False}, "do_resize: false is not supported"),
    ({"size": {"height": 224, "width": 224}}, "size must be {shortest_edge, longest_edge}"),
    ({"min_pixels": 5000, "max_pixels": 4000}, r"min_pixels \(5000\) is above max_pixels \(4000\)"),
    ({"patch_size": "14"}, "patch_size must be an integer"),
    ({"merge_size": 0}, "merge_size must be positive"),
    ({"temporal_patch_size": True}, "temporal_patch_size must be an integer"),
    ({"image_mean": [0.5, 0.5]}, "image_mean must be one number or 3"),
    ({"image_std": [0.5, 0.0, 0.5]}, "image_std must not be 0"),
    ({"rescale_factor": -1}, "rescale_factor must be a positive number"),
    ({"do_normalize": "yes"}, "do_normalize must be true or false"),
    ([1, 2], "must be a JSON object"),
])
def test_unsupported_processor_configs_name_the_field(raw, message):
    with pytest.raises(ProcessorConfigError, match=message) as info:
        ImageProcessing.from_dict(raw, "ckpt/preprocessor_config.json")
    assert str(info.value).startswith("ckpt/preprocessor_config.json: ")


def test_unreadable_processor_config(tmp_path):
    with pytest.raises(ProcessorConfigError, match="cannot read"):
        ImageProcessing.load(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(ProcessorConfigError, match="not valid JSON"):
        ImageProcessing.load(tmp_path)


def test_frame_tokens_are_fixed_by_the_cap_for_any_camera_size():
    """The default cap holds for every frame size the camera node accepts up to aspect ratio 64 (= cap / 28^2),
    and for a given aspect ratio every resolution above the cap gets the same grid."""
    processing, cap = ImageProcessing.from_dict(QWEN2_VL_2B), default_of("reasoning", "vision_max_pixels")
    assert cap == 224 * 224 and frame_tokens(480, 640, processing, cap) == 54
    sides = list(range(8, 200, 3)) + list(range(200, 8193, 97))
    for h in sides:
        for w in sides:
            if max(h, w) <= 64 * min(h, w):
                _, gh, gw = image_grid(h, w, processing, cap)
                assert gh * gw * 14 * 14 <= cap and frame_tokens(h, w, processing, cap) <= cap // 784, (h, w)
    for ratio in [(3, 4), (4, 3), (2, 3), (10, 16), (4, 5), (1, 2)]:
        grids = {image_grid(ratio[0] * k, ratio[1] * k, processing, cap)
                 for k in range(1, 8193 // max(ratio) + 1) if ratio[0] * ratio[1] * k * k > 1.2 * cap}
        assert len(grids) == 1, (ratio, grids)
    # without the cap the published max_pixels lets the tokens grow with the camera
    assert frame_tokens(480, 640, processing) == 391 and frame_tokens(1440, 1920, processing) == 3519


def test_the_cap_is_a_schema_parameter():
    settings = parse_settings({"reasoning": {"ros__parameters": {"vision_max_pixels": 28 * 28 * 256}}}, "robot.yaml")
    assert settings["reasoning"]["vision_max_pixels"] == 200704
    with pytest.raises(ConfigError, match="robot.yaml: reasoning: vision_max_pixels=100 is below the minimum 784"):
        parse_settings({"reasoning": {"ros__parameters": {"vision_max_pixels": 100}}}, "robot.yaml")
