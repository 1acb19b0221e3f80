"""``vla-edge evaluate``: closed-loop task success per KV policy variant and memory budget in the simulator."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import EXECUTIONS, load_settings
from ..memory import POLICIES
from ..tools.evaluate import VARIANTS, evaluate, format_table, invalid_line, write_report
from ..tools.lang_reach import read_templates
from ..tools.parallel import progress_bar, run_line
from ..worlds.sim.world import TASKS, TaskSpec
from .args import add_parallel_arguments, cost_model, frame_budgets, subset_of


def cmd_evaluate(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    spec = TaskSpec(name=args.task, time_limit_s=args.time_limit_s)
    templates = read_templates(args.instructions) if args.instructions is not None else ()
    report = evaluate(settings, spec, args.policy, args.budgets, args.episodes, args.seed, args.cost, args.out,
                      record_dir=args.record, templates=templates, executions=args.execution or (),
                      workers=args.workers, ray_address=args.ray,
                      resume=args.resume,
                      progress=lambda line: print(line, file=sys.stderr, flush=True),
                      bar=progress_bar("evaluate"))
    print(format_table(report))
    print(run_line(report["run"], report["runtime_s"]))
    print(f"wrote {write_report(report, args.out)} and success.png ({report['runtime_s']:.0f} s)")
    invalid = [cell for cell in report["cells"] if cell["invalid"]]
    for cell in invalid:
        print(f"vla-edge evaluate: error: {cell['variant']}: {invalid_line(cell)}", file=sys.stderr)
    return 2 if invalid else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="closed-loop task success per KV policy and budget in the 2-D simulator")
    p.add_argument("--task", choices=TASKS, default="cue-reach")
    p.add_argument("--policy", type=subset_of(VARIANTS), default=list(POLICIES),
                   help=f"comma-separated policy variants ({','.join(VARIANTS)}): aura and dms use the checkpoint's "
                        "learned gate if it has one, aura:surprise and dms:novelty their scores, aura:random and "
                        "aura:periodic no score; these three aura:* rows write at the rate the aura row measured (aura "
                        "is added if missing); aura:no-write never writes (the memory ablated)")
    p.add_argument("--budgets", type=frame_budgets, default=[4, 16, None],
                   help="comma-separated memory budgets in frames, 'all' for an arena that holds a whole episode; a "
                        "budget bounds all a policy holds (dms's window comes out of it)")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit-s", type=float, default=TaskSpec().time_limit_s)
    p.add_argument("--instructions", type=Path, metavar="FILE",
                   help="lang-reach: instruction templates, one a line with {color} (never ones the model was "
                        "trained on); each seed draws one")
    p.add_argument("--config", type=Path, help="YAML config (model, deadline, action mapping)")
    p.add_argument("--cost", type=cost_model, default=cost_model("measured"),
                   help="block costs: measured (default) or fixed:encode=4ms,decode=1ms (deterministic)")
    p.add_argument("--execution", type=subset_of(EXECUTIONS), default=None,
                   help=f"comma-separated action_publisher.execution modes ({','.join(EXECUTIONS)}) run side by side, "
                        "a cell each per policy and budget (default: the configured one); with a chunked checkpoint "
                        "the gate plans cycles on the chunk's horizon in every mode but sync")
    p.add_argument("--record", type=Path,
                   help="also write each episode (camera, odometry, expert command) as a bag here")
    p.add_argument("--out", type=Path, default=Path("evaluate_report"))
    add_parallel_arguments(p)
    p.set_defaults(func=cmd_evaluate)
