"""Language in the closed loop: lang-reach episodes told their goal in words, and probes that show whether
the instruction is read.

``vla-edge evaluate --task lang-reach --instructions FILE``: FILE holds one instruction template a line with
``{color}`` where the goal's colour goes (``please drive to the {color} target``); blank lines and lines
starting with ``#`` are skipped. Each episode's template is drawn from its seed, so the same seeds word the
same instructions. A template file written for evaluation must not be one the model was trained on:
success on phrasings it never saw is what tells reading from memorising.

Per seed, as cue-reach has its cue swap, three probes (``PROBES``) run on the same layout and noise:

- ``episode``: the instruction names the goal's colour; success is counted per colour;
- ``blind``: the chat template around an empty user turn, nothing saying which target: a policy that reads
  its instruction falls to chance, 1 / targets;
- ``switch``: at a moment drawn from the seed, within the first half of the time limit, the goal becomes
  another target and its instruction is applied as a live one is (``Reasoner.retask``, under
  ``kv.on_instruction``); success is reaching the new goal.

The scripted expert runs the three too; it knows the goal, so its blind row is not chance: it checks the
probe, not a policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model.checkpoint import Checkpoint
from ..model.instruction import InstructionError, InstructionTokenizer
from ..runtime.loader import checkpoint_tokenizer
from ..worlds.sim.world import CueReachEnv

PROBES = ("episode", "blind", "switch")
MAX_FILE_BYTES = 1 << 20
MAX_TEMPLATES = 10_000
FIELD = "{color}"


def read_templates(path: Path) -> tuple[str, ...]:
    """The templates of an instruction file; ValueError naming the file and line of the first bad one."""
    try:
        if not path.is_file():
            raise ValueError(f"{path}: not a regular file")
        data = path.read_bytes()[:MAX_FILE_BYTES + 1]
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: larger than {MAX_FILE_BYTES:,} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text: {exc}") from None
    templates = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.count(FIELD) != 1 or line.replace(FIELD, "").count("{") or line.replace(FIELD, "").count("}"):
            raise ValueError(f"{path}:{number}: a template holds {FIELD} exactly once and no other braces, "
                             f"got {line[:80]!r}")
        templates.append(line)
    if not templates:
        raise ValueError(f"{path}: no templates (one a line, with {FIELD})")
    if len(templates) > MAX_TEMPLATES:
        raise ValueError(f"{path}: {len(templates):,} templates, at most {MAX_TEMPLATES:,}")
    return tuple(templates)


def instruction_of(templates: tuple[str, ...], env: CueReachEnv, seed: int) -> str:
    """Episode ``seed``'s instruction: its template, drawn from the seed, with the goal's colour filled in (the
    same draw in ``vla-edge evaluate`` and in the simulated robot of ``vla-edge run --sim lang-reach``)."""
    template = templates[int(np.random.default_rng([seed, 0x1A46]).integers(len(templates)))]
    return template.format(color=env.goal_colour)


def instructor_for(templates: tuple[str, ...], checkpoint: Checkpoint, max_tokens: int) -> Instructor:
    """The instructor of ``templates`` with ``checkpoint``'s tokenizer; ValueError when it has none."""
    tokenizer = checkpoint_tokenizer(checkpoint)
    if tokenizer is None:
        raise ValueError(f"{checkpoint.path} has no tokenizer.json: lang-reach tells the robot its goal in words")
    return Instructor(templates, tokenizer, max_tokens)


@dataclass(frozen=True)
class Instructor:
    """Words each probe's instructions for one evaluation: the templates and the checkpoint's tokenizer."""

    templates: tuple[str, ...]
    tokenizer: InstructionTokenizer
    max_tokens: int

    def check(self, colours: tuple[str, ...]) -> int:
        """The longest prompt an episode may start with (the blind one included), in tokens; InstructionError,
        before anything runs, when some template with some colour is not a prompt."""
        longest = self.tokenizer.template_ids("").size
        for template in self.templates:
            for colour in colours:
                try:
                    longest = max(longest, self.tokenizer.prompt_ids(template.format(color=colour),
                                                                      self.max_tokens).size)
                except InstructionError as exc:
                    raise InstructionError(f"template {template!r} with {colour}: {exc}") from None
        return longest

    def instruction(self, env: CueReachEnv, seed: int) -> str:
        """The seed's template, the goal's colour filled in."""
        return instruction_of(self.templates, env, seed)

    def prompt(self, env: CueReachEnv, seed: int, probe: str) -> np.ndarray:
        """The prompt an episode of ``probe`` starts with: its instruction's, or the blind one."""
        if probe == "blind":
            return self.tokenizer.template_ids("")
        return self.tokenizer.prompt_ids(self.instruction(env, seed), self.max_tokens)


def switch_plan(env: CueReachEnv, seed: int) -> tuple[int, int]:
    """(tick, new goal) of a ``switch`` probe: a tick in the first half of the time limit (after one second,
    so the first goal was acted on) and another target, both drawn from the seed."""
    spec = env.spec
    rng = np.random.default_rng([seed, 0x5717C4])
    first, last = spec.frames(1.0), spec.frames(spec.time_limit_s / 2)
    tick = int(rng.integers(first, max(first + 1, last)))
    others = [goal for goal in range(spec.targets) if goal != env.goal]
    return tick, int(others[rng.integers(len(others))])
