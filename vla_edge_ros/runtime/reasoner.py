"""One reasoning cycle: ask the gate, encode + prefill, decode, account. Shared by the live node and replay.

A cycle acts on one observation from the frame buffer (every camera's frame and the robot's state, put
together by ``observation.py``); its deadline runs from the observation's receive time.

A model output holding NaN or Inf (``numerics/finite.py``) ends the cycle without an action, as
``invalid``: the robot keeps what it had (the publisher's safe stop once that is stale), never a command
read off NaN logits.

A VL checkpoint's vision tower is a block of its own (``vision_encode``): the gate is asked before it,
then again before the prefill of the segment it made, so each cost is learned apart and a prefill that
no longer fits after a slow encode is refused rather than started.

The gate decides on its own clock. Live, that is the monotonic clock and blocks simply take the
time they take. In replay the clock is virtual, and a ``BlockTimer`` moves it forward by each
block's cost (measured, or taken from a fixed model), so that the same decisions follow from the
same costs on any machine and at any replay speed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from ..engine.vla_engine import VlaEngine
from ..model.config import ModelConfig
from ..numerics.finite import NonFiniteError
from .admission import AdmissionGate, BlockKind, Horizon, Verdict
from .frame_buffer import Frame


T = TypeVar("T")


def block_kinds(config: ModelConfig) -> tuple[BlockKind, ...]:
    """The blocks a cycle runs for a model of ``config``, in order (what a fixed cost model must price)."""
    first = (BlockKind.VISION_ENCODE,) if config.vl is not None else ()
    return first + (BlockKind.ENCODE_PREFILL, BlockKind.DECODE)


def decode_blocks(config: ModelConfig) -> int:
    """Decode blocks one cycle runs (``VlaEngine.decode_action``): none for a continuous head (linear, mlp), one
    forward pass for a bins chunk (H > 1), dof - 1 steps for sequential bins. With ``block_kinds``, what a fixed
    cost model makes a cycle cost (a latency sweep sets the encode cost from it)."""
    action = config.action
    if action.head in ("linear", "mlp"):
        return 0
    return 1 if action.chunk > 1 else action.dof - 1


class BlockTimer(Protocol):
    """Told when each admitted block starts and finishes (replay advances its virtual clock here)."""

    def started(self, kind: BlockKind) -> None: ...

    def finished(self, kind: BlockKind) -> None: ...


class RealTime:
    """Live: blocks take real time on the real clock; nothing to do."""

    def started(self, kind: BlockKind) -> None:
        pass

    def finished(self, kind: BlockKind) -> None:
        pass


@dataclass(frozen=True)
class CycleResult:
    """What became of one frame."""

    verdict: Verdict  # the cycle's verdict (stale, refused, warmup, admitted, probe, recovery)
    chunk: np.ndarray | None  # the actions [H, dof] for the observation's time onwards; None unless every block ran
    ready_ns: int | None  # gate clock when the chunk was ready
    missed: bool  # some block of this cycle finished after the frame's deadline (with or without an action)
    refused_block: BlockKind | None = None  # the block the gate refused inside an admitted cycle
    invalid: str = ""  # why the model's output could not become an action (NaN or Inf), if it could not

    @property
    def action(self) -> np.ndarray | None:
        """The chunk's first action [dof] (what ``sync`` execution commands), None without a chunk."""
        return None if self.chunk is None else self.chunk[0]


class Reasoner:
    """The engine behind the admission gate: the newest frame in, an action (or a reason for none) out."""

    def __init__(self, engine: VlaEngine, gate: AdmissionGate, timer: BlockTimer | None = None) -> None:
        self.engine = engine
        self.gate = gate
        self.timer = timer or RealTime()

    def retask(self, apply: Callable[[], T]) -> T:
        """Run ``apply`` (a new instruction's prompt: prefilled, or its stored KV loaded) as a ``prompt`` block:
        it always starts (the robot must take the new task), its cost is learned apart, and the next frame's
        cycle is judged with the time it took."""
        block = self.gate.start_required(BlockKind.PROMPT)
        self.timer.started(BlockKind.PROMPT)
        try:
            return apply()
        finally:
            self.timer.finished(BlockKind.PROMPT)
            self.gate.record(block)

    def cycle(self, frame: Frame, horizon: Horizon | None = None) -> CycleResult:
        """What becomes of observation ``frame``: the gate's verdict, and the action if every block ran.
        ``horizon``: what the action timeline holds, when it executes chunks (the gate plans on it); None: the
        fixed deadline."""
        gate, timer = self.gate, self.timer
        cycle = gate.start_cycle(frame.receive_ns, horizon)
        if not cycle:
            return CycleResult(cycle.verdict, None, None, False)
        late: list[bool] = []
        encoded = None
        if self.engine.mrope:  # the vision tower, gated and costed on its own
            block = gate.admit(BlockKind.VISION_ENCODE, cycle.deadline_ns, within=cycle.verdict)
            if not block:
                return CycleResult(cycle.verdict, None, None, False, BlockKind.VISION_ENCODE)
            timer.started(BlockKind.VISION_ENCODE)
            encoded = self.engine.encode_frame(frame.image, frame.extra_images, frame.state)
            timer.finished(BlockKind.VISION_ENCODE)
            late.append(gate.record(block))
        block = gate.admit(BlockKind.ENCODE_PREFILL, cycle.deadline_ns, within=cycle.verdict)
        if not block:
            return CycleResult(cycle.verdict, None, None, any(late), BlockKind.ENCODE_PREFILL)
        timer.started(BlockKind.ENCODE_PREFILL)
        prefill = self.engine.prefill_frame(encoded if encoded is not None else
                                            self.engine.encode_frame(frame.image, frame.extra_images, frame.state))
        timer.finished(BlockKind.ENCODE_PREFILL)
        late.append(gate.record(block))

        def admit_step():
            step = gate.admit(BlockKind.DECODE, cycle.deadline_ns, within=cycle.verdict)
            if step:
                timer.started(BlockKind.DECODE)
            return step

        def finish_step(step) -> None:
            timer.finished(BlockKind.DECODE)
            late.append(gate.record(step))

        try:
            decoded = self.engine.decode_action(prefill, admit=admit_step, done=finish_step)
        except NonFiniteError as exc:  # a corrupt model's output: no action, and the cycle says why
            return CycleResult(cycle.verdict, None, None, any(late), invalid=str(exc))
        if decoded is None:
            return CycleResult(cycle.verdict, None, None, any(late), BlockKind.DECODE)
        ready_ns = gate.now_ns()
        late.append(gate.record(cycle, ready_ns))
        return CycleResult(cycle.verdict, decoded[0], ready_ns, any(late))
