"""M-RoPE position ids of a Qwen2-VL / Qwen2.5-VL prompt: where transformers places each token (images only).

A VL prompt is text with images spliced in as ``<vision_start> <image_pad> x n <vision_end>``. Every
token gets three ids (temporal, height, width). Text tokens, the start and end markers included, carry
one running position in all three. An image's pad tokens are its merged patches in row-major order
(t, h, w) over the grid ``(t, h / m, w / m)`` (``m`` the spatial merge size); each id is the running
position plus that patch's t, row or column. The running position then advances by
``max(h, w) / m``, which for an image (t = 1) is one past the largest id the image used.
"""

from __future__ import annotations

import numpy as np

from .vision_layout import merged_token_counts


def rope_index(token_ids: np.ndarray, image_grid_thw: np.ndarray, *, image_token_id: int,
               spatial_merge_size: int, start: int = 0) -> np.ndarray:
    """M-RoPE ids [3, T] (int32) of ``token_ids`` whose images have patch grids ``image_grid_thw`` [n, 3].

    ``start`` is the running position before the first token (0 for a whole prompt; the next position of
    the context when a segment is appended). Each maximal run of ``image_token_id`` is one image, in the
    order of ``image_grid_thw``, and must be exactly that image's token count (as transformers requires
    once the images are separated by their markers).
    """
    ids = np.asarray(token_ids).reshape(-1)
    grids = np.asarray(image_grid_thw, dtype=np.int64).reshape(-1, 3)
    counts = merged_token_counts(grids, spatial_merge_size) if len(grids) else np.zeros(0, np.int64)
    is_image = ids == image_token_id
    edges = np.flatnonzero(np.diff(np.concatenate(([0], is_image.astype(np.int8), [0]))))
    runs = edges.reshape(-1, 2)  # [first, end) of each run of image pad tokens
    if len(runs) != len(grids) or (runs[:, 1] - runs[:, 0] != counts).any():
        raise ValueError(f"the prompt's image pad runs have lengths {(runs[:, 1] - runs[:, 0]).tolist()}, the images "
                         f"in image_grid_thw need {counts.tolist()} tokens (one separated run per image)")
    out = np.empty((3, ids.size), dtype=np.int64)
    position, cursor = start, 0
    for (first, end), (t, h, w) in zip(runs, grids // (1, spatial_merge_size, spatial_merge_size)):
        out[:, cursor:first] = position + np.arange(first - cursor)
        position += first - cursor
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
        out[:, first:end] = position + np.stack((tt.ravel(), hh.ravel(), ww.ravel()))
        position += max(h, w)
        cursor = end
    out[:, cursor:] = position + np.arange(ids.size - cursor)
    return out.astype(np.int32)
