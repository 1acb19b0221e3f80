"""``vla-edge evaluate``: closed-loop task success per KV policy variant and memory budget, in the 2-D simulator
or on Meta-World's arm (``--task mt10``, ``--task metaworld/<task>``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import EXECUTIONS, load_settings
from ..memory import POLICIES
from ..tools.arm_evaluate import evaluate_arm, format_arm_table
from ..tools.arm_world import MT10_TASK, PREFIX, arm_tasks, is_arm_task
from ..tools.evaluate import VARIANTS, evaluate, format_table, invalid_line, write_json, write_report
from ..tools.lang_reach import read_templates
from ..tools.parallel import progress_bar, run_line
from ..worlds.metaworld.spec import MAX_PATH_LENGTH
from ..worlds.sim.world import TASKS, TaskSpec
from .args import add_parallel_arguments, cost_model, frame_budgets, subset_of


ARM_POLICIES, ARM_BUDGETS = ["fifo"], [16]  # Meta-World's defaults: one memory row (its tasks need no memory yet)


def task_name(text: str) -> str:
    """``--task``: a 2-D world task, ``mt10`` or ``metaworld/<task>`` (checked against Meta-World's names)."""
    if text in TASKS:
        return text
    try:
        arm_tasks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; the 2-D world's are {', '.join(TASKS)}") from None
    return text


def cmd_evaluate(args: argparse.Namespace) -> int:
    if is_arm_task(args.task):
        return _evaluate_arm(args)
    if args.max_steps is not None or args.goal_shown_s is not None:
        raise ValueError("--max-steps and --goal-shown-s are Meta-World's; the 2-D world's tasks take --time-limit-s "
                         "(and cue-reach shows its cue for a while of its own)")
    settings = load_settings(args.config)
    time_limit = TaskSpec().time_limit_s if args.time_limit_s is None else args.time_limit_s
    spec = TaskSpec(name=args.task, time_limit_s=time_limit)
    templates = read_templates(args.instructions) if args.instructions is not None else ()
    policy = list(POLICIES) if args.policy is None else args.policy
    budgets = [4, 16, None] if args.budgets is None else args.budgets
    report = evaluate(settings, spec, policy, budgets, args.episodes, args.seed, args.cost, args.out,
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


def _evaluate_arm(args: argparse.Namespace) -> int:
    """Meta-World: each task through the same evaluation, one table over them (``tools/arm_evaluate.py``)."""
    if args.time_limit_s is not None:
        raise ValueError("--time-limit-s is the 2-D world's; Meta-World's episodes end at --max-steps steps")
    if args.instructions is not None:
        raise ValueError(f"{args.task}: --instructions is for lang-reach; Meta-World's instruction is each task's "
                         "description")
    settings = load_settings(args.config)
    tasks = arm_tasks(args.task, max_steps=MAX_PATH_LENGTH if args.max_steps is None else args.max_steps,
                      goal_shown_s=args.goal_shown_s)
    report = evaluate_arm(settings, tasks, ARM_POLICIES if args.policy is None else args.policy,
                          ARM_BUDGETS if args.budgets is None else args.budgets, args.episodes, args.seed, args.cost,
                          args.out, args.record, executions=args.execution or (), workers=args.workers,
                          ray_address=args.ray, resume=args.resume,
                          progress=lambda line: print(line, file=sys.stderr, flush=True),
                          bar=progress_bar("evaluate"))
    print(format_arm_table(report))
    print(f"wrote {write_json(report, args.out)} and each task's report in its folder "
          f"({report['runtime_s']:.0f} s)")
    invalid = [(task["task"]["task"], cell) for task in report["tasks"] for cell in task["cells"] if cell["invalid"]]
    for task, cell in invalid:
        print(f"vla-edge evaluate: error: {task}: {cell['variant']}: {invalid_line(cell)}", file=sys.stderr)
    return 2 if invalid else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="closed-loop task success per KV policy and budget in the 2-D simulator or "
                       "on Meta-World")
    p.add_argument("--task", type=task_name, default="cue-reach", metavar="TASK",
                   help=f"a 2-D world task ({', '.join(TASKS)}), {MT10_TASK} (Meta-World's ten MT10 tasks) or "
                        f"{PREFIX}<task> (one Meta-World task, e.g. {PREFIX}push-v3)")
    p.add_argument("--policy", type=subset_of(VARIANTS), default=None,
                   help=f"comma-separated policy variants ({','.join(VARIANTS)}): aura and dms use the checkpoint's "
                        "learned gate if it has one, aura:surprise and dms:novelty their scores, aura:random and "
                        "aura:periodic no score; these three aura:* rows write at the rate the aura row measured (aura "
                        "is added if missing); aura:no-write never writes (the memory ablated). Default: "
                        f"{','.join(POLICIES)} (Meta-World: fifo)")
    p.add_argument("--budgets", type=frame_budgets, default=None,
                   help="comma-separated memory budgets in frames, 'all' for an arena that holds a whole episode; a "
                        "budget bounds all a policy holds (dms's window comes out of it). Default 4,16,all "
                        "(Meta-World: 16)")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit-s", type=float, default=None,
                   help=f"the 2-D world's episode length (default {TaskSpec().time_limit_s:g} s)")
    p.add_argument("--max-steps", type=int, default=None, metavar="N",
                   help=f"Meta-World: an episode ends at success or after N steps of 12.5 ms (default "
                        f"{MAX_PATH_LENGTH}, Meta-World's limit)")
    p.add_argument("--goal-shown-s", type=float, default=None, metavar="SECONDS",
                   help="Meta-World: draw the goal marker (reach's and push's ball) only for the first SECONDS of each "
                        "episode, so the policy must remember where it was (default: always drawn)")
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
                   help="also write the scripted expert's episodes as bags here (camera, the robot's state: "
                        "odometry, or the arm's JointState; the expert's command), one per task and seed")
    p.add_argument("--out", type=Path, default=Path("evaluate_report"))
    add_parallel_arguments(p)
    p.set_defaults(func=cmd_evaluate)
