"""New instructions while the robot runs: checked where they arrive, the newest applied between cycles.

Instructions come from people and programs (the ``instruction_topic``, or ``ros2 param set ... instruction``)
on the executor thread. Each is checked there, in full (text, length, the checkpoint's tokenizer: see
``model/instruction.py``), before it costs the reasoning thread anything: a refused one is counted with
its reason and the robot keeps its current instruction. An accepted one waits in a latest-only slot, like
a frame in the frame buffer: a newer one supersedes it (counted), so any burst becomes one prompt change.

The reasoning thread takes the waiting instruction between cycles (``take``), and only once a frame cycle
has run since the previous change (``cycle_done``): under a flood of instructions every other turn of the
loop is still a frame, so the robot keeps acting. ``applied`` records when the instruction took effect,
``failed`` puts the current one back in charge when the engine could not place the new prompt (an arena
too small for it). Both threads touch the desk, under one lock held for microseconds.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ..model.instruction import InstructionError, InstructionTokenizer

SHOWN_CHARS = 60  # of the current instruction, on diagnostics and the status line


@dataclass(frozen=True)
class Instruction:
    """An accepted instruction: its text, its prompt's token ids and when it arrived."""

    text: str
    token_ids: np.ndarray
    received_ns: int


class InstructionDesk:
    """Checks arriving instructions and hands the newest to the reasoning thread; see the module doc."""

    def __init__(self, tokenizer: InstructionTokenizer | None, max_tokens: int, current: str, now_ns: int) -> None:
        """``tokenizer``: the checkpoint's (None: it has none, and every instruction is refused); ``current``:
        the instruction the engine was configured with ("" for prompt token ids)."""
        self._tokenizer = tokenizer
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self._waiting: Instruction | None = None
        self._cycled = True  # a frame cycle has run since the last change
        self.current = current
        self.changed_ns = now_ns
        self.applied_count = self.refused = self.superseded = self.failed_count = 0
        self.last_refusal = ""

    def check(self, text: object) -> np.ndarray:
        """The prompt ids of ``text``, or InstructionError saying why it cannot be one (not counted: a
        parameter check, whose refusal the caller reports)."""
        if self._tokenizer is None:
            raise InstructionError("the model has no tokenizer.json, so it cannot read an instruction")
        return self._tokenizer.prompt_ids(text, self.max_tokens)

    def offer(self, text: object, now_ns: int) -> Instruction:
        """Check ``text`` and let it wait for the reasoning thread (superseding one still waiting); a refusal is
        counted, remembered for diagnostics and raised."""
        try:
            ids = self.check(text)
        except InstructionError as exc:
            with self._lock:
                self.refused += 1
                self.last_refusal = str(exc)
            raise
        instruction = Instruction(str(text), ids, now_ns)
        with self._lock:
            self.superseded += self._waiting is not None
            self._waiting = instruction
        return instruction

    def take(self) -> Instruction | None:
        """The waiting instruction, if a frame cycle has run since the last change (reasoning thread)."""
        with self._lock:
            if not self._cycled or self._waiting is None:
                return None
            waiting, self._waiting = self._waiting, None
            self._cycled = False
            return waiting

    def cycle_done(self) -> None:
        """A frame cycle has run: the next waiting instruction may be applied."""
        with self._lock:
            self._cycled = True

    def applied(self, instruction: Instruction, now_ns: int) -> None:
        with self._lock:
            self.current, self.changed_ns = instruction.text, now_ns
            self.applied_count += 1

    def failed(self, reason: str) -> None:
        """The engine could not place the taken instruction's prompt: the current one stays."""
        with self._lock:
            self.failed_count += 1
            self.last_refusal = reason

    def figures(self, now_ns: int) -> dict[str, object]:
        """What diagnostics and the status line show of the instruction."""
        with self._lock:
            shown = self.current if len(self.current) <= SHOWN_CHARS else self.current[:SHOWN_CHARS - 3] + "..."
            return {"instruction": shown, "instruction_age_s": round((now_ns - self.changed_ns) / 1e9, 1),
                    "instructions_applied": self.applied_count, "instructions_refused": self.refused + self.failed_count,
                    "instructions_superseded": self.superseded, "instruction_last_refusal": self.last_refusal}
