"""The replay report: ``report.json`` (schema below), ``report.md`` (read this first) and PNG plots.

report.json, schema ``vla_edge_ros.replay/1``::

    {"schema": "vla_edge_ros.replay/1",
     "bag": {"path", "duration_s", "image_topic", "frames", "rate_hz", "command_topic" (or null)},
     "config": {"source", "model_dir", "deadline_ms", "kv_capacity_tokens", "cost_model", "realtime"},
     "policies": {NAME: {
        "frames", "actions", "deadline_hits" (actions with every block in time), "deadline_hit_rate",
        "refused" (no block late, some block refused), "missed" (some admitted block finished late), "stale",
        "dropped" (overwritten in the frame buffer before the reasoner took them),
        "bad_frames": {REASON: count},
        "latency_ms": {"p50", "p95", "p99", "max"} or null (camera arrival to action ready),
        "memory_bytes": {"peak", "final"} (KV of kept tokens + policy state),
        "memory_writes", "evictions", "tokens_seen", "kv_tokens",
        "compression_ratio" (tokens seen / tokens kept at the end),
        "action_error": null or {"compared", "max_gap_ms", "l1": [per dim], "rmse": [per dim], "l1_mean", "rmse_mean"},
        "replay": {"wall_s", "frames_per_s", "x_realtime"},
        "decisions_file", "decisions_sha256"}}}

Action error: each action (clipped as the publisher would) is paired with the recorded command
nearest in time to when it was ready, within ``max_gap_ms``; dimensions the command does not map
(NaN) are left out. Timing fields (``replay``) are wall-clock and differ between runs; everything
else is a function of the bag, the config and the cost model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from ...runtime.clock import NS_PER_MS
from .session import PolicyRun

SCHEMA = "vla_edge_ros.replay/1"
MAX_GAP_MS = 500.0


def action_error(run: PolicyRun, commands: list[tuple[int, np.ndarray]]) -> dict[str, Any] | None:
    """Per-dimension L1 and RMSE of the run's actions against the nearest recorded command."""
    if not commands or not run.actions:
        return None
    times = np.array([t for t, _ in commands], dtype=np.int64)
    diffs = []
    for ready_ns, action in run.actions:
        i = int(np.searchsorted(times, ready_ns))
        nearest = min((j for j in (i - 1, i) if 0 <= j < len(times)), key=lambda j: abs(times[j] - ready_ns))
        if abs(times[nearest] - ready_ns) > MAX_GAP_MS * NS_PER_MS:
            continue
        recorded = commands[nearest][1]
        dims = min(action.size, recorded.size)
        diff = action[:dims].astype(np.float64) - recorded[:dims]
        if not np.all(np.isnan(diff)):  # a command without ground truth here (NaN) is no comparison
            diffs.append(diff)
    if not diffs:
        return None
    width = max(d.size for d in diffs)
    table = np.full((len(diffs), width), np.nan)
    for row, diff in zip(table, diffs):
        row[:diff.size] = diff
    mapped = ~np.all(np.isnan(table), axis=0)
    l1 = np.nanmean(np.abs(table[:, mapped]), axis=0)
    rmse = np.sqrt(np.nanmean(table[:, mapped] ** 2, axis=0))
    return {"compared": len(diffs), "max_gap_ms": MAX_GAP_MS, "l1": _floats(l1), "rmse": _floats(rmse),
            "l1_mean": float(l1.mean()), "rmse_mean": float(rmse.mean())}


def summarize(run: PolicyRun, bag_duration_s: float, commands: list[tuple[int, np.ndarray]]) -> dict[str, Any]:
    counts = run.counts
    latency = None
    if run.latencies_ms:
        p50, p95, p99 = np.percentile(run.latencies_ms, [50, 95, 99])
        latency = {"p50": float(p50), "p95": float(p95), "p99": float(p99), "max": float(max(run.latencies_ms))}
    memory = [m[1] for m in run.memory] or [0]
    decisions = "\n".join(run.decisions) + "\n"
    return {
        "frames": counts["frames"], "actions": len(run.actions), "deadline_hits": counts["admitted"],
        "deadline_hit_rate": counts["admitted"] / counts["frames"] if counts["frames"] else 0.0,
        "refused": counts["refused"], "missed": counts["missed"], "stale": counts["stale"],
        "dropped": counts["dropped"], "bad_frames": dict(sorted(run.decode_errors.items())),
        "latency_ms": latency,
        "memory_bytes": {"peak": int(max(memory)), "final": int(memory[-1])},
        "memory_writes": run.memory[-1][2] if run.memory else 0,
        "evictions": run.memory[-1][3] if run.memory else 0,
        "tokens_seen": run.tokens_seen, "kv_tokens": run.kv_tokens,
        "compression_ratio": run.tokens_seen / run.kv_tokens if run.kv_tokens else None,
        "action_error": action_error(run, commands),
        "replay": {"wall_s": run.wall_s, "frames_per_s": counts["frames"] / run.wall_s if run.wall_s else None,
                   "x_realtime": bag_duration_s / run.wall_s if run.wall_s else None},
        "decisions_file": f"decisions_{run.policy}.txt",
        "decisions_sha256": hashlib.sha256(decisions.encode()).hexdigest(),
    }


def write_report(out: Path, bag: dict[str, Any], config: dict[str, Any], runs: list[PolicyRun],
                 commands: list[tuple[int, np.ndarray]]) -> dict[str, Any]:
    """Write report.json, report.md, one decisions file per policy and the plots into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    policies = {run.policy: summarize(run, bag["duration_s"], commands) for run in runs}
    report = {"schema": SCHEMA, "bag": bag, "config": config, "policies": policies}
    for run in runs:
        (out / policies[run.policy]["decisions_file"]).write_text("\n".join(run.decisions) + "\n")
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))
    _plots(out, runs, bag_start_ns=bag["start_ns"])
    return report


def markdown(report: dict[str, Any]) -> str:
    bag, config = report["bag"], report["config"]
    lines = [f"# Replay of `{bag['path']}`", "",
             f"{bag['frames']} frames on `{bag['image_topic']}` over {bag['duration_s']:.1f} s "
             f"({bag['rate_hz']:.1f} Hz); deadline {config['deadline_ms']:g} ms; cost model "
             f"`{config['cost_model']}`{' (real time)' if config['realtime'] else ''}; model `{config['model_dir']}`, "
             f"KV arena {config['kv_capacity_tokens']} tokens.", "",
             "| policy | actions | deadline hits | refused | missed | stale | dropped | latency p50 / p95 / p99 / max ms "
             "| memory peak B | writes | evictions | compression | action L1 / RMSE | replay fps (x real time) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, p in report["policies"].items():
        lat = p["latency_ms"]
        latency = " / ".join(f"{lat[k]:.1f}" for k in ("p50", "p95", "p99", "max")) if lat else "-"
        error = p["action_error"]
        err = f"{error['l1_mean']:.3f} / {error['rmse_mean']:.3f}" if error else "-"
        ratio = f"{p['compression_ratio']:.1f}x" if p["compression_ratio"] else "-"
        speed = p["replay"]
        fps = f"{speed['frames_per_s']:.1f} ({speed['x_realtime']:.2f}x)" if speed["frames_per_s"] else "-"
        lines.append(f"| {name} | {p['actions']} | {p['deadline_hits']} ({100 * p['deadline_hit_rate']:.0f}%) | "
                     f"{p['refused']} | {p['missed']} | {p['stale']} | {p['dropped']} | {latency} | "
                     f"{p['memory_bytes']['peak']:,} | {p['memory_writes']} | {p['evictions']} | {ratio} | {err} | {fps} |")
    bad = {name: p["bad_frames"] for name, p in report["policies"].items() if p["bad_frames"]}
    if bad:
        lines += ["", f"Frames that could not be decoded (skipped, as the camera node would): {bad}"]
    if bag["command_topic"] is None:
        lines += ["", "The bag has no command topic: no action error."]
    lines += ["", "Plots: latency.png, timeline.png, memory.png, writes.png. Schema: report.json "
              f"`{report['schema']}`.", ""]
    return "\n".join(lines)


def _plots(out: Path, runs: list[PolicyRun], bag_start_ns: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def seconds(t_ns: int) -> float:
        return (t_ns - bag_start_ns) / 1e9

    fig, ax = plt.subplots(figsize=(8, 4))
    for run in runs:
        if run.latencies_ms:
            ax.hist(run.latencies_ms, bins=50, histtype="step", label=run.policy)
    ax.set(xlabel="camera-to-action latency (ms)", ylabel="actions", title="Latency")
    _legend(ax)
    _save(fig, out / "latency.png")

    fig, ax = plt.subplots(figsize=(10, 1 + 0.8 * len(runs)))
    colours = {"admitted": "tab:green", "refused": "tab:orange", "missed": "tab:red", "stale": "tab:gray"}
    for row, run in enumerate(runs):
        for outcome, colour in colours.items():
            times = [seconds(t) for t, o in run.events if o == outcome]
            ax.scatter(times, [row] * len(times), s=6, c=colour, label=outcome if row == 0 else None, marker="|")
    ax.set_yticks(range(len(runs)), [run.policy for run in runs])
    ax.set_ylim(-0.5, len(runs) - 0.5)
    ax.set(xlabel="bag time (s)", title="Cycles: admitted / refused / missed / stale")
    _legend(ax, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize="small")
    _save(fig, out / "timeline.png")

    for column, name, label in ((1, "memory.png", "memory bytes (KV + policy state)"),
                                (2, "writes.png", "memory writes (cumulative)")):
        fig, ax = plt.subplots(figsize=(8, 4))
        for run in runs:
            ax.step([seconds(m[0]) for m in run.memory], [m[column] for m in run.memory], where="post", label=run.policy)
        ax.set(xlabel="bag time (s)", ylabel=label, title=label)
        _legend(ax)
        _save(fig, out / name)


def _legend(ax, **options) -> None:
    if ax.get_legend_handles_labels()[0]:  # a policy without actions draws nothing to label
        ax.legend(**options)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)


def _floats(values: np.ndarray) -> list[float]:
    return [float(v) for v in values]
