"""A camera frame through a Qwen2-VL / Qwen2.5-VL checkpoint: one image segment of a fixed token count.

Memory policies, the arena's layout and the memory plan all count a frame as ``tokens_per_frame``
tokens, known before the first frame arrives. A VL checkpoint's token count follows the image size, so
every camera frame is first resized to one square S x S: S is the largest multiple of the checkpoint's
patch_size x merge_size (28 for both families) whose square fits the configured pixel cap
(``reasoning.vision_max_pixels``) and the checkpoint's max_pixels, and not below its min_pixels. That
S x S image is then preprocessed exactly as transformers' image processor preprocesses it
(``preprocess.preprocess``; S already is what its smart_resize picks, so it resizes nothing), and the
tower turns its (S / patch)^2 patches into n = (S / 28)^2 merged tokens. The frame enters the decoder as
``<vision_start>``, those n tokens, ``<vision_end>`` (the embeddings of the two marker tokens around the
tower's output, what transformers' prompt of one image holds), so tokens_per_frame = n + 2.

``with_frame_geometry`` writes S and n + 2 into the checkpoint's ``config.vision`` (``image_size``,
``tokens_per_frame``), once, in the runtime's loader; everything downstream reads those two numbers as
it does for the built-in frame encoder.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..checkpoint import Checkpoint
from ..config import ModelConfigError, VisionConfig
from ..vision import check_frame, resize_frame
from .positions import rope_index
from .preprocess import ImageProcessing, preprocess
from .tower import VisionEncoder

MARKER_TOKENS = 2  # vision start and vision end around each frame's visual tokens


def text_rope_ids(first: int, count: int) -> np.ndarray:
    """M-RoPE ids [3, count] of text-like tokens from id ``first``: t = h = w, one apart."""
    return np.broadcast_to(np.arange(first, first + count, dtype=np.int32), (3, count)).copy()


def frame_side(processing: ImageProcessing, max_pixels: int) -> int:
    """S: the side of the square every camera frame is resized to (see the module doc)."""
    factor = processing.factor
    cap = min(max_pixels, processing.max_pixels)
    side = math.isqrt(cap) // factor * factor
    if side == 0 or side * side < processing.min_pixels:
        raise ModelConfigError(
            f"vision_max_pixels={max_pixels} leaves no square frame of whole {factor}x{factor} merge windows with "
            f"at least the checkpoint's min_pixels ({processing.min_pixels}); raise it to at least "
            f"{(math.isqrt(processing.min_pixels - 1) // factor + 1) ** 2 * factor * factor}")
    return side


def frame_geometry(processing: ImageProcessing, max_pixels: int) -> VisionConfig:
    """The frames a VL checkpoint with ``processing`` sees under ``max_pixels``: S x S, (S / 28)^2 + 2 tokens."""
    side = frame_side(processing, max_pixels)
    return VisionConfig(image_size=side, patch_size=processing.patch_size,
                        tokens_per_frame=(side // processing.factor) ** 2 + MARKER_TOKENS,
                        mean=processing.image_mean, std=processing.image_std)


def with_frame_geometry(checkpoint: Checkpoint, max_pixels: int) -> Checkpoint:
    """The checkpoint with ``config.vision`` set to the frames a VL checkpoint will see under ``max_pixels``
    (a plain Qwen2 checkpoint comes back unchanged: its frame encoder's geometry is its own)."""
    config = checkpoint.config
    if config.vl is None:
        return checkpoint
    processing = ImageProcessing.load(checkpoint.path)
    tower = config.vl.vision
    if processing.patch_size != tower.patch_size or processing.merge_size != tower.spatial_merge_size:
        raise ModelConfigError(
            f"{checkpoint.path}: preprocessor_config.json cuts {processing.patch_size}-pixel patches merged "
            f"{processing.merge_size}x{processing.merge_size}, the tower's config.json "
            f"{tower.patch_size} and {tower.spatial_merge_size}")
    return replace(checkpoint, config=replace(config, vision=frame_geometry(processing, max_pixels)))


class VlFrameEncoder:
    """HxWx3 uint8 frame -> [tokens_per_frame, hidden] embeddings of one image segment, and its M-RoPE ids."""

    def __init__(self, checkpoint: Checkpoint, processing: ImageProcessing, tower: VisionEncoder) -> None:
        """``tower``: the checkpoint's vision tower on the engine's backend (``tower.make_vision_tower``)."""
        config = checkpoint.config
        vl = config.vl
        if vl is None:
            raise ModelConfigError(f"{checkpoint.path} is not a VL checkpoint")
        self.side = config.vision.image_size
        cells = self.side // processing.factor
        if self.side % processing.factor or config.vision.tokens_per_frame != cells * cells + MARKER_TOKENS:
            raise ModelConfigError(
                f"{checkpoint.path}: config.vision (image_size {self.side}, tokens_per_frame "
                f"{config.vision.tokens_per_frame}) is not a VL frame geometry: load the checkpoint through "
                "runtime.loader.load_model (vl.frames.with_frame_geometry)")
        self.processing = processing
        self.tower = tower
        self.grid_thw = np.array([[1, self.side // processing.patch_size, self.side // processing.patch_size]])
        table = checkpoint.tensors["model.embed_tokens.weight"]
        markers = table.array[[vl.vision_start_token_id, vl.vision_end_token_id]]
        self.start, self.end = replace(table, array=markers).to_float32()
        n = cells * cells
        layout = np.r_[vl.vision_start_token_id, np.full(n, vl.image_token_id), vl.vision_end_token_id]
        self._rope_offsets = rope_index(layout, self.grid_thw, image_token_id=vl.image_token_id,
                                        spatial_merge_size=processing.merge_size)  # from id 0

    def rope_ids(self, first: int) -> np.ndarray:
        """M-RoPE ids [3, tokens] of a frame segment whose vision start marker gets id ``first``."""
        return self._rope_offsets + np.int32(first)

    def square(self, image: np.ndarray) -> np.ndarray:
        """The frame resized to S x S (area interpolation, as the built-in encoder resizes), validated."""
        check_frame(image)
        return resize_frame(image, self.side)

    def encode(self, image: np.ndarray) -> np.ndarray:
        """[tokens_per_frame, hidden] fp32: vision start, the tower's merged tokens, vision end."""
        patches, grid = preprocess(self.square(image), self.processing, self.side * self.side)
        visual = self.tower.encode(patches, np.asarray([grid]))
        return np.concatenate([self.start[None], visual, self.end[None]]).astype(np.float32, copy=False)
