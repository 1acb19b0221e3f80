"""The per-frame files of a replay: ``decisions_<policy>.txt``, ``predictions_<policy>.csv`` and, for a chunked
model (H > 1 actions a cycle), ``chunks_<policy>.csv``.

The first two have one entry per camera message, in arrival order, from the same ``FrameRecord``.

The decisions file is the replay's fingerprint: under a fixed cost model it is a function of the bag
and the config alone, so two runs writing the same bytes made the same gate decisions, produced the
same actions (printed exactly: the shortest text that reads back to the same float32) and kept and
evicted the same frames. A line (wrapped here)::

    12 t_ms=400.000 admitted admitted ready_ms=414.000 action=0.25,-0.5 kv=70 writes=13 evictions=2
        kept=5,8,12 evicted=4

``t_ms`` and ``ready_ms`` count from the first frame's arrival; a dropped frame's line ends after its
outcome, a bad frame's after its reason, a no_state frame's after why; ``kept=-`` is an empty memory.

The CSV is for plotting and inspection (any spreadsheet, ``pandas.read_csv``): times are seconds from
the bag's start, numbers plain, an empty cell is "not applicable" (no action, no command within
``MAX_GAP_MS``, a dimension the command does not map). Columns: see ``csv_header``. Its ``action_*`` is
a chunk's first action, the one for the frame's own time.

The chunks CSV puts every action of every chunk beside the recorded command for the moment it is meant for
(action i of a frame's chunk: the frame's arrival + i control periods, as the publisher's timeline reads
it), one row per (frame, action), in frame order: what the model predicted the robot should do next, held
against what it did. Columns: see ``chunk_header``. A model of one action a cycle has no such file, so
replay's output for it is what it was before chunks.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ...runtime.clock import NS_PER_MS
from .commands import RecordedCommands
from .session import FrameRecord, PolicyRun


def decision_lines(run: PolicyRun) -> list[str]:
    start = run.frames[0].arrival_ns if run.frames else 0
    return [_decision(record, start, run.figure_names) for record in run.frames]


def _decision(record: FrameRecord, start_ns: int, figure_names: tuple[str, ...]) -> str:
    parts = [str(record.index), f"t_ms={(record.arrival_ns - start_ns) / NS_PER_MS:.3f}", record.outcome]
    if record.detail:
        parts.append(record.detail)
    if record.ready_ns is not None:
        parts.append(f"ready_ms={(record.ready_ns - start_ns) / NS_PER_MS:.3f}")
    if record.action is not None:
        parts.append("action=" + ",".join(_float32(v) for v in record.action))
    memory = record.memory
    if memory is not None:
        parts += [f"kv={memory.kv_tokens}", f"writes={memory.writes}", f"evictions={memory.evictions}",
                  f"kept={_joined(memory.kept, ',')}", f"evicted={_joined(memory.evicted, ',')}"]
        parts += [f"{name}={_number(value)}" for name, value in zip(figure_names, memory.figures)
                  if not math.isnan(value)]
    return " ".join(parts)


def csv_header(run: PolicyRun, commands: RecordedCommands) -> list[str]:
    """frame (index in the camera topic), arrival_s, outcome, detail (gate verdict and refused block, a bad
    frame's reason, or why a frame had no state), ready_s, latency_ms (arrival to action ready), action_0..
    (clipped as published), command_s and command_0.. (the recorded command the action is compared with),
    kv_tokens, memory_bytes, writes and evictions (cumulative, in ``write_unit``), kept_frames and
    evicted_frames (frame indices, space-separated), then the policy's own figures (aura: surprise; dms:
    slots_held, heads_ratio)."""
    return (["frame", "arrival_s", "outcome", "detail", "ready_s", "latency_ms"]
            + [f"action_{i}" for i in range(run.action_dims)]
            + ["command_s"] + [f"command_{i}" for i in range(commands.width)]
            + ["kv_tokens", "memory_bytes", "writes", "evictions", "kept_frames", "evicted_frames",
               *run.figure_names])


def chunk_header(run: PolicyRun, commands: RecordedCommands) -> list[str]:
    """frame (index in the camera topic), step (i in the chunk, 0 = ``action_*`` of the predictions CSV), t_s
    (the frame's arrival + i control periods: when the action is meant for), due_before_ready (1: that moment
    had passed when the chunk was ready, so no execution mode could command it), action_0.. (clipped as
    published), command_s and command_0.. (the recorded command nearest to t_s, within ``MAX_GAP_MS``)."""
    return (["frame", "step", "t_s", "due_before_ready"] + [f"action_{i}" for i in range(run.action_dims)]
            + ["command_s"] + [f"command_{i}" for i in range(commands.width)])


def write_chunks(path: Path, run: PolicyRun, commands: RecordedCommands, bag_start_ns: int) -> None:
    """The chunks CSV (only for a run whose model gives H > 1 actions a cycle)."""
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(chunk_header(run, commands))
        for record in run.frames:
            if record.chunk is None:
                continue
            for step, action in enumerate(record.chunk):
                due_ns = record.arrival_ns + step * run.control_period_ns
                writer.writerow([str(record.index), str(step), _seconds(due_ns, bag_start_ns),
                                 str(int(due_ns < record.ready_ns)),
                                 *(_float32(v) for v in action), *_command(commands, due_ns, bag_start_ns)])


def write_predictions(path: Path, run: PolicyRun, commands: RecordedCommands, bag_start_ns: int) -> None:
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(csv_header(run, commands))
        writer.writerows(_row(record, run, commands, bag_start_ns) for record in run.frames)


def _row(record: FrameRecord, run: PolicyRun, commands: RecordedCommands, start_ns: int) -> list[str]:
    latency = record.latency_ms
    row = [str(record.index), _seconds(record.arrival_ns, start_ns), record.outcome, record.detail,
           _seconds(record.ready_ns, start_ns), "" if latency is None else f"{latency:.3f}"]
    action = record.action
    row += [_float32(v) for v in action] if action is not None else [""] * run.action_dims
    row += _command(commands, record.ready_ns, start_ns) if action is not None else [""] * (1 + commands.width)
    memory = record.memory
    if memory is None:
        row += [""] * (6 + len(run.figure_names))
    else:
        row += [str(memory.kv_tokens), str(memory.memory_bytes), str(memory.writes), str(memory.evictions),
                _joined(memory.kept, " ", empty=""), _joined(memory.evicted, " ", empty="")]
        row += [_number(value) for value in memory.figures]
    return row


def _command(commands: RecordedCommands, t_ns: int, start_ns: int) -> list[str]:
    """command_s and command_0..: the recorded command nearest to ``t_ns`` (``commands.nearest``), or empty cells."""
    matched = commands.nearest(t_ns)
    if matched is None:
        return [""] * (1 + commands.width)
    vector = commands.vectors[matched]
    return ([_seconds(int(commands.times[matched]), start_ns)]
            + [_number(vector[i], digits=9) if i < vector.size else "" for i in range(commands.width)])


def _seconds(t_ns: int | None, start_ns: int) -> str:
    """Seconds from the bag's start, to the microsecond; empty for no time."""
    return "" if t_ns is None else f"{(t_ns - start_ns) / 1e9:.6f}"


def _float32(value: float) -> str:
    """The shortest text that reads back to the same float32."""
    return str(np.float32(value))


def _number(value: float, digits: int = 6) -> str:
    return "" if math.isnan(value) else f"{value:.{digits}g}"


def _joined(frames: Iterable[int], separator: str, empty: str = "-") -> str:
    return separator.join(map(str, frames)) or empty
