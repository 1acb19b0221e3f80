"""What a reasoning block costs on a virtual clock: its measured wall time, or a fixed model.

In virtual time a frame arrives at its recorded time and each reasoning block advances the clock
by its cost, so frames that arrive while a block runs pile up in the double buffer exactly as they
would live. With a fixed cost model the decisions depend on the inputs and the config only: two runs
give the same decisions byte for byte, on any machine.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from .admission import BlockKind
from .clock import NS_PER_MS, VirtualClock

_COST_NAMES = {"encode": BlockKind.ENCODE_PREFILL, "vision": BlockKind.VISION_ENCODE, "decode": BlockKind.DECODE,
               "prompt": BlockKind.PROMPT}
_REQUIRED = ("encode", "decode")  # also ``vision`` where a VL checkpoint runs its tower and ``prompt`` where the
# instruction changes during a run (``require``)


@dataclass(frozen=True)
class CostModel:
    """``measured`` (each block's wall time on this machine) or fixed ns per block kind."""

    fixed_ns: dict[BlockKind, int] | None = None

    @property
    def measured(self) -> bool:
        return self.fixed_ns is None

    def describe(self) -> str:
        if self.fixed_ns is None:
            return "measured"
        parts = ",".join(f"{name}={self.fixed_ns[kind] / NS_PER_MS:g}ms" for name, kind in _COST_NAMES.items()
                         if kind in self.fixed_ns)
        return f"fixed:{parts}"

    def require(self, kinds: Iterable[BlockKind]) -> None:
        """ValueError when a fixed model has no cost for a block kind the engine will run (a VL checkpoint's
        vision encode): a block with no cost would leave the virtual clock where it was."""
        if self.fixed_ns is None:
            return
        names = {kind: name for name, kind in _COST_NAMES.items()}
        missing = [names[kind] for kind in kinds if kind not in self.fixed_ns]
        if missing:
            raise ValueError(f"fixed cost model {self.describe()} lacks {', '.join(missing)}: this model runs "
                             "that block (e.g. fixed:encode=4ms,vision=6ms,decode=1ms)")


def parse_cost(text: str) -> CostModel:
    """``measured`` or ``fixed:encode=4ms,decode=1ms`` (both required; ``vision=6ms`` too for a VL checkpoint;
    ms or us)."""
    if text == "measured":
        return CostModel()
    if not text.startswith("fixed:"):
        raise ValueError(f"cost must be 'measured' or 'fixed:encode=4ms,decode=1ms', got {text!r}")
    costs: dict[BlockKind, int] = {}
    for part in filter(None, text[len("fixed:"):].split(",")):
        match = re.fullmatch(r"\s*(\w+)\s*=\s*([0-9]*\.?[0-9]+)\s*(ms|us)\s*", part)
        if not match or match.group(1) not in _COST_NAMES:
            raise ValueError(f"bad cost {part!r}: expected encode=<n>ms, vision=<n>ms, decode=<n>ms or prompt=<n>ms")
        scale = NS_PER_MS if match.group(3) == "ms" else 1_000
        costs[_COST_NAMES[match.group(1)]] = round(float(match.group(2)) * scale)
    missing = [name for name in _REQUIRED if _COST_NAMES[name] not in costs]
    if missing:
        raise ValueError(f"fixed cost model lacks {', '.join(missing)} (e.g. fixed:encode=4ms,decode=1ms)")
    return CostModel(costs)


class VirtualTimer:
    """Advances a virtual clock by each block's cost: its measured wall time, or the fixed model's."""

    def __init__(self, clock: VirtualClock, costs: CostModel) -> None:
        self.clock = clock
        self.costs = costs
        self._started: dict[BlockKind, int] = {}

    def started(self, kind: BlockKind) -> None:
        self._started[kind] = time.perf_counter_ns()

    def finished(self, kind: BlockKind) -> None:
        if self.costs.fixed_ns is not None:
            self.clock.now += self.costs.fixed_ns[kind]
        else:
            self.clock.now += time.perf_counter_ns() - self._started.pop(kind)
