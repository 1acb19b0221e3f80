"""Proof against HuggingFace: our forward pass vs ``transformers``' Qwen2 on the same weights.

A Qwen2-VL / Qwen2.5-VL checkpoint is compared the same way on a prompt with images: deterministic random
images go through transformers' ``Qwen2VLImageProcessor`` into their model, and through our
``model/vl/preprocess.py`` into ours (our tower, our embedding of the prompt, our decoder with M-RoPE); the two
sets of pixel values are compared too.

torch and transformers are imported only here, and only when a parity check runs: the runtime
never needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from ..dependencies import missing
from ..model.arena import KVArena
from ..model.backend import Backend, ForwardResult
from ..model.backends import make_backend
from ..model.checkpoint import Checkpoint, load_checkpoint
from ..model.vl.config import VlConfig
from ..model.vl.preprocess import PREPROCESSOR_CONFIG, ImageProcessing, preprocess
from ..model.vl.prompt import embed_vl_prompt, expand_prompt
from ..model.vl.tower import make_vision_tower
from ..numerics.weight_formats import DEFAULT_INT4_GROUP


MIN_COSINE = {"numpy": 0.99999, "cuda": 0.999}
"""The worst cosine a backend must reach with weights held as stored: it differs from HF's only in rounding."""
ROUNDED_MIN_COSINE = {"bfloat16": 0.9999, "int8": 0.999, "int4": 0.99}
"""The bar when ``weights`` rounds the stored values: what each narrower format is allowed to lose."""


def pass_bar(report: "ParityReport") -> float:
    """The worst cosine ``report`` must reach: its backend's bar, lowered to its format's when that rounds."""
    bar = MIN_COSINE[report.backend]
    return min(bar, ROUNDED_MIN_COSINE[report.weights]) if report.rounded else bar


@dataclass
class Agreement:
    """How close two arrays are: cosine similarity and the largest absolute difference. Either side holding
    NaN or Inf is no agreement at all (cosine 0, no error figure), and the counts say which side it was."""

    cosine: float
    max_abs_error: float | None
    ours_nonfinite: int = 0  # values of ours that are NaN or Inf
    reference_nonfinite: int = 0  # the same of transformers'

    @classmethod
    def of(cls, ours: np.ndarray, reference: np.ndarray) -> "Agreement":
        a = np.asarray(ours, dtype=np.float64).ravel()
        b = np.asarray(reference, dtype=np.float64).ravel()
        bad_a, bad_b = int(a.size - np.isfinite(a).sum()), int(b.size - np.isfinite(b).sum())
        if bad_a or bad_b:
            return cls(0.0, None, bad_a, bad_b)
        denom = np.linalg.norm(a) * np.linalg.norm(b)
        cosine = float(a @ b / denom) if denom > 0 else float(np.array_equal(a, b))
        return cls(cosine, float(np.max(np.abs(a - b))) if a.size else 0.0)

    def nonfinite(self) -> str:
        """"" when both sides are finite, else which side holds how many NaN or Inf values."""
        sides = [f"{count:,} of ours" if who == "ours" else f"{count:,} of transformers'"
                 for who, count in (("ours", self.ours_nonfinite), ("reference", self.reference_nonfinite)) if count]
        return f"NOT FINITE ({' and '.join(sides)} values NaN or Inf)" if sides else ""


@dataclass
class ParityReport:
    model: str
    backend: str
    weights: str  # the format our decoder's matrices were held in (``reasoning.weights``, resolved)
    rounded: bool  # whether that format changed the stored weights' values (int8, int4, fp32 files as bf16)
    token_ids: list[int]
    logits: Agreement
    layers: list[Agreement]
    incremental: Agreement  # token by token (images: one segment each) with our cache vs our own full forward
    last_logits: np.ndarray = field(repr=False)
    image_grid_thw: list[list[int]] = field(default_factory=list)  # patch grid of each image (VL models)
    pixels: Agreement | None = None  # our preprocessing's pixel values vs transformers' (VL models with images)

    def agreements(self) -> dict[str, Agreement]:
        """Every comparison by its name in the printed report, in the order data flows through the model."""
        named = {"pixel values": self.pixels} if self.pixels is not None else {}
        last = len(self.layers) - 1
        named.update({"embeddings" if i == 0 else f"layer {i}" + (" (+norm)" if i == last else ""): layer
                      for i, layer in enumerate(self.layers)})
        named["logits"] = self.logits
        named["incremental vs full"] = self.incremental
        return named

    def nonfinite(self) -> list[str]:
        """The comparisons where either side held NaN or Inf, first to last: where a corrupt model goes bad."""
        return [f"{name}: {agreement.nonfinite()}" for name, agreement in self.agreements().items()
                if agreement.nonfinite()]

    def worst_cosine(self) -> float:
        pixels = [self.pixels.cosine] if self.pixels is not None else []
        return min([self.logits.cosine, self.incremental.cosine] + [layer.cosine for layer in self.layers] + pixels)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("last_logits")
        out["worst_cosine"] = self.worst_cosine()
        out["nonfinite"] = self.nonfinite()
        return out


def load_reference(model_dir: str | Path):
    """The HuggingFace model in fp32 on CPU (weights widened exactly from their storage dtype)."""
    import torch
    from transformers import Qwen2ForCausalLM
    from transformers.utils import logging

    # Our vision.* / action_head.* tensors are "unexpected" to HF's decoder by design: no report.
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    model = Qwen2ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return model.eval()


def reference_forward(model, token_ids: list[int], position_ids: list[int] | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """HF logits [T, V] and hidden states (embeddings, then each layer's output) for one sequence."""
    import torch

    ids = torch.tensor([token_ids], dtype=torch.long)
    kwargs = {}
    if position_ids is not None:
        # Explicit causal mask: otherwise transformers reads gaps in position_ids as packed sequences.
        count = len(token_ids)
        kwargs["position_ids"] = torch.tensor([position_ids], dtype=torch.long)
        kwargs["attention_mask"] = {"full_attention": torch.ones(count, count, dtype=torch.bool).tril()[None, None]}
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False, **kwargs)
    return out.logits[0].numpy(), [h[0].numpy() for h in out.hidden_states]


def run_parity(model_dir: str | Path, token_ids: Sequence[int | None], backend: str = "numpy", *,
               image_size: tuple[int, int] = (56, 56), seed: int = 0, allow_nonfinite: bool = False,
               weights: str = "auto", weights_group: int = DEFAULT_INT4_GROUP) -> ParityReport:
    """Compare logits and every layer's hidden state with HF, and incremental against full decoding.

    ``None`` entries of ``token_ids`` are images (a VL checkpoint only): each becomes vision start,
    its pad tokens and vision end, with a random ``image_size`` (height, width) RGB image from ``seed``.
    Weights holding NaN or Inf are refused (CheckpointError) unless ``allow_nonfinite``; then the report
    names the first layer whose output is not finite. ``weights`` holds our matrices in a narrower format
    (``reasoning.weights``), to measure what it costs against transformers' fp32 forward of the same files.
    """
    if not token_ids:
        raise ValueError("parity needs at least one token id")
    try:  # the reference, before any work
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ModuleNotFoundError:
        raise missing("parity", "the reference forward pass") from None
    checkpoint = load_checkpoint(model_dir, require_vla=False, allow_nonfinite=allow_nonfinite, weights=weights,
                                 weights_group=weights_group)
    if checkpoint.config.vl is not None:
        return _vl_parity(checkpoint, token_ids, backend, image_size, seed)
    if any(token is None for token in token_ids):
        raise ValueError(f"{model_dir} is a text-only Qwen2 checkpoint: the prompt's image slots need a VL one")
    ids = np.asarray(token_ids)
    positions = np.arange(ids.size, dtype=np.int32)

    def feed(ours: Backend, part: slice, collect_layers: bool = False) -> ForwardResult:
        return ours.forward(positions[part], positions[part], token_ids=ids[part], collect_layers=collect_layers)

    ref_logits, ref_hidden = reference_forward(load_reference(model_dir), list(token_ids))
    return _report(checkpoint, backend, ids, feed, [slice(i, i + 1) for i in range(ids.size)], ref_logits, ref_hidden)


Feed = Callable[..., ForwardResult]
"""(backend, a slice of the prompt, collect_layers=) -> that slice's forward at its sequence positions."""


def _report(checkpoint: Checkpoint, backend: str, ids: np.ndarray, feed: Feed, segments: list[slice],
            ref_logits: np.ndarray, ref_hidden: list[np.ndarray]) -> ParityReport:
    """Our full forward against HF's, and ``segments`` fed one by one into a fresh arena against our full one."""
    count = ids.size
    full = make_backend(backend, checkpoint, KVArena(count))
    result = feed(full, slice(0, count), collect_layers=True)
    logits = full.logits(result.hidden)
    incremental = make_backend(backend, checkpoint, KVArena(count))
    step_logits = incremental.logits(np.concatenate([feed(incremental, part).hidden for part in segments]))
    ours_hidden = result.layer_hidden[:-1] + [result.hidden]  # HF reports the last layer after the final norm
    return ParityReport(
        model=str(checkpoint.path),
        backend=full.name,
        weights=checkpoint.weights if checkpoint.weights != "auto" else checkpoint.format_of("model.embed_tokens.weight"),
        rounded=checkpoint.rounds("model.embed_tokens.weight"),
        token_ids=ids.tolist(),
        logits=Agreement.of(logits, ref_logits),
        layers=[Agreement.of(a, b) for a, b in zip(ours_hidden, ref_hidden)],
        incremental=Agreement.of(step_logits, logits),
        last_logits=logits[-1].astype(np.float32),
    )


def synthetic_images(count: int, size: tuple[int, int], seed: int) -> list[np.ndarray]:
    """``count`` random RGB images [height, width, 3] uint8, the same for the same ``seed``."""
    height, width = size
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(count)]


def processor_inputs(model_dir: Path, vl: VlConfig, images: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(pixel_values [patches, patch_dim] fp32, image_grid_thw [n, 3]) of ``images`` from transformers'
    ``Qwen2VLImageProcessor``: the checkpoint's preprocessor_config.json if it has one, else HF's defaults
    with the tower's patch geometry."""
    from transformers.utils import logging

    logging.set_verbosity_error()  # without torchvision HF falls back to its PIL processor, and says so
    from transformers import Qwen2VLImageProcessor

    tower = vl.vision
    geometry = {"patch_size": tower.patch_size, "temporal_patch_size": tower.temporal_patch_size,
                "merge_size": tower.spatial_merge_size}
    if not (model_dir / PREPROCESSOR_CONFIG).is_file():
        processor = Qwen2VLImageProcessor(**geometry)
    else:
        processor = Qwen2VLImageProcessor.from_pretrained(str(model_dir))
        for key, want in geometry.items():
            if getattr(processor, key) != want:
                raise ValueError(f"{model_dir}: preprocessor_config.json {key} {getattr(processor, key)} does not "
                                 f"match the vision tower's {want}")
    out = processor(images=images, return_tensors="np")
    return np.asarray(out["pixel_values"], dtype=np.float32), np.asarray(out["image_grid_thw"], dtype=np.int64)


def load_vl_reference(model_dir: str | Path, family: str):
    """HF's Qwen2-VL or Qwen2.5-VL model in fp32 on CPU."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    model_class = {"qwen2_vl": Qwen2VLForConditionalGeneration,
                   "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration}[family]
    return model_class.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def reference_vl_forward(model, token_ids: np.ndarray, pixel_values: np.ndarray,
                         image_grid_thw: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """HF logits [T, V] and the decoder's hidden states for one prompt with images (HF places the M-RoPE ids)."""
    import torch

    ids = torch.tensor(np.asarray(token_ids, dtype=np.int64)[None])
    images = {}
    if len(image_grid_thw):
        images = dict(pixel_values=torch.from_numpy(pixel_values), image_grid_thw=torch.from_numpy(image_grid_thw))
    with torch.no_grad():
        out = model(input_ids=ids, mm_token_type_ids=(ids == model.config.image_token_id).int(),
                    output_hidden_states=True, use_cache=False, **images)
    return out.logits[0].numpy(), [h[0].numpy() for h in out.hidden_states]


def our_image_inputs(model_dir: Path, vl: VlConfig, images: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(pixel_values, image_grid_thw) of ``images`` from our ``vl/preprocess.py``, with the checkpoint's
    preprocessor_config.json, or transformers' defaults with the tower's patch geometry when it has none."""
    tower = vl.vision
    processing = ImageProcessing.load(model_dir) if (model_dir / PREPROCESSOR_CONFIG).is_file() else \
        ImageProcessing(patch_size=tower.patch_size, temporal_patch_size=tower.temporal_patch_size,
                        merge_size=tower.spatial_merge_size)
    frames = [preprocess(image, processing) for image in images]
    return np.concatenate([patches for patches, _ in frames]), np.array([grid for _, grid in frames], dtype=np.int64)


def _vl_parity(checkpoint: Checkpoint, prompt: Sequence[int | None], backend: str, image_size: tuple[int, int],
               seed: int) -> ParityReport:
    vl = checkpoint.config.vl
    images = synthetic_images(sum(token is None for token in prompt), image_size, seed)
    pixel_values, grids = np.zeros((0, vl.vision.patch_dim), np.float32), np.zeros((0, 3), np.int64)
    ref_pixels, pixels = pixel_values, None
    if images:
        ref_pixels, ref_grids = processor_inputs(checkpoint.path, vl, images)
        pixel_values, grids = our_image_inputs(checkpoint.path, vl, images)
        if not np.array_equal(grids, ref_grids):
            raise RuntimeError(f"our preprocessing cuts the images into grids {grids.tolist()}, transformers' into "
                               f"{ref_grids.tolist()}: the two models would not see the same image")
        pixels = Agreement.of(pixel_values, ref_pixels)
    ids = expand_prompt(prompt, grids, vl)
    inputs = embed_vl_prompt(checkpoint, make_vision_tower(backend, checkpoint).encode, ids, pixel_values, grids)
    positions = np.arange(ids.size, dtype=np.int32)

    def feed(ours: Backend, part: slice, collect_layers: bool = False) -> ForwardResult:
        return ours.forward(positions[part], positions[part], embeddings=inputs.embeddings[part],
                            rope_positions=inputs.rope_positions[:, part], collect_layers=collect_layers)

    reference = load_vl_reference(checkpoint.path, vl.family)
    ref_logits, ref_hidden = reference_vl_forward(reference, ids, ref_pixels, grids)
    report = _report(checkpoint, backend, ids, feed, inputs.segments(vl.image_token_id), ref_logits, ref_hidden)
    return replace(report, image_grid_thw=grids.tolist(), pixels=pixels)
