"""Proof against HuggingFace: our forward pass vs ``transformers``' Qwen2 on the same weights.

torch and transformers are imported only here, and only when a parity check runs: the runtime
never needs them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..model.arena import KVArena
from ..model.backends import make_backend
from ..model.checkpoint import load_checkpoint


@dataclass
class Agreement:
    """How close two arrays are: cosine similarity and the largest absolute difference."""

    cosine: float
    max_abs_error: float

    @classmethod
    def of(cls, ours: np.ndarray, reference: np.ndarray) -> "Agreement":
        a = np.asarray(ours, dtype=np.float64).ravel()
        b = np.asarray(reference, dtype=np.float64).ravel()
        denom = np.linalg.norm(a) * np.linalg.norm(b)
        cosine = float(a @ b / denom) if denom > 0 else float(np.array_equal(a, b))
        return cls(cosine, float(np.max(np.abs(a - b))) if a.size else 0.0)


@dataclass
class ParityReport:
    model: str
    backend: str
    token_ids: list[int]
    logits: Agreement
    layers: list[Agreement]
    incremental: Agreement  # token-by-token decode with our cache vs our own full forward
    last_logits: np.ndarray = field(repr=False)

    def worst_cosine(self) -> float:
        return min([self.logits.cosine, self.incremental.cosine] + [layer.cosine for layer in self.layers])

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("last_logits")
        out["worst_cosine"] = self.worst_cosine()
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


def run_parity(model_dir: str | Path, token_ids: list[int], backend: str = "numpy") -> ParityReport:
    """Compare logits and every layer's hidden state with HF, and incremental against full decoding."""
    if not token_ids:
        raise ValueError("parity needs at least one token id")
    checkpoint = load_checkpoint(model_dir, require_vla=False)
    count = len(token_ids)
    positions = np.arange(count, dtype=np.int32)

    full = make_backend(backend, checkpoint, KVArena(count))
    result = full.forward(positions, positions, token_ids=np.asarray(token_ids), collect_layers=True)
    logits = full.logits(result.hidden)

    incremental = make_backend(backend, checkpoint, KVArena(count))
    steps = [incremental.forward(positions[i:i + 1], positions[i:i + 1], token_ids=np.asarray(token_ids[i:i + 1])).hidden
             for i in range(count)]
    step_logits = incremental.logits(np.concatenate(steps))

    ref_logits, ref_hidden = reference_forward(load_reference(model_dir), token_ids)
    ours_hidden = result.layer_hidden[:-1] + [result.hidden]  # HF reports the last layer after the final norm
    return ParityReport(
        model=str(model_dir),
        backend=full.name,
        token_ids=list(token_ids),
        logits=Agreement.of(logits, ref_logits),
        layers=[Agreement.of(a, b) for a, b in zip(ours_hidden, ref_hidden)],
        incremental=Agreement.of(step_logits, logits),
        last_logits=logits[-1].astype(np.float32),
    )
