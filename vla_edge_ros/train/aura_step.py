"""One observation of the aura policy in torch: what ``memory/aura.py`` does in the engine for one frame.

``aura_frame`` reads the memory, runs the decoder over prompt + memory token + observation, then writes;
``stages.aura_unroll`` strings it over an episode's frames, so the decoder is trained through time as the
engine runs it. (The aura stage's DAgger episodes are driven by the engine itself: ``tools/policy_rollouts.py``.)
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .torch_model import FastWeightState, Prompts, VlaModel


class AuraPass(NamedTuple):
    hidden: torch.Tensor   # [B, (F,) H] final-norm hidden state at each frame's last token
    writes: torch.Tensor   # [B, (F)] write decisions
    logits: torch.Tensor   # [B, (F)] the gate's logits
    memory: torch.Tensor   # [B, (F,) H] the memory token each frame read


def aura_frame(model: VlaModel, prompt: torch.Tensor, prompts: Prompts, state: FastWeightState, tokens: torch.Tensor,
               beta: float, forced: torch.Tensor | None = None) -> tuple[FastWeightState, AuraPass]:
    """One observation of the aura policy for a batch: the embeddings [B, P, H] of ``prompts`` and the
    observation's tokens [B, T, H] -> (the fast weights after its write, its ``AuraPass`` row); ``forced`` [B]
    replaces the gate's decisions where given."""
    read = model.aura.read(state, tokens)
    out, _ = model.model(torch.cat([prompt, read[:, None], tokens], dim=1), prompts=prompts)
    state, write, logit = model.aura.write(state, out[:, -1], beta, forced)
    return state, AuraPass(out[:, -1], write, logit, read)
