"""A Qwen2-VL / Qwen2.5-VL prompt as the decoder's inputs: embeddings with the images in, and M-RoPE ids.

The prompt's ids are embedded as text; the image pad tokens' rows are then replaced, in order, by the
vision tower's merged tokens (what transformers' masked scatter does), and every token gets its
[3] M-RoPE ids from ``positions.rope_index``. The decoder runs the result at sequence positions
0..T-1 (the arena's order, which masking reads) with those ids (which the rotation reads), whole or in
segments: each segment is the same forward over the tokens it covers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..checkpoint import Checkpoint
from ..safetensors_io import StoredTensor
from .config import VlConfig
from .positions import rope_index
from .vision_layout import merged_token_counts

ImageEncoder = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""(patches [N, patch_dim], grid_thw [n, 3]) -> merged image tokens [sum of tokens, hidden]: ``VisionTower.encode``."""


def expand_prompt(pieces: Sequence[int | None], image_grid_thw: np.ndarray, vl: VlConfig) -> np.ndarray:
    """Token ids of a prompt whose ``None`` entries are images: each becomes vision start, pads, vision end."""
    slots, grids = sum(piece is None for piece in pieces), np.asarray(image_grid_thw).reshape(-1, 3)
    if slots != len(grids):
        raise ValueError(f"the prompt has {slots} image slots but {len(grids)} images were given")
    images = iter(merged_token_counts(grids, vl.vision.spatial_merge_size) if slots else [])
    ids: list[int] = []
    for piece in pieces:
        ids += [piece] if piece is not None else \
            [vl.vision_start_token_id] + [vl.image_token_id] * int(next(images)) + [vl.vision_end_token_id]
    return np.asarray(ids, dtype=np.int32)


@dataclass
class VlPrompt:
    """What the decoder runs for one VL prompt."""

    token_ids: np.ndarray  # [T]
    embeddings: np.ndarray  # [T, H] fp32, image pads replaced by the tower's tokens
    rope_positions: np.ndarray  # [3, T] M-RoPE ids

    def segments(self, image_token_id: int) -> list[slice]:
        """The prompt cut as a runtime feeds it: each text token alone, each image's pad run at once."""
        is_image = self.token_ids == image_token_id
        starts = np.flatnonzero(np.concatenate(([True], ~is_image[1:] | ~is_image[:-1])))
        ends = np.append(starts[1:], self.token_ids.size)
        return [slice(int(a), int(b)) for a, b in zip(starts, ends)]


def embed_vl_prompt(checkpoint: Checkpoint, encode: ImageEncoder, token_ids: np.ndarray, pixel_values: np.ndarray,
                    image_grid_thw: np.ndarray) -> VlPrompt:
    """Embed ``token_ids`` (with image pad runs) and put the images' tokens from ``encode`` in their place."""
    vl = checkpoint.config.vl
    if vl is None:
        raise ValueError(f"{checkpoint.path} is not a VL checkpoint: it has no vision tower for images")
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    vocab = checkpoint.config.vocab_size
    outside = ids[(ids < 0) | (ids >= vocab)]
    if ids.size == 0 or outside.size:
        raise ValueError(f"a VL prompt needs token ids in [0, {vocab}), got {np.unique(outside).tolist() or 'none'}")
    grids = np.asarray(image_grid_thw, dtype=np.int64).reshape(-1, 3)
    rope = rope_index(ids, grids, image_token_id=vl.image_token_id, spatial_merge_size=vl.vision.spatial_merge_size)
    table = checkpoint.tensors["model.embed_tokens.weight"]
    embeddings = StoredTensor(table.dtype, table.array[ids]).to_float32()  # only the rows used, widened exactly
    image = ids == vl.image_token_id
    if image.any():
        embeddings[image] = encode(np.asarray(pixel_values, dtype=np.float32), grids)
    return VlPrompt(ids.astype(np.int32), embeddings, rope)
