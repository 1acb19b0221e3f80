"""Qwen2-VL / Qwen2.5-VL image preprocessing: an HxWx3 uint8 RGB frame -> the vision tower's patch rows.

The result is what transformers' ``Qwen2VLImageProcessor`` returns for one image as ``pixel_values``
and ``image_grid_thw``, value for value: the vision tower of a real checkpoint sees the inputs it was
trained on, and a parity test can feed the same array to both implementations.

The protocol, in order (``preprocess``):

1. Check the frame: a numpy uint8 array of shape (H, W, 3), RGB, both sides positive, aspect ratio at
   most 200 (transformers refuses more). Anything else raises ``FrameError`` naming what is wrong.
2. Size: ``smart_resize(H, W, factor, min_pixels, max_pixels)`` with ``factor = patch_size x
   merge_size`` (28 for both families). Each side is rounded to the nearest multiple of the factor
   (Python's ``round``: halves go to even); if that area exceeds max_pixels, both sides are scaled by
   ``sqrt(H W / max_pixels)`` and floored to multiples (at least one factor); else if it is under
   min_pixels, they are scaled by ``sqrt(min_pixels / (H W))`` and ceiled. The aspect ratio is kept as
   nearly as the multiples allow.
3. Resize with Pillow's ``Image.resize`` and the checkpoint's ``resample`` filter (bicubic for every
   Qwen2-VL and Qwen2.5-VL checkpoint), on the uint8 image: the call transformers makes on its PIL
   path. Pillow returns a copy when the size does not change, so that case is skipped here.
4. Per value: ``x * rescale_factor`` in float64 cast to float32, then ``(x - mean) / std`` in float32
   with mean and std cast to float32, the order and precision of transformers' ``rescale`` and
   ``normalize``. A pixel value has only 256 possible values per channel, so the whole map is one
   [256, 3] float32 table built once per ``ImageProcessing`` with those exact operations, and a frame
   costs one gather. The result is therefore bit-equal to transformers', not merely close.
5. Cut into patches. With P = patch_size, m = merge_size and T = temporal_patch_size, the resized
   image has a (gh, gw) = (H'/P, W'/P) grid of patches. Rows follow the merger's windows: window
   rows, then window columns, then the m x m patches inside a window row by row, so each run of m^2
   consecutive rows is one decoder token after the 2 x 2 merge. A row is the patch flattened as
   (channel, t, y, x): C x T x P x P values, the single image repeated over the T temporal slots (a
   still image is a clip of T equal frames, which is what the Conv3d patch embedding expects).
   ``grid_thw = (1, gh, gw)``; the decoder sees ``gh x gw / m^2`` tokens.

The cap (the ``max_pixels`` argument; the runtime passes ``reasoning.vision_max_pixels``): smart_resize
runs with ``min(min_pixels, cap)`` and ``min(max_pixels, cap)``, the checkpoint's bounds lowered to the
cap, which is transformers called with ``size={"shortest_edge": ..., "longest_edge": ...}`` of those
two values. Lowering min_pixels matters only for a cap under the checkpoint's minimum: a small frame is
then not enlarged to that minimum, above the cap and above the tokens of larger frames.

Tokens per frame: the runtime (``model/vl/frames.py``) first resizes every camera frame to one S x S
square, S the largest multiple of the factor whose square fits the cap, so every frame gets the same
grid, (S / 28)^2 tokens known before the first frame arrives, whatever camera sends it. For an image of
any other size, ``frame_tokens(H, W, processing, cap)`` gives its count; two properties hold for it,
each with transformers' own exceptions, which are reproduced rather than corrected:

- At most the cap: the area exceeds it only in the shrinking branch when the short side is raised to
  one factor (aspect ratio above ``cap / factor^2``: 64 at the default cap), and in the growing branch
  (rounded area under ``min(min_pixels, cap)``), whose ceilings add up to one factor to each side. With
  the checkpoints' min_pixels (3136) and the default cap, no frame size the camera node accepts with an
  aspect ratio up to 64 exceeds the cap; a cap near or under min_pixels can be overshot by small frames.
- Independent of the resolution: for one aspect ratio, every resolution whose rounded area is above
  the cap gets the same grid, since the scaled sides ``sqrt(cap x H / W)`` and ``sqrt(cap x W / H)``
  depend on the ratio only; except where a scaled side is exactly a multiple of the factor, which
  floating point floors to either side depending on the resolution. Square frames under a square cap
  are such a case (the default cap is 224 x 224: 7 or 8 windows a side), and so is 9:16; 4:3, 3:2,
  16:10, 5:4 and 2:1 are not.

The torchvision path: with torchvision installed, transformers' default ``Qwen2VLImageProcessor`` is the
torchvision backend, which differs from the PIL path this module reproduces (and which transformers
uses without torchvision, or always as ``Qwen2VLImageProcessorPil``). (a) It resizes with torch's
``interpolate(mode="bicubic", antialias=True)`` on the uint8 tensor (on GPU: in float32, then clamp
and round), which is not Pillow's fixed-point filter. Measured with torch 2.13 on an AVX-512 CPU:
a smooth image (blurred noise) resized 480x640 -> 476x644 differs from Pillow by up to 2 levels on
12 % of the values, 480x640 -> 224x308 by 1 level on 0.3 %; uniform noise 480x640 -> 476x644 by up
to 22 levels on 31 % (the mixed up- and down-scaling); the float32 path differs by 1 level on 15-20 %
of a smooth image's values. One level is 1 / (255 x std), about 0.015 after normalisation. (b) It
fuses rescale into normalize, ``(x - mean / s) / (std / s)`` in float32: up to 2.4e-7 from the
two-step values, on 70 % of them. The path reproduced here is the default image processor transformers
had when these checkpoints were released (numpy and Pillow; the torchvision one came later, or was not
yet the default).

What this is not: video (a clip of T distinct frames), several images batched into one array (each
frame is preprocessed on its own; concatenating the rows of several frames gives transformers' batch),
or ``do_resize: false`` (a camera frame of arbitrary size could not be cut into whole merge windows,
and the cap could not hold).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ..config import ModelConfigError
from ..vision import FrameError

PREPROCESSOR_CONFIG = "preprocessor_config.json"

MAX_ASPECT_RATIO = 200
"""transformers refuses a frame whose longer side is more than this many times its shorter side."""

RESAMPLE_FILTERS: dict[int, str] = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
"""``resample`` values (Pillow's and transformers' PILImageResampling numbering) and their names."""

PROCESSOR_TYPES = ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast", "Qwen2VLImageProcessorPil")
"""``image_processor_type`` values of Qwen2-VL and Qwen2.5-VL checkpoints (both families use Qwen2-VL's)."""

# Keys that say which classes a checkpoint was saved with and change nothing here. do_convert_rgb only
# converts frames that are not RGB, and a frame here always is.
_INFORMATIONAL_KEYS = ("image_processor_type", "processor_class", "do_convert_rgb")

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class ProcessorConfigError(ModelConfigError):
    """A preprocessor_config.json this module cannot reproduce faithfully; the message names the field (and the
    file, when read through ``from_dict`` or ``load``)."""


@dataclass(frozen=True)
class ImageProcessing:
    """The image processor settings of a checkpoint; defaults are transformers' for a missing key."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD
    do_resize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    resample: int = 3

    def __post_init__(self) -> None:
        for name in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels", "resample"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ProcessorConfigError(f"{name} must be an integer, got {value!r}")
            if name != "resample" and value < 1:
                raise ProcessorConfigError(f"{name} must be positive, got {value}")
        if self.min_pixels > self.max_pixels:
            raise ProcessorConfigError(f"min_pixels ({self.min_pixels}) is above max_pixels "
                                       f"({self.max_pixels})")
        if self.resample not in RESAMPLE_FILTERS:
            raise ProcessorConfigError(f"resample must be one of {sorted(RESAMPLE_FILTERS)} "
                                       f"(Pillow's filters), got {self.resample}")
        for name in ("do_resize", "do_rescale", "do_normalize"):
            if not isinstance(getattr(self, name), bool):
                raise ProcessorConfigError(f"{name} must be true or false, "
                                           f"got {getattr(self, name)!r}")
        if not self.do_resize:
            raise ProcessorConfigError("do_resize: false is not supported: camera frames of "
                                       "any size must be resized to whole merge windows")
        if not _finite_number(self.rescale_factor) or self.rescale_factor <= 0:
            raise ProcessorConfigError("rescale_factor must be a positive number, "
                                       f"got {self.rescale_factor!r}")
        for name in ("image_mean", "image_std"):
            values = getattr(self, name)
            if not (isinstance(values, tuple) and len(values) == 3 and all(map(_finite_number, values))):
                raise ProcessorConfigError(f"{name} must be one number or 3 (RGB), "
                                           f"got {values!r}")
        if 0 in self.image_std:
            raise ProcessorConfigError(f"image_std must not be 0, got {self.image_std}")

    @property
    def factor(self) -> int:
        """Both resized sides are multiples of this: one merge window of patches."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Values in one row of the patches: channels x temporal_patch_size x patch_size^2."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    def pixel_bounds(self, max_pixels: int | None = None) -> tuple[int, int]:
        """(min_pixels, max_pixels) smart_resize uses under a cap (None: the checkpoint's own)."""
        if max_pixels is None:
            return self.min_pixels, self.max_pixels
        if not isinstance(max_pixels, int) or isinstance(max_pixels, bool) or max_pixels < 1:
            raise ValueError(f"max_pixels must be a positive integer or None, got {max_pixels!r}")
        return min(self.min_pixels, max_pixels), min(self.max_pixels, max_pixels)

    @cached_property
    def value_table(self) -> np.ndarray:
        """[256, 3] float32: what rescale and normalize make of each uint8 value in each channel, computed
        with transformers' operations in their order and precision (so a gather is bit-equal to them)."""
        values = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)
        out = values.astype(np.float32)
        if self.do_rescale:
            out = (values.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.do_normalize:
            out = (out - np.asarray(self.image_mean, dtype=np.float32)) / np.asarray(self.image_std, dtype=np.float32)
        out.flags.writeable = False
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], source: str = PREPROCESSOR_CONFIG) -> ImageProcessing:
        """From a parsed preprocessor_config.json. min_pixels / max_pixels (older files) take precedence over
        ``size: {shortest_edge, longest_edge}`` (newer ones), as in transformers; an unknown key is refused."""
        if not isinstance(raw, Mapping):
            raise ProcessorConfigError(f"{source}: must be a JSON object, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)} | {"size", *_INFORMATIONAL_KEYS}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ProcessorConfigError(f"{source}: unsupported keys {unknown}; known: {sorted(known)}")
        kind = raw.get("image_processor_type")
        if kind is not None and kind not in PROCESSOR_TYPES:
            raise ProcessorConfigError(f"{source}: image_processor_type {kind!r} is not one of {list(PROCESSOR_TYPES)}")
        values = {f.name: raw[f.name] for f in fields(cls) if raw.get(f.name) is not None}
        size = raw.get("size")
        if size is not None:
            if not isinstance(size, Mapping) or set(size) != {"shortest_edge", "longest_edge"}:
                raise ProcessorConfigError(f"{source}: size must be {{shortest_edge, longest_edge}} (pixel counts), "
                                           f"got {size!r}")
            values.setdefault("min_pixels", size["shortest_edge"])
            values.setdefault("max_pixels", size["longest_edge"])
        for name in ("image_mean", "image_std"):
            if name in values:
                value = values[name]
                values[name] = tuple(value) if isinstance(value, list) else (value,) * 3
        try:
            return cls(**values)
        except ProcessorConfigError as exc:
            raise ProcessorConfigError(f"{source}: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> ImageProcessing:
        """From a checkpoint directory's preprocessor_config.json (or that file's path)."""
        path = Path(path)
        if path.is_dir():
            path = path / PREPROCESSOR_CONFIG
        try:
            raw = json.loads(path.read_text())
        except OSError as exc:
            raise ProcessorConfigError(f"cannot read {path}: {exc.strerror}") from exc
        except ValueError as exc:  # not JSON, or not UTF-8
            raise ProcessorConfigError(f"{path}: not valid JSON: {exc}") from exc
        return cls.from_dict(raw, str(path))


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 14 * 14 * 4 * 1280) -> tuple[int, int]:
    """(height, width) a frame is resized to, as transformers' smart_resize computes it (defaults too):
    multiples of ``factor``, about the frame's aspect ratio, its area brought into [min_pixels,
    max_pixels] when the rounded size falls outside (the module docstring says when it still may)."""
    for name, value in (("height", height), ("width", width)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise FrameError(f"frame {name} must be a positive integer, got {value!r}")
    for name, value in (("factor", factor), ("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"smart_resize: {name} must be a positive integer, got {value!r}")
    height, width = int(height), int(width)
    if max(height, width) > MAX_ASPECT_RATIO * min(height, width):
        raise FrameError(f"frame {height}x{width} has an aspect ratio above {MAX_ASPECT_RATIO} "
                         f"({max(height, width) / min(height, width):.1f}), which Qwen2-VL preprocessing refuses")
    rounded_h, rounded_w = round(height / factor) * factor, round(width / factor) * factor
    if rounded_h * rounded_w > max_pixels:
        shrink = math.sqrt(height * width / max_pixels)
        return (max(factor, math.floor(height / shrink / factor) * factor),
                max(factor, math.floor(width / shrink / factor) * factor))
    if rounded_h * rounded_w < min_pixels:
        grow = math.sqrt(min_pixels / (height * width))
        return math.ceil(height * grow / factor) * factor, math.ceil(width * grow / factor) * factor
    return rounded_h, rounded_w


def image_grid(height: int, width: int, processing: ImageProcessing,
               max_pixels: int | None = None) -> tuple[int, int, int]:
    """(t, h, w) patch grid of a height x width frame: ``image_grid_thw`` without the pixels."""
    low, high = processing.pixel_bounds(max_pixels)
    resized_h, resized_w = smart_resize(height, width, processing.factor, low, high)
    return 1, resized_h // processing.patch_size, resized_w // processing.patch_size


def frame_tokens(height: int, width: int, processing: ImageProcessing, max_pixels: int | None = None) -> int:
    """Decoder tokens of one height x width frame after the merge_size x merge_size patch merger."""
    t, h, w = image_grid(height, width, processing, max_pixels)
    return t * h * w // (processing.merge_size * processing.merge_size)


def preprocess(image: np.ndarray, processing: ImageProcessing,
               max_pixels: int | None = None) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(patches [gh x gw, patch_dim] float32, grid_thw (1, gh, gw)) of one HxWx3 uint8 RGB frame: transformers'
    ``pixel_values`` and ``image_grid_thw`` for it, with ``max_pixels`` capping the checkpoint's bounds. The
    patches are a new C-contiguous array; the frame is only read."""
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        shape = getattr(image, "shape", None)
        dtype = getattr(image, "dtype", type(image).__name__)
        raise FrameError(f"frame must be an HxWx3 uint8 RGB array, got shape {shape} dtype {dtype}")
    height, width = image.shape[:2]
    if height == 0 or width == 0:
        raise FrameError(f"frame is empty: shape {image.shape}")
    _, grid_h, grid_w = grid = image_grid(height, width, processing, max_pixels)
    p, m, t = processing.patch_size, processing.merge_size, processing.temporal_patch_size
    size = (grid_h * p, grid_w * p)
    if size != (height, width):
        pil = Image.fromarray(np.ascontiguousarray(image))
        image = np.asarray(pil.resize((size[1], size[0]), resample=Image.Resampling(processing.resample)))
    pixels = processing.value_table[image, np.arange(3)]  # [H', W', 3] float32
    # (window row, y in window, patch y, window col, x in window, patch x, channel) -> rows of windows
    windows = pixels.reshape(grid_h // m, m, p, grid_w // m, m, p, 3).transpose(0, 3, 1, 4, 6, 2, 5)
    clip = np.broadcast_to(windows[:, :, :, :, :, None], windows.shape[:5] + (t, p, p))
    return clip.reshape(grid_h * grid_w, processing.patch_dim), grid


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
