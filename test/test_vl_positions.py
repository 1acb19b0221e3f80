"""M-RoPE ids of VL prompts against transformers' own ``get_rope_index`` (Qwen2-VL and Qwen2.5-VL)."""

from __future__ import annotations

import numpy as np
import pytest

from vla_edge_ros.model.vl.positions import rope_index
from vla_edge_ros.model.vl.vision_layout import merged_token_counts

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

IMAGE, START, END = 60, 58, 59


def _hf_model(family: str, merge: int):
    """A tiny VL model of ``family``: only its config matters to ``get_rope_index``."""
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    text = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                vocab_size=64, bos_token_id=None, eos_token_id=None,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]})
    vision = dict(depth=1, hidden_size=16, num_heads=2, spatial_merge_size=merge, out_hidden_size=16,
                  intermediate_size=16, embed_dim=16)
    config_class, model_class = {"qwen2_vl": (Qwen2VLConfig, Qwen2VLModel),
                                 "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLModel)}[family]
    config = config_class(text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=61,
                          vision_start_token_id=START, vision_end_token_id=END)
    return model_class(config)


def _prompt(pieces: list, grids: list[tuple[int, int, int]], merge: int) -> list[int]:
    """Text ids, with each ``None`` replaced by the next image: start, its pad tokens, end."""
    counts = iter(merged_token_counts(np.array(grids), merge))
    ids: list[int] = []
    for piece in pieces:
        ids += [START] + [IMAGE] * int(next(counts)) + [END] if piece is None else list(piece)
    return ids


LAYOUTS = {
    "prompt_then_one_image": ([[1, 2, 3], None, [4, 5]], [(1, 4, 6)]),
    "three_camera_frames": ([[7, 8], None, None, None, [9]], [(1, 4, 4), (1, 4, 4), (1, 4, 4)]),
    "text_between_images": ([[1], None, [2, 3, 4, 5], None, [6, 7, 8]], [(1, 2, 8), (1, 6, 2)]),
    "odd_grids": ([[3, 4], None, [5], None, [6]], [(1, 6, 10), (1, 14, 2)]),
    "image_first_and_last": ([None, [1, 2], None], [(1, 2, 2), (1, 10, 4)]),
    "two_frame_grid": ([[1], None, [2]], [(2, 4, 6)]),
}


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
@pytest.mark.parametrize("merge", [2, 1])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_rope_index_equals_transformers(family, merge, layout):
    pieces, grids = LAYOUTS[layout]
    ids = _prompt(pieces, grids, merge)
    input_ids = torch.tensor([ids])
    expected, _ = _hf_model(family, merge).get_rope_index(
        input_ids, mm_token_type_ids=(input_ids == IMAGE).int(), image_grid_thw=torch.tensor(grids))
    ours = rope_index(np.array(ids), np.array(grids), image_token_id=IMAGE, spatial_merge_size=merge)
    assert ours.dtype == np.int32 and ours.shape == (3, len(ids))
    np.testing.assert_array_equal(ours, expected[:, 0].numpy())


def test_text_after_an_image_starts_one_past_its_largest_id():
    grids = [(1, 6, 10)]
    ids = _prompt([[1, 2], None, [3]], grids, 2)
    ours = rope_index(np.array(ids), np.array(grids), image_token_id=IMAGE, spatial_merge_size=2)
    end_marker = len(ids) - 2
    assert ours[:, end_marker].tolist() == [ours[:, :end_marker].max() + 1] * 3
    assert ours[:, -1].tolist() == [ours[0, end_marker] + 1] * 3


def test_a_segment_from_its_start_position_equals_that_part_of_the_whole_prompt():
    """Appending frames one at a time (the runtime's segments) places them as the whole prompt does."""
    pieces, grids = LAYOUTS["three_camera_frames"]
    ids = np.array(_prompt(pieces, grids, 2))
    whole = rope_index(ids, np.array(grids), image_token_id=IMAGE, spatial_merge_size=2)
    cut = len(_prompt(pieces[:3], grids[:2], 2))
    tail = rope_index(ids[cut:], np.array(grids[2:]), image_token_id=IMAGE, spatial_merge_size=2,
                      start=int(whole[:, :cut].max()) + 1)
    np.testing.assert_array_equal(tail, whole[:, cut:])


@pytest.mark.parametrize("ids, grids, message", [
    ([1, START] + [IMAGE] * 5 + [END], [(1, 4, 4)], "need \\[4\\] tokens"),
    ([1, START] + [IMAGE] * 4 + [END], [(1, 4, 4), (1, 2, 2)], "one separated run per image"),
    ([START] + [IMAGE] * 8 + [END], [(1, 4, 4), (1, 4, 4)], "one separated run per image"),
    ([START] + [IMAGE] * 3 + [END], [(1, 3, 4)], "multiples of the spatial merge size 2"),
    ([1], [(0, 2, 2)], "must be positive"),
])
def test_image_pads_that_do_not_match_the_grids_are_refused(ids, grids, message):
    with pytest.raises(ValueError, match=message):
        rope_index(np.array(ids), np.array(grids), image_token_id=IMAGE, spatial_merge_size=2)
