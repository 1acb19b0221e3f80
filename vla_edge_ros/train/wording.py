"""Each training sequence's instruction: words a user might say, turned into prompt ids as the runtime does.

A phase with ``TrainSpec.instructions`` words every episode with one of its templates, drawn from the
episode's own seed: ``lang-reach`` names the goal's colour, the other tasks a colour drawn at random (their
targets all look alike, so the words say nothing there and the model learns to go by the ring). The text is
chat-templated and tokenized by the checkpoint's own tokenizer (``model/instruction.py``), the one the
runtime reads, so training sees exactly the ids a robot's instruction becomes. Without templates every
sequence starts with the phase's fixed ``prompt_ids``, as the first checkpoints were trained.

The tokenizer is a byte-level BPE trained on the templates with every colour filled in (``corpus``), so a
phrasing it never saw still tokenizes; a phase that starts from a checkpoint with a tokenizer keeps that one
(its token ids are what the embeddings learned). Meta-World's instruction is always in words: each task's
description (``arm_corpus`` trains the tokenizer on all fifty), worded by ``Wording.spoken``, as ``vla-edge
evaluate`` sets it as ``reasoning.instruction``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..model.instruction import InstructionTokenizer
from ..worlds.metaworld.tasks import DESCRIPTIONS
from ..worlds.sim import render
from ..worlds.sim.world import CueReachEnv

DEFAULT_PROMPT = (151, 9, 402, 77, 1030, 12)  # the default config's instruction tokens, before words
FIELD = "{color}"  # where a template's goal colour goes (tools/lang_reach.py's format)
MAX_TOKENS = 64  # reasoning.instruction_max_tokens' default: a template longer than that is refused


CHAT_ROLES = ("system", "user", "assistant")  # the words the chat template writes around an instruction


def corpus(templates: Sequence[str]) -> list[str]:
    """The texts the tokenizer is trained on: every template with every colour, and the chat template's role
    names (otherwise spelled out letter by letter in every prompt)."""
    return [*CHAT_ROLES, *(template.replace(FIELD, colour) for template in templates for colour in render.COLOUR_NAMES)]


def arm_corpus() -> list[str]:
    """What a Meta-World policy's tokenizer is trained on: every task's description (all 50, so the ids of a task
    outside the phase's are whole words too), and the chat template's role names."""
    return [*CHAT_ROLES, *DESCRIPTIONS.values()]


@dataclass(frozen=True)
class Wording:
    """Turns an episode into the prompt ids its sequences start with."""

    templates: tuple[str, ...]  # with FIELD once each; empty: every prompt is ``fixed``
    fixed: tuple[int, ...]
    tokenizer: InstructionTokenizer | None = None

    def __post_init__(self) -> None:
        if self.templates and self.tokenizer is None:
            raise ValueError("instructions in words need the checkpoint's tokenizer")
        for template in self.templates:
            if template.count(FIELD) != 1:
                raise ValueError(f"instructions: each template holds {FIELD} once, got {template!r}")
            for colour in render.COLOUR_NAMES:  # an InstructionError (too long, not text) now, not mid-training
                self.tokenizer.prompt_ids(template.replace(FIELD, colour), MAX_TOKENS)

    def instruction(self, env: CueReachEnv, rng: np.random.Generator) -> str:
        """The words for ``env``'s episode ("" with a fixed prompt)."""
        if not self.templates:
            return ""
        template = self.templates[int(rng.integers(len(self.templates)))]
        colour = (env.goal_colour if env.spec.name == "lang-reach"
                  else render.COLOUR_NAMES[int(rng.integers(len(render.COLOUR_NAMES)))])
        return template.replace(FIELD, colour)

    def prompt(self, instruction: str) -> tuple[int, ...]:
        """The prompt ids of ``instruction`` (of ``instruction``'s episode)."""
        if not self.templates:
            return self.fixed
        return self.spoken(instruction)

    def spoken(self, text: str) -> tuple[int, ...]:
        """The prompt ids of ``text`` as the runtime makes them of ``reasoning.instruction``: chat-templated and
        tokenized by the checkpoint's tokenizer (Meta-World's instruction, a task's description, always is)."""
        if self.tokenizer is None:
            raise ValueError("an instruction in words needs the checkpoint's tokenizer")
        return tuple(int(i) for i in self.tokenizer.prompt_ids(text, MAX_TOKENS))


FIXED = Wording((), DEFAULT_PROMPT)  # the first checkpoints' wording: the same ids before every sequence
