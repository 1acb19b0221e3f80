"""The replay's plots (PNG, matplotlib's Agg backend, so no display is needed).

- ``latency.png``: camera-to-action latency per policy, with the deadline drawn in;
- ``timeline.png``: every camera frame's outcome over bag time, one row per policy;
- ``memory.png``: memory held (KV of kept tokens + policy state) over bag time;
- ``writes.png``: cumulative memory writes, one panel per unit (frames, and tokens for dms) so that
  counts of different things never share an axis;
- ``actions.png``: one panel per action dimension, each policy's actions at the time they were ready
  against the recorded command.

Each figure is built by its own function (which the tests read back), then saved by ``write_plots``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from .commands import RecordedCommands
from .session import OUTCOMES, PolicyRun

OUTCOME_COLOURS = {"admitted": "tab:green", "refused": "tab:orange", "missed": "tab:red", "stale": "tab:gray",
                   "invalid": "black", "dropped": "tab:blue", "no_state": "tab:brown", "bad_frame": "tab:purple"}
WRITES_OF = {"frames": "frames stored (aura: written into its fast weights)", "tokens": "tokens written (dms)"}
BAG_TIME = "bag time (s)"
PLOTS = ("latency.png", "timeline.png", "memory.png", "writes.png", "actions.png")


def write_plots(out: Path, runs: Sequence[PolicyRun], commands: RecordedCommands, *, bag_start_ns: int,
                deadline_ms: float) -> None:
    plt = pyplot()

    def seconds(t_ns: int) -> float:
        return (t_ns - bag_start_ns) / 1e9

    figures = (latency_figure(runs, deadline_ms), timeline_figure(runs, seconds), memory_figure(runs, seconds),
               writes_figure(runs, seconds), actions_figure(runs, commands, seconds))
    for name, fig in zip(PLOTS, figures):
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)


def pyplot():
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_figure(runs: Sequence[PolicyRun], deadline_ms: float):
    fig, ax = pyplot().subplots(figsize=(8, 4))
    for run in runs:
        if run.actions:
            ax.hist([record.latency_ms for record in run.actions], bins=50, histtype="step", label=run.policy)
    ax.axvline(deadline_ms, color="black", linestyle="--", label=f"deadline {deadline_ms:g} ms")
    ax.set(xlabel="camera-to-action latency (ms)", ylabel="actions (count)", title="Latency")
    ax.legend()
    return fig


def timeline_figure(runs: Sequence[PolicyRun], seconds: Callable[[int], float]):
    fig, ax = pyplot().subplots(figsize=(10, 1.2 + 0.8 * len(runs)))
    for row, run in enumerate(runs):
        for outcome in OUTCOMES:
            times = [seconds(record.arrival_ns) for record in run.frames if record.outcome == outcome]
            ax.scatter(times, [row] * len(times), s=8, c=OUTCOME_COLOURS[outcome], marker="|",
                       label=outcome if row == 0 else None)
    ax.set_yticks(range(len(runs)), [run.policy for run in runs])
    ax.set_ylim(-0.5, len(runs) - 0.5)
    ax.set(xlabel="bag time of the frame's arrival (s)", ylabel="policy", title="What became of each camera frame")
    _legend(ax, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=len(OUTCOMES), fontsize="small")
    return fig


def memory_figure(runs: Sequence[PolicyRun], seconds: Callable[[int], float]):
    fig, ax = pyplot().subplots(figsize=(8, 4))
    for run in runs:
        cycles = run.cycles
        ax.step([seconds(r.done_ns) for r in cycles], [r.memory.memory_bytes for r in cycles], where="post",
                label=run.policy)
    ax.set(xlabel=BAG_TIME, ylabel="memory held (bytes: KV + policy state)", title="Memory")
    _legend(ax)
    return fig


def writes_figure(runs: Sequence[PolicyRun], seconds: Callable[[int], float]):
    """One panel per unit that some run counts its writes in."""
    units = [unit for unit in WRITES_OF if any(run.write_unit == unit for run in runs)]
    fig, axes = pyplot().subplots(1, len(units), figsize=(8 * len(units), 4), squeeze=False)
    for ax, unit in zip(axes[0], units):
        for run in runs:
            if run.write_unit == unit:
                cycles = run.cycles
                ax.step([seconds(r.done_ns) for r in cycles], [r.memory.writes for r in cycles], where="post",
                        label=run.policy)
        ax.set(xlabel=BAG_TIME, ylabel=f"{unit} (cumulative)", title=f"Memory writes: {WRITES_OF[unit]}")
        _legend(ax)
    return fig


def actions_figure(runs: Sequence[PolicyRun], commands: RecordedCommands, seconds: Callable[[int], float]):
    """One panel per action dimension: the recorded command as a line, each policy's actions as points."""
    dims = max([run.action_dims for run in runs] + [commands.width, 1])
    fig, axes = pyplot().subplots(dims, 1, figsize=(10, 1.2 + 1.8 * dims), sharex=True, squeeze=False)
    times = [seconds(int(t)) for t in commands.times]
    for dim, ax in enumerate(axes[:, 0]):
        if dim < commands.width:
            values = [v[dim] if dim < v.size else float("nan") for v in commands.vectors]
            ax.step(times, values, where="post", color="black", linewidth=1, label="recorded command")
        for run in runs:
            actions = [record for record in run.actions if dim < record.action.size]
            ax.plot([seconds(r.ready_ns) for r in actions], [r.action[dim] for r in actions], ".", markersize=3,
                    label=run.policy)
        ax.set_ylabel(commands.label(dim), fontsize="small")
        ax.set_xlabel(BAG_TIME)
        ax.label_outer()  # the shared time axis is labelled once, under the last panel
    _legend(axes[0, 0], fontsize="small", loc="lower left", bbox_to_anchor=(1.0, 0.0))
    fig.suptitle(f"Predicted actions against the recorded {commands.msgtype}" if commands.msgtype
                 else "Predicted actions (the bag has no recorded command)")
    return fig


def _legend(ax, **options) -> None:
    if ax.get_legend_handles_labels()[0]:  # a policy without actions draws nothing to label
        ax.legend(**options)
