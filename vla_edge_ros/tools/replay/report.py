"""The replay report: ``report.json`` (schema below), ``report.md`` (read this first), the per-frame files
(``frame_files.py``) and the plots (``plots.py``).

report.json, schema ``vla_edge_ros.replay/4``::

    {"schema": "vla_edge_ros.replay/4",
     "bag": {"path", "duration_s", "start_ns", "image_topic", "frames", "rate_hz", "command_topic" (or null),
             "command_type" (or null), "state": null (the model reads no state) or {"topic", "state_type",
             "found" (true: the bag's only odometry topic, state_topic being empty: ``bag_state.py``)},
             "topics": [{"name", "type", "messages", "first_s", "last_s", "rate_hz",
             "role": "camera" | "recorded command" | "robot state" | null}]},
     "config": {"source", "model_dir", "deadline_ms", "kv_capacity_tokens", "cost_model", "realtime"},
     "policies": {NAME: {
        "frames" (camera messages), "decoded_frames", "bad_frames": {REASON: count} (undecodable: skipped
        as the camera node would, and left out of every deadline figure),
        "no_state" (decoded, but no observation: no good state within state_max_age_ms of the frame's stamp,
        as live), "state_messages" and "state_dropped": {REASON: count} (state messages read, and those
        refused: NaN, a wrong joint name ...; ``runtime/robot_state.py``; 0 and {} without a state),
        "actions", "deadline_hits" (actions with every block in time), "deadline_hit_rate" (of the observations:
        decoded frames less no_state),
        "refused" (no block late, some block refused), "missed" (some admitted block finished late), "stale",
        "invalid" (the model's output held NaN or Inf: no action, as live; a corrupt checkpoint),
        "dropped" (decoded, then overwritten in the frame buffer before the reasoner took them),
        "latency_ms": {"p50", "p95", "p99", "max"} or null (camera arrival to action ready),
        "memory_bytes": {"peak", "final"} (KV of kept tokens + policy state),
        "write_unit" ("frames"; dms: "tokens"), "memory_writes", "evictions" (both in write_unit),
        "tokens_seen", "kv_tokens", "compression_ratio" (tokens seen / tokens kept at the end),
        "action_error": null or {"compared", "max_gap_ms", "l1": [per dim], "rmse": [per dim], "l1_mean", "rmse_mean"},
        "replay": {"wall_s", "frames_per_s", "x_realtime"},
        "decisions_file", "decisions_sha256", "predictions_file",
        "chunks_file" (only for a model of H > 1 actions a cycle: every action of every chunk beside the
        recorded command for its moment, ``frame_files.py``)}}}

Every frame is exactly one of deadline hit, missed, refused, stale, invalid, dropped, no_state or bad. An
invalid output is never a deadline hit and never written as an action; report.md flags it, and ``vla-edge
replay`` exits 2 when any occurred. Action error: each
action (clipped as the publisher would) is paired with the recorded command nearest in time to when it
was ready, within ``max_gap_ms`` (``commands.py``); dimensions the command does not map (NaN) are left
out. Timing fields (``replay``) are wall-clock and differ between runs; everything else is a function
of the bag, the config and the cost model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from .commands import MAX_GAP_MS, RecordedCommands
from .frame_files import decision_lines, write_chunks, write_predictions
from .plots import PLOTS, write_plots
from .session import PolicyRun

SCHEMA = "vla_edge_ros.replay/4"


def action_error(run: PolicyRun, commands: RecordedCommands) -> dict[str, Any] | None:
    """Per-dimension L1 and RMSE of the run's actions against their matched recorded commands."""
    diffs = []
    for record in run.actions:
        matched = commands.nearest(record.ready_ns)
        if matched is None:
            continue
        recorded = commands.vectors[matched]
        dims = min(record.action.size, recorded.size)
        diff = record.action[:dims].astype(np.float64) - recorded[:dims]
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


def summarize(run: PolicyRun, bag_duration_s: float, commands: RecordedCommands, decisions: str) -> dict[str, Any]:
    counts = run.counts
    latencies = [record.latency_ms for record in run.actions]
    latency = None
    if latencies:
        p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
        latency = {"p50": float(p50), "p95": float(p95), "p99": float(p99), "max": float(max(latencies))}
    memory = [record.memory for record in run.cycles]
    decoded = counts["frames"] - counts["bad_frame"]
    observed = decoded - counts["no_state"]
    return {
        "frames": counts["frames"], "decoded_frames": decoded, "bad_frames": dict(sorted(run.decode_errors.items())),
        "no_state": counts["no_state"], "state_messages": run.state_messages, "state_dropped": run.state_dropped,
        "actions": len(run.actions), "deadline_hits": counts["admitted"],
        "deadline_hit_rate": counts["admitted"] / observed if observed else 0.0,
        "refused": counts["refused"], "missed": counts["missed"], "stale": counts["stale"], "invalid": counts["invalid"],
        "dropped": counts["dropped"], "latency_ms": latency,
        "memory_bytes": {"peak": max((m.memory_bytes for m in memory), default=0),
                         "final": memory[-1].memory_bytes if memory else 0},
        "write_unit": run.write_unit,
        "memory_writes": memory[-1].writes if memory else 0, "evictions": memory[-1].evictions if memory else 0,
        "tokens_seen": run.tokens_seen, "kv_tokens": run.kv_tokens,
        "compression_ratio": run.tokens_seen / run.kv_tokens if run.kv_tokens else None,
        "action_error": action_error(run, commands),
        "replay": {"wall_s": run.wall_s, "frames_per_s": counts["frames"] / run.wall_s if run.wall_s else None,
                   "x_realtime": bag_duration_s / run.wall_s if run.wall_s else None},
        "decisions_file": f"decisions_{run.policy}.txt",
        "decisions_sha256": hashlib.sha256(decisions.encode()).hexdigest(),
        "predictions_file": f"predictions_{run.policy}.csv",
        **({"chunks_file": f"chunks_{run.policy}.csv"} if run.chunk > 1 else {}),
    }


def write_report(out: Path, bag: dict[str, Any], config: dict[str, Any], runs: list[PolicyRun],
                 commands: RecordedCommands) -> dict[str, Any]:
    """Write report.json, report.md, the per-frame files of each policy and the plots into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    policies = {}
    for run in runs:
        decisions = "\n".join(decision_lines(run)) + "\n"
        policies[run.policy] = summary = summarize(run, bag["duration_s"], commands, decisions)
        (out / summary["decisions_file"]).write_text(decisions)
        write_predictions(out / summary["predictions_file"], run, commands, bag["start_ns"])
        if "chunks_file" in summary:
            write_chunks(out / summary["chunks_file"], run, commands, bag["start_ns"])
    report = {"schema": SCHEMA, "bag": bag, "config": config, "policies": policies}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))
    write_plots(out, runs, commands, bag_start_ns=bag["start_ns"], deadline_ms=config["deadline_ms"])
    return report


def markdown(report: dict[str, Any]) -> str:
    bag, config, policies = report["bag"], report["config"], report["policies"]
    lines = [f"# Replay of `{bag['path']}`", "", *_bag_section(bag), "", "## Policies", "",
             f"Deadline {config['deadline_ms']:g} ms; cost model `{config['cost_model']}`"
             f"{' (real time)' if config['realtime'] else ''}; model `{config['model_dir']}`, KV arena "
             f"{config['kv_capacity_tokens']} tokens. Every camera frame is one of: a deadline hit, missed, refused, "
             "stale, invalid (the model's output was not finite), dropped (overwritten before the reasoner took it), "
             "no state (no robot state to pair it with, so no observation) or undecodable; the deadline hit rate is "
             "over the observations (decoded frames with their state).", "",
             "| policy | decoded frames | actions | deadline hits | refused | missed | stale | invalid | dropped "
             "| no state | latency p50 / p95 / p99 / max (ms) | memory peak (B) | writes | evictions | compression "
             "| action L1 / RMSE | replay fps (x real time) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, p in policies.items():
        lat = p["latency_ms"]
        latency = " / ".join(f"{lat[k]:.1f}" for k in ("p50", "p95", "p99", "max")) if lat else "-"
        error = p["action_error"]
        err = f"{error['l1_mean']:.3f} / {error['rmse_mean']:.3f}" if error else "-"
        ratio = f"{p['compression_ratio']:.1f}x" if p["compression_ratio"] else "-"
        speed = p["replay"]
        fps = f"{speed['frames_per_s']:.1f} ({speed['x_realtime']:.2f}x)" if speed["frames_per_s"] else "-"
        lines.append(f"| {name} | {p['decoded_frames']} of {p['frames']} | {p['actions']} | {p['deadline_hits']} "
                     f"({100 * p['deadline_hit_rate']:.0f}%) | {p['refused']} | {p['missed']} | {p['stale']} | {p['invalid']} | "
                     f"{p['dropped']} | {p['no_state']} | {latency} | {p['memory_bytes']['peak']:,} | "
                     f"{p['memory_writes']} {p['write_unit']} | {p['evictions']} {p['write_unit']} | {ratio} | {err} | "
                     f"{fps} |")
    invalid = {name: p["invalid"] for name, p in policies.items() if p["invalid"]}
    if invalid:
        lines += ["", "**The model's output was not finite (NaN or Inf)** on "
                  + ", ".join(f"{count} of {policies[name]['decoded_frames']} frames under {name}"
                              for name, count in invalid.items())
                  + ": no action came of them (live, the robot would have been sent none). The checkpoint is "
                  "corrupt or overflows; `vla-edge parity` tells which layer goes bad."]
    bad = next(iter(policies.values()))["bad_frames"] if policies else {}
    if bad:  # decoding does not depend on the policy
        reasons = ", ".join(f"{reason}: {count}" for reason, count in bad.items())
        lines += ["", f"Undecodable frames, skipped as the camera node would and left out of the deadline "
                  f"figures: {sum(bad.values())} ({reasons})."]
    if bag["state"] is not None:
        lines += ["", _state_line(bag["state"], next(iter(policies.values())))]
    if bag["command_topic"] is None:
        lines += ["", "The bag has no command topic: no action error, and actions.png shows the predictions alone."]
    else:
        lines += ["", f"Action error: each action against the command on `{bag['command_topic']}` received nearest "
                  f"to when the action was ready, within {MAX_GAP_MS:g} ms."]
    lines += ["", "## Files", "",
              "- `predictions_<policy>.csv`: one row per camera frame: time, outcome, the action per dimension, "
              "the recorded command it was compared with, the memory's size and the frames it kept and evicted;",
              "- `decisions_<policy>.txt`: the same per frame as one line, byte-identical between two runs under a "
              "fixed cost model;",
              *(["- `chunks_<policy>.csv`: one row per action of each frame's chunk: the moment it is meant for "
                 "and the recorded command nearest to it;"] if any("chunks_file" in p for p in policies.values())
                else []),
              f"- plots: {', '.join(PLOTS)}; `report.json` (schema `{report['schema']}`).", ""]
    return "\n".join(lines)


def _state_line(state: dict[str, Any], policy: dict[str, Any]) -> str:
    """What the robot's state did: where it came from, what was refused, which frames found none (reading and
    pairing do not depend on the policy, so any one tells)."""
    found = " (the bag's only odometry topic: camera_subscriber.state_topic is empty)" if state["found"] else ""
    dropped = {reason: count for reason, count in policy["state_dropped"].items() if count}
    refused = (f", {sum(dropped.values())} refused as the live node refuses them "
               f"({', '.join(f'{reason}: {count}' for reason, count in dropped.items())})" if dropped else "")
    return (f"Robot state: `{state['topic']}` read as {state['state_type']}{found}: {policy['state_messages']} "
            f"messages{refused}. Each frame is paired with the newest good state within state_max_age_ms of its "
            f"stamp, as live; {policy['no_state']} of {policy['decoded_frames']} decoded frames found none, and made "
            "no observation (their reason is in the predictions file).")


def _bag_section(bag: dict[str, Any]) -> list[str]:
    command = (f"recorded command `{bag['command_topic']}` ({bag['command_type']})" if bag["command_topic"]
               else "no recorded command topic")
    state = f"; robot state `{bag['state']['topic']}`" if bag["state"] else ""
    lines = ["## Bag", "",
             f"{bag['duration_s']:.2f} s, {sum(t['messages'] for t in bag['topics'])} messages on "
             f"{len(bag['topics'])} topics. Matched: camera `{bag['image_topic']}` ({bag['frames']} frames, "
             f"{bag['rate_hz']:.1f} Hz); {command}{state}.", "",
             "| topic | type | messages | rate (Hz) | first / last (s) | used as |", "|---|---|---|---|---|---|"]
    for topic in bag["topics"]:
        rate = f"{topic['rate_hz']:.1f}" if topic["rate_hz"] else "-"
        span = f"{topic['first_s']:.2f} / {topic['last_s']:.2f}" if topic["first_s"] is not None else "-"
        lines.append(f"| `{topic['name']}` | `{topic['type']}` | {topic['messages']} | {rate} | {span} | "
                     f"{topic['role'] or '-'} |")
    return lines


def _floats(values: np.ndarray) -> list[float]:
    return [float(v) for v in values]
