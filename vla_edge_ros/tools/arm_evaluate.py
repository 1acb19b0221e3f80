"""``vla-edge evaluate --task mt10`` (or ``metaworld/<task>``): the closed-loop evaluation of ``evaluate.py``, run
on each Meta-World task in turn, and one report over them.

Nothing here runs an episode: each task is one ``evaluate`` call (its units, workers, resume, cells, the
scripted expert's row as the ceiling) on an ``ArmTask``, writing ``<out>/<task>/`` as the 2-D world's evaluation
writes ``<out>/``. What this adds is the table over tasks (success with its 95 % Wilson interval, episode
length in steps, the runtime's figures) and the average over tasks per row, pooled over every episode, as
MT10 is reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..config import Settings
from ..runtime.block_costs import CostModel
from ..runtime.loader import load_model
from ..worlds.metaworld import check_goal_marker
from ..worlds.metaworld.backend import load as load_backend
from .arm_world import ARM_RATE_HZ, ArmTask, arm_observation
from .evaluate import evaluate, success_counts, write_report

SCHEMA = "vla_edge_ros.evaluate_arm/1"


def evaluate_arm(settings: Settings, tasks: Sequence[ArmTask], variants: Sequence[str],
                 budgets: Sequence[int | None], episodes: int, seed: int, costs: CostModel, out: Path,
                 record_dir: Path | None = None, *,
                 executions: Sequence[str] = (), workers: int | None = None, ray_address: str | None = None,
                 resume: bool = False, progress: Callable[[str], None] = lambda line: None,
                 bar: Callable[[int, int], None] = lambda done, total: None) -> dict[str, Any]:
    """Each task's ``evaluate`` report (the same seeds in every task), written to ``out/<task>/``, and the
    average over tasks; returns the combined report (``evaluate.write_json`` writes it to ``out``). With
    ``record_dir`` the scripted expert's episodes are also bags there, ``<task>_<seed>.mcap``."""
    # what cannot run at all is refused before the first task starts: a checkpoint that does not fit the arm, a
    # machine without Meta-World or OSMesa (each one line)
    arm_observation(settings, load_model(settings).config, tasks[0], "evaluate")
    load_backend()
    for task in tasks:  # a goal to hide must be drawn in the first place
        check_goal_marker(task.arm)
    reports = []
    for task in tasks:
        progress(f"{task.name}: \"{task.description}\" ({episodes} episodes a row, "
                 f"seeds {seed}..{seed + episodes - 1})")
        report = evaluate(settings, task, variants, budgets, episodes, seed, costs, out / task.task, record_dir,
                          executions=executions, workers=workers, ray_address=ray_address, resume=resume,
                          progress=progress, bar=bar)
        write_report(report, out / task.task)
        reports.append(report)
    return {"schema": SCHEMA, "tasks": reports, "average": average(reports), "episodes": episodes, "seed": seed,
            "rate_hz": ARM_RATE_HZ, "cost_model": costs.describe(),
            "runtime_s": sum(report["runtime_s"] for report in reports)}


def row_key(cell: dict[str, Any]) -> tuple[str, int | None, str | None]:
    """What makes a row the same row in every task: variant, budget, execution mode."""
    return cell["variant"], cell["budget_frames"], cell["execution"]


def average(reports: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per row, over tasks: the mean of the tasks' success rates, and every episode pooled (successes, rate and its
    Wilson interval: what 'MT10 success' means when every task runs the same number of episodes)."""
    rows: dict[tuple, list[dict[str, Any]]] = {}
    for report in reports:
        for cell in report["cells"]:
            rows.setdefault(row_key(cell), []).append(cell)
    averaged = []
    for (variant, budget, execution), cells in rows.items():
        wins = sum(round(c["success_rate"] * c["episodes"]) for c in cells)
        total = sum(c["episodes"] for c in cells)
        pooled = success_counts(wins, total)
        averaged.append({"variant": variant, "budget_frames": budget, "execution": execution, "tasks": len(cells),
                         "mean_task_success": sum(c["success_rate"] for c in cells) / len(cells), "pooled": pooled})
    return averaged


def _label(cell: dict[str, Any]) -> str:
    if cell["execution"] is None:
        return cell["variant"]
    return f"{cell['variant']}/{'all' if cell['budget_frames'] is None else cell['budget_frames']}"


def _figure(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_arm_table(report: dict[str, Any]) -> str:
    """One row per task and row (the expert first), then the average over tasks."""
    lines = [f"Meta-World: {report['episodes']} episodes a row per task (seeds {report['seed']}.."
             f"{report['seed'] + report['episodes'] - 1}), {report['rate_hz']:.0f} steps a second, one action a step, "
             f"cost model {report['cost_model']}" + "".join(sorted({
                 f", the goal marker drawn for the first {task['task']['goal_shown_s']:g} s only"
                 for task in report["tasks"] if task["task"].get("goal_shown_s") is not None})),
             f"{'task':<24} {'row':>12} {'exec':>8} {'success':>7} {'95% CI':>13} {'steps':>6} {'steps ok':>8} "
             f"{'refused':>7} {'missed':>6} {'starved':>7} {'cmd/s':>5} {'jerk':>7} {'invalid':>7}"]
    for task in report["tasks"]:
        for c in task["cells"]:
            low, high = c["success_ci95"]
            ticks = c["episode_ticks"]
            lines.append(f"{task['task']['task']:<24} {_label(c):>12} {c['execution'] or '-':>8} "
                         f"{c['success_rate']:>7.2f} [{low:.2f}, {high:.2f}] "
                         f"{_figure(ticks['mean'], 1):>6} {_figure(ticks['success_mean'], 1):>8} "
                         f"{c['refused']:>7} {c['missed']:>6} {_figure(c['starved_share'], 3):>7} "
                         f"{_figure(c['distinct_commands_hz'], 1):>5} {_figure(c['jerk_rms'], 0):>7} {c['invalid']:>7}")
    for row in report["average"]:
        pooled = row["pooled"]
        low, high = pooled["ci95"]
        over = f"average ({row['tasks']} tasks)"
        lines.append(f"{over:<24} {_label(row):>12} {row['execution'] or '-':>8} "
                     f"{pooled['rate']:>7.2f} [{low:.2f}, {high:.2f}]")
    for task in report["tasks"]:
        units = sum(c["episodes"] for c in task["cells"])
        lines.append(f"{task['task']['task']}: {units} episodes in {task['runtime_s']:.1f} s "
                     f"({task['runtime_s'] / max(units, 1):.2f} s an episode, wall)"
                     + "".join(f"; note: {note}" for note in task["notes"]))
    lines.append("steps: mean episode length in steps (12.5 ms each), over all episodes / the successful ones; "
                 "starved, cmd/s, jerk: as in the 2-D world's table (the command is the 4-D action)")
    return "\n".join(lines)

