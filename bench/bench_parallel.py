"""Speed-up of --workers and --ray on evaluate, replay and memory-bench, measured side by side in one run.

Each command runs with --workers 1 (this process), --workers 2 (local processes) and --workers 2 --ray (a
local Ray instance of 2 CPUs), one after the other, on the same inputs with fixed block costs (so every
run does the same work and writes the same report, which is checked). Prints wall times, the speed-up over
one worker, and Ray's overhead against plain processes.

    .venv/bin/python bench/bench_parallel.py [--episodes 4] [--bag-seconds 20] [--commands replay]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIXED = "fixed:encode=8ms,decode=1ms"
SETUPS = {"1 worker": ["--workers", "1"], "2 workers": ["--workers", "2"], "ray, 2 CPUs": ["--workers", "2", "--ray"]}


def vla_edge(*args: str) -> float:
    """Run ``vla-edge ARGS``; its wall time in seconds (a failure ends the benchmark)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "vla_edge_ros", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"vla-edge {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def without_timing(path: Path) -> str:
    report = json.loads(path.read_text())
    report.pop("runtime_s", None), report.pop("run", None)
    for policy in report.get("policies", {}).values():
        policy.pop("replay", None)
    for row in report.get("overhead", []):
        row.pop("policy_ms", None), row.pop("add_frame_ms", None)
    return json.dumps(report, sort_keys=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4, help="evaluate: episodes per cell")
    parser.add_argument("--bag-seconds", type=float, default=20.0, help="replay: length of each of the two bags")
    parser.add_argument("--commands", default="evaluate,replay,memory-bench",
                        help="comma-separated subset of evaluate, replay, memory-bench")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vla-bench-parallel-"))
    bags = [work / "moving.mcap", work / "cue.mcap"]
    vla_edge("make-bag", "--scenario", "moving", "--out", str(bags[0]), "--seconds", str(args.bag_seconds),
             "--size", "160x120")
    vla_edge("make-bag", "--scenario", "cue-recall", "--out", str(bags[1]), "--seconds", str(args.bag_seconds))
    jobs = {
        "evaluate": (["evaluate", "--policy", "fifo,cosine,aura,dms", "--budgets", "4,all", "--episodes",
                      str(args.episodes), "--cost", FIXED], "evaluate.json"),
        "replay": (["replay", *map(str, bags), "--policy", "fifo,cosine,aura,dms", "--cost", FIXED],
                   "00_moving/report.json"),
        "memory-bench": (["memory-bench", "--episodes", "8", "--distractors", "4,16", "--budgets", "4,8"],
                         "memory_bench.json"),
    }
    # untimed: the first run of a fresh checkout JIT-compiles and caches the Numba functions, which would
    # otherwise be charged to whichever setup runs first (the single worker)
    vla_edge("evaluate", "--policy", "fifo,cosine,aura,dms", "--budgets", "4", "--episodes", "1", "--cost", FIXED,
             "--out", str(work / "warm-up"))
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    print(f"{'command':<13} {'setup':<12} {'wall s':>7} {'speed-up':>8}")
    for name, (command, report) in jobs.items():
        if name not in args.commands.split(","):
            continue
        times, reports = {}, set()
        for setup, flags in SETUPS.items():
            out = work / f"{name}-{setup.replace(' ', '').replace(',', '')}"
            times[setup] = vla_edge(*command, *flags, "--out", str(out))
            reports.add(without_timing(out / report))
            print(f"{name:<13} {setup:<12} {times[setup]:>7.1f} {times['1 worker'] / times[setup]:>7.2f}x", flush=True)
        same = "the same report" if len(reports) == 1 else "DIFFERENT REPORTS"
        print(f"{name:<13} Ray's overhead over plain processes: {times['ray, 2 CPUs'] - times['2 workers']:+.1f} s "
              f"({times['ray, 2 CPUs'] / times['2 workers']:.2f}x); {same} from all three")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
