"""Qwen2-VL / Qwen2.5-VL end to end against transformers: the decoder with M-RoPE, the composed VL forward
(tower, prompt embedding, decoder) and ``vla-edge parity`` on VL checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_vl_models import write_hf_vl_model, write_legacy_layout, write_module_key_layout  # noqa: E402
from vla_edge_ros.cli import main  # noqa: E402
from vla_edge_ros.model.arena import KVArena  # noqa: E402
from vla_edge_ros.model.backends import make_backend  # noqa: E402
from vla_edge_ros.model.checkpoint import load_checkpoint  # noqa: E402
from vla_edge_ros.model.vl.positions import rope_index  # noqa: E402
from vla_edge_ros.model.vl.prompt import embed_vl_prompt, expand_prompt  # noqa: E402
from vla_edge_ros.model.vl.vision import VisionTower  # noqa: E402
from vla_edge_ros.tools.parity import (Agreement, load_vl_reference, processor_inputs, run_parity,  # noqa: E402
                                       synthetic_images)

MIN_COSINE = 0.99999
SMALL = {"qwen2_vl": "qwen2_vl_tiny", "qwen2_5_vl": "qwen2_5_vl_tiny"}
PROMPT = [7, 17, 9]  # clear of the vision tokens 3, 4, 5
ONE_IMAGE = PROMPT + [None] + [11, 6]
THREE_FRAMES = PROMPT + [None, None, None]


def _write_processor(model_dir, tokens: tuple[int, int]) -> None:
    """A preprocessor_config.json bounding each image to ``tokens`` (min, max) decoder tokens, as real
    checkpoints ship one (the tiny towers' patches are 2-4 px: HF's defaults would give hundreds)."""
    from transformers import Qwen2VLImageProcessor

    tower = load_checkpoint(model_dir, require_vla=False).config.vl.vision
    token_pixels = (tower.patch_size * tower.spatial_merge_size) ** 2
    Qwen2VLImageProcessor(patch_size=tower.patch_size, temporal_patch_size=tower.temporal_patch_size,
                          merge_size=tower.spatial_merge_size, min_pixels=tokens[0] * token_pixels,
                          max_pixels=tokens[1] * token_pixels).save_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def vl_models(tmp_path_factory):
    """Writes each VL variant once, on first use; the tiny ones with 4 to 12 tokens per image."""
    written: dict[str, object] = {}

    def get(variant: str):
        if variant not in written:
            written[variant] = write_hf_vl_model(tmp_path_factory.mktemp(variant), variant)
            if variant in SMALL.values():
                _write_processor(written[variant], (4, 12))
        return written[variant]
    return get


def _mixed_prompt(checkpoint, grids: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids with text around and between the images' pad runs, and their M-RoPE ids."""
    vl = checkpoint.config.vl
    merge = vl.vision.spatial_merge_size
    ids = [7, 8]
    for t, h, w in grids:
        pads = [vl.image_token_id] * (t * h * w // merge ** 2)
        ids += [vl.vision_start_token_id] + pads + [vl.vision_end_token_id, 9]
    ids = np.asarray(ids)
    return ids, rope_index(ids, np.asarray(grids), image_token_id=vl.image_token_id, spatial_merge_size=merge)


@pytest.mark.parametrize("family", sorted(SMALL))
def test_decoder_with_mrope_matches_the_hf_language_model(vl_models, family):
    """Our decoder alone (random embeddings in) against HF's text model fed the same 3-D position ids."""
    model_dir = vl_models(SMALL[family])
    checkpoint = load_checkpoint(model_dir, require_vla=False)
    ids, rope = _mixed_prompt(checkpoint, [(1, 4, 6), (1, 6, 2)])
    embeddings = np.random.default_rng(1).standard_normal((ids.size, checkpoint.config.hidden_size)).astype(np.float32)
    positions = np.arange(ids.size, dtype=np.int32)
    backend = make_backend("numpy", checkpoint, KVArena(ids.size))
    ours = backend.logits(backend.forward(positions, positions, embeddings=embeddings, rope_positions=rope).hidden)
    model = load_vl_reference(model_dir, family)
    with torch.no_grad():
        out = model.model.language_model(inputs_embeds=torch.from_numpy(embeddings)[None],
                                         position_ids=torch.from_numpy(rope.astype(np.int64))[:, None], use_cache=False)
        reference = model.lm_head(out.last_hidden_state)[0].numpy()
    assert Agreement.of(ours, reference).cosine >= MIN_COSINE
    one_d = make_backend("numpy", checkpoint, KVArena(ids.size))
    flat = one_d.logits(one_d.forward(positions, positions, embeddings=embeddings).hidden)
    assert Agreement.of(flat[-1], reference[-1]).cosine < MIN_COSINE  # the 3-D ids mattered


def test_equal_mrope_ids_rotate_exactly_as_1d_rope(vl_models):
    checkpoint = load_checkpoint(vl_models(SMALL["qwen2_vl"]), require_vla=False)
    ids = np.array([3, 9, 14, 2])
    positions = np.array([0, 1, 5, 6], dtype=np.int32)
    results = []
    for rope in (None, np.stack([positions] * 3)):
        backend = make_backend("numpy", checkpoint, KVArena(8))
        hidden = backend.forward(positions, np.arange(4, dtype=np.int32), token_ids=ids, rope_positions=rope).hidden
        results.append((hidden, *backend.read_kv(np.arange(4, dtype=np.int32))))
    for one_d, mrope in zip(*results):
        np.testing.assert_array_equal(one_d, mrope)


@pytest.mark.parametrize("family", sorted(SMALL))
def test_rerotated_mrope_key_equals_key_computed_at_ids_shifted_alike(vl_models, family):
    """A key at (t, h, w) rotated by delta (the arena's re-numbering) is the key computed at (t, h, w) + delta."""
    checkpoint = load_checkpoint(vl_models(SMALL[family]), require_vla=False)
    token, slot, delta = np.array([7]), np.array([0], dtype=np.int32), 23
    ids = np.array([[5], [9], [2]], dtype=np.int32)  # an image token: the three ids differ
    moved, direct = (make_backend("numpy", checkpoint, KVArena(4)) for _ in range(2))
    moved.forward(np.array([3]), slot, token_ids=token, rope_positions=ids)
    moved.rotate_keys(slot, np.array([delta]))
    direct.forward(np.array([3]), slot, token_ids=token, rope_positions=ids + delta)
    (moved_k, moved_v), (direct_k, direct_v) = moved.read_kv(slot), direct.read_kv(slot)
    np.testing.assert_allclose(moved_k, direct_k, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(moved_v, direct_v)
    unmoved = make_backend("numpy", checkpoint, KVArena(4))
    unmoved.forward(np.array([3]), slot, token_ids=token, rope_positions=ids)
    assert np.abs(unmoved.read_kv(slot)[0] - direct_k).max() > 1e-2  # the rotation did move it


def test_rope_positions_are_refused_on_a_text_model_and_in_a_wrong_shape(vl_models, tiny_model):
    text = make_backend("numpy", load_checkpoint(tiny_model), KVArena(4))
    with pytest.raises(ValueError, match="no M-RoPE"):
        text.forward(np.array([0]), np.array([0]), token_ids=np.array([1]), rope_positions=np.zeros((3, 1), int))
    vl = make_backend("numpy", load_checkpoint(vl_models(SMALL["qwen2_vl"]), require_vla=False), KVArena(4))
    with pytest.raises(ValueError, match=r"integer \[3, 2\]"):
        vl.forward(np.array([0, 1]), np.array([0, 1]), token_ids=np.array([1, 2]), rope_positions=np.zeros((2, 2), int))


def _assert_parity(report, layers: int) -> None:
    assert report.pixels.max_abs_error == 0.0  # our preprocessing is transformers' PIL path, bit for bit
    assert report.logits.cosine >= MIN_COSINE, report.logits
    assert len(report.layers) == layers + 1
    for index, layer in enumerate(report.layers):
        assert layer.cosine >= MIN_COSINE, (index, layer)
    assert report.incremental.cosine >= MIN_COSINE and report.incremental.max_abs_error < 1e-3


@pytest.mark.parametrize("family", sorted(SMALL))
@pytest.mark.parametrize("prompt, images", [(ONE_IMAGE, 1), (THREE_FRAMES, 3)], ids=["one_image", "three_frames"])
def test_vl_forward_matches_transformers(vl_models, family, prompt, images):
    model_dir = vl_models(SMALL[family])
    config = load_checkpoint(model_dir, require_vla=False).config
    report = run_parity(model_dir, prompt, image_size=(56, 84))
    grids = np.asarray(report.image_grid_thw)
    assert grids.shape == (images, 3) and (grids[:, 1] != grids[:, 2]).all()  # not square: h and w ids differ
    merged = grids.prod(axis=1) // config.vl.vision.spatial_merge_size ** 2
    assert report.token_ids.count(config.vl.image_token_id) == merged.sum() >= 4 * images
    _assert_parity(report, config.num_hidden_layers)


def test_text_between_images_of_an_odd_size_matches_transformers(vl_models):
    model_dir = vl_models(SMALL["qwen2_5_vl"])
    report = run_parity(model_dir, [7, None, 8, 9, 10, None, 11], image_size=(30, 110), seed=4)
    assert len(report.image_grid_thw) == 2
    _assert_parity(report, 2)


@pytest.mark.parametrize("layout", [write_legacy_layout, write_module_key_layout], ids=["hub_flat", "module_keys"])
def test_other_checkpoint_layouts_match_transformers(vl_models, tmp_path, layout):
    """The hub's flat config (rope_scaling mrope) and transformers 4.52-4.57's tensor keys run the same."""
    model_dir = layout(vl_models(SMALL["qwen2_vl"]), tmp_path / "copy")
    _assert_parity(run_parity(model_dir, ONE_IMAGE, image_size=(28, 28)), 2)


def test_token_by_token_into_scattered_slots_equals_the_full_forward(vl_models):
    """Every token alone (image pads too), into slots out of sequence order: masking reads positions, the
    rotation the M-RoPE ids, so the arena's layout does not matter."""
    model_dir = vl_models(SMALL["qwen2_vl"])
    checkpoint = load_checkpoint(model_dir, require_vla=False)
    vl = checkpoint.config.vl
    pixel_values, grids = processor_inputs(model_dir, vl, synthetic_images(2, (56, 84), seed=2))
    ids = expand_prompt([7, None, 8, None, 9], grids, vl)
    prompt = embed_vl_prompt(checkpoint, VisionTower.from_checkpoint(checkpoint).encode, ids, pixel_values, grids)
    count = ids.size
    positions = np.arange(count, dtype=np.int32)
    full = make_backend("numpy", checkpoint, KVArena(count))
    whole = full.logits(full.forward(positions, positions, embeddings=prompt.embeddings,
                                     rope_positions=prompt.rope_positions).hidden)
    slots = np.random.default_rng(0).permutation(count).astype(np.int32)
    steps = make_backend("numpy", checkpoint, KVArena(count))
    hidden = [steps.forward(positions[i:i + 1], slots[i:i + 1], embeddings=prompt.embeddings[i:i + 1],
                            rope_positions=prompt.rope_positions[:, i:i + 1]).hidden for i in range(count)]
    np.testing.assert_allclose(steps.logits(np.concatenate(hidden)), whole, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("prompt", [ONE_IMAGE, THREE_FRAMES], ids=["one_image", "three_frames"])
def test_qwen2_vl_2b_slice_matches_transformers(vl_models, prompt):
    """Qwen2-VL-2B's real widths (1280-wide ViT, 1536-wide decoder), two blocks of each."""
    model_dir = vl_models("qwen2_vl_2b_slice")
    _assert_parity(run_parity(model_dir, prompt, image_size=(56, 56)), 2)


def test_parity_command_on_a_vl_checkpoint(vl_models, capsys):
    model_dir = vl_models(SMALL["qwen2_vl"])
    assert main(["parity", "--model", str(model_dir), "--token-ids", "7,img,img,8", "--image-size", "56x84"]) == 0
    out = capsys.readouterr().out
    assert "2 images (t x h x w patches: 1x4x8, 1x4x8)" in out and "PASS" in out  # 56x84 scaled to 16x32 px
    assert out.count("cosine 0.99999") + out.count("cosine 1.0000") >= 4  # logits, layers, incremental


def test_parity_command_refuses_a_bad_vl_prompt_in_one_line(vl_models, capsys):
    assert main(["parity", "--model", str(vl_models(SMALL["qwen2_vl"])), "--token-ids", "7,img,99999"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "token ids in [0, 320)" in err


def test_a_bad_image_size_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        main(["parity", "--model", "x", "--token-ids", "7,img", "--image-size", "0x28"])
    assert "HEIGHTxWIDTH" in capsys.readouterr().err


def test_image_slots_on_a_text_checkpoint_exit_2_in_one_line(tiny_model, capsys):
    assert main(["parity", "--model", str(tiny_model), "--token-ids", "1,img"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "image slots need a VL one" in err


def test_a_preprocessor_config_with_another_patch_geometry_is_refused(vl_models, tmp_path):
    from hf_vl_models import copy_model
    from transformers import Qwen2VLImageProcessor

    model_dir = copy_model(vl_models(SMALL["qwen2_vl"]), tmp_path / "copy")
    Qwen2VLImageProcessor(patch_size=14, temporal_patch_size=2, merge_size=2).save_pretrained(str(model_dir))
    with pytest.raises(ValueError, match="patch_size 14 does not match the vision tower's 4"):
        run_parity(model_dir, ONE_IMAGE)
