"""``vla-edge memory-bench``: does each KV policy still recall a cue after N distractor frames?"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..memory import POLICIES
from ..memory.cosine import SIGNATURES
from ..tools.memory_bench import BenchSpec, format_table, run_bench, write_report
from ..tools.parallel import progress_bar, run_line
from ..worlds.scenes import MAX_CLASSES
from .args import add_parallel_arguments, count, counts, seed, subset_of


def cmd_memory_bench(args: argparse.Namespace) -> int:
    spec = BenchSpec(episodes=args.episodes, distractors=args.distractors, budgets=args.budgets,
                     policies=args.policies, cosine_signatures=args.cosine_signatures, classes=args.classes,
                     seed=args.seed)
    report = run_bench(spec, args.model, args.out, workers=args.workers, ray_address=args.ray, resume=args.resume,
                       progress=lambda line: print(line, file=sys.stderr, flush=True), bar=progress_bar("memory-bench"))
    print(format_table(report))
    print(run_line(report["run"], report["runtime_s"]))
    path = write_report(report, args.out)
    print(f"wrote {path} ({report['runtime_s']:.0f} s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("memory-bench", help="does each KV policy still recall a cue after N distractor frames?")
    p.add_argument("--model", type=Path, help="checkpoint directory (default: a random tiny model in a temp dir)")
    bench = BenchSpec()
    p.add_argument("--episodes", type=count, default=bench.episodes, help="scored episodes per cell")
    p.add_argument("--distractors", type=counts, default=bench.distractors,
                   help="comma-separated numbers of distractor frames N to sweep")
    p.add_argument("--budgets", type=counts, default=bench.budgets,
                   help="comma-separated memory budgets F in frames (fifo, cosine)")
    p.add_argument("--policies", type=subset_of(POLICIES), default=bench.policies)
    p.add_argument("--cosine-signatures", type=subset_of(SIGNATURES), default=bench.cosine_signatures,
                   help="cosine signatures to compare (the first is judged by the claims)")
    p.add_argument("--classes", type=int, choices=range(2, MAX_CLASSES + 1), default=bench.classes, metavar="K",
                   help=f"cue classes, 2..{MAX_CLASSES}")
    p.add_argument("--seed", type=seed, default=bench.seed)
    p.add_argument("--out", type=Path, default=Path("memory_bench_report"),
                   help="directory for memory_bench.json and the per-episode results (units/)")
    add_parallel_arguments(p)
    p.set_defaults(func=cmd_memory_bench)
