"""What inference latency does to a robot, per execution mode: closed-loop evaluation at fixed latencies.

For each latency L (``--latencies``, ms), ``vla-edge evaluate`` runs the task with every mode of
``--execution`` side by side on fixed block costs whose cycle costs exactly L (the encode block takes L less
the decode blocks the model runs, ``reasoner.decode_blocks``, at ``--decode-ms`` each), over the same seeds
in every cell. Writes, under ``--out``:

- ``latency_sweep.md``: a row per latency and mode (success with its 95 % Wilson interval, time to reach,
  jerk, starved share of ticks, distinct commands a second, refusals), the scripted expert's row first;
- ``latency_sweep.png``: success, starved share and jerk against latency, a line per mode;
- ``latency_sweep.json``: the rows; ``L<ms>/evaluate.json``: each evaluation's whole report.

    .venv/bin/python bench/latency_sweep.py --config FILE --task chase --episodes 100 --seed 1000 --out sweep/
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vla_edge_ros.cli.args import counts, frame_budgets, subset_of
from vla_edge_ros.config import EXECUTIONS, Settings, load_settings
from vla_edge_ros.runtime.block_costs import CostModel, parse_cost
from vla_edge_ros.runtime.loader import load_model
from vla_edge_ros.runtime.reasoner import decode_blocks
from vla_edge_ros.tools.evaluate import EXPERT, evaluate, write_report
from vla_edge_ros.worlds.sim.world import TASKS, TaskSpec

LATENCIES_MS = (10, 100, 200, 300, 500)
COLUMNS = ("latency ms", "execution", "success", "95% CI", "t reach s", "jerk", "starved", "cmd/s", "refused")


def cycle_costs(settings: Settings, latency_ms: float, decode_ms: float) -> CostModel:
    """The fixed cost model whose cycle costs ``latency_ms``: ``decode_ms`` per decode block, the rest encode."""
    config = load_model(settings).config
    if config.vl is not None:
        raise ValueError("a Qwen2-VL checkpoint runs a vision block too: sweep it with evaluate --cost")
    encode_ms = latency_ms - decode_blocks(config) * decode_ms
    if encode_ms < 0:
        raise ValueError(f"a {latency_ms:g} ms cycle cannot hold {decode_blocks(config)} decode blocks of "
                         f"{decode_ms:g} ms: lower --decode-ms")
    return parse_cost(f"fixed:encode={encode_ms:g}ms,decode={decode_ms:g}ms")


def sweep(settings: Settings, spec: TaskSpec, latencies: Sequence[float], executions: Sequence[str], out: Path, *,
          policy: str = "fifo", budget: int | None = 16, episodes: int = 20, seed: int = 0, decode_ms: float = 1.0,
          workers: int | None = None, progress: Callable[[str], None] = lambda line: None) -> list[dict[str, Any]]:
    """One evaluation per latency (all ``executions`` side by side in it); the rows of the table, expert first."""
    rows: list[dict[str, Any]] = []
    for latency in latencies:
        costs = cycle_costs(settings, latency, decode_ms)
        progress(f"{latency:g} ms: {costs.describe()}")
        report = evaluate(settings, spec, [policy], [budget], episodes, seed, costs, out / f"L{latency:g}",
                          executions=executions, workers=workers, progress=progress)
        write_report(report, out / f"L{latency:g}")
        for cell in report["cells"]:
            if cell["variant"] == EXPERT and rows:
                continue  # the expert does not depend on the model's latency: its row once
            rows.append({"latency_ms": None if cell["variant"] == EXPERT else latency,
                         **{key: cell[key] for key in ("variant", "execution", "episodes", "success_rate",
                                                       "success_ci95", "time_to_reach_s", "jerk_rms",
                                                       "starved_share", "distinct_commands_hz", "refused")}})
    return rows


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(rows: Sequence[dict[str, Any]], title: str) -> str:
    """The sweep as a markdown table, a row per latency and mode."""
    lines = [title, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        low, high = row["success_ci95"]
        lines.append("| " + " | ".join((
            "-" if row["latency_ms"] is None else f"{row['latency_ms']:g}", row["execution"] or EXPERT,
            f"{row['success_rate']:.2f}", f"[{low:.2f}, {high:.2f}]", _cell(row["time_to_reach_s"], 2),
            _cell(row["jerk_rms"], 0), _cell(row["starved_share"], 3), _cell(row["distinct_commands_hz"], 1),
            str(row["refused"]))) + " |")
    lines += ["", "jerk: RMS over ticks of the commanded velocity's second difference / dt^2 (command units / s^2); "
              "starved: share of ticks stopped because every chunk had run out; cmd/s: distinct commands a second "
              "once warm (docs/evaluation.md)."]
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict[str, Any]], title: str, path: Path) -> None:
    """Success (with its interval), starved share and jerk against latency, a line per mode; the expert dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(dict.fromkeys(row["execution"] for row in rows if row["latency_ms"] is not None))
    expert = next((row for row in rows if row["latency_ms"] is None), None)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = (("success_rate", "success rate (95 % CI)"), ("starved_share", "starved share of ticks"),
              ("jerk_rms", "jerk RMS (command units / s^2)"))
    for ax, (key, label) in zip(axes, panels):
        for mode in modes:
            line = [row for row in rows if row["execution"] == mode and row["latency_ms"] is not None]
            xs = [row["latency_ms"] for row in line]
            ys = [row[key] if row[key] is not None else float("nan") for row in line]
            if key == "success_rate":
                errors = [[y - row["success_ci95"][0] for y, row in zip(ys, line)],
                          [row["success_ci95"][1] - y for y, row in zip(ys, line)]]
                ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=mode)
            else:
                ax.plot(xs, ys, marker="o", label=mode)
        if expert is not None and expert[key] is not None:
            ax.axhline(expert[key], color="grey", linestyle="--", label=EXPERT)
        ax.set(xlabel="inference latency (ms)", ylabel=label)
    axes[0].set_ylim(0, 1.05)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="YAML config (the model: a chunked checkpoint)")
    parser.add_argument("--task", choices=TASKS, default="reach")
    parser.add_argument("--latencies", type=counts, default=LATENCIES_MS, help="cycle latencies in ms, comma-separated")
    parser.add_argument("--execution", type=subset_of(EXECUTIONS), default=("sync", "chunk", "ensemble", "rtc"))
    parser.add_argument("--policy", default="fifo", help="the memory policy variant every cell runs")
    parser.add_argument("--budget", type=frame_budgets, default=[16], help="its memory budget in frames, or all")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit-s", type=float, default=TaskSpec().time_limit_s)
    parser.add_argument("--decode-ms", type=float, default=1.0, help="each decode block's cost (the rest is encode)")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("latency_sweep"))
    args = parser.parse_args(argv)
    if len(args.budget) != 1:
        parser.error("--budget takes one budget")
    try:
        settings = load_settings(args.config)
        spec = TaskSpec(name=args.task, time_limit_s=args.time_limit_s)
        rows = sweep(settings, spec, args.latencies, args.execution, args.out, policy=args.policy,
                     budget=args.budget[0], episodes=args.episodes, seed=args.seed, decode_ms=args.decode_ms,
                     workers=args.workers, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as exc:
        print(f"latency_sweep: error: {exc}", file=sys.stderr)
        return 2
    title = (f"{spec.name}: {args.episodes} episodes a cell, {args.policy} (budget "
             f"{args.budget[0] or 'all'}), model {settings['reasoning']['model_dir']}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latency_sweep.json").write_text(json.dumps(rows, indent=2) + "\n")
    (args.out / "latency_sweep.md").write_text(markdown(rows, title))
    plot(rows, title, args.out / "latency_sweep.png")
    print(markdown(rows, title))
    print(f"wrote {args.out / 'latency_sweep.md'}, latency_sweep.png and latency_sweep.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
