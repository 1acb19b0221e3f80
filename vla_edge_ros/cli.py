"""``vla-edge``: the package's command line (works without a ROS install)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from . import bags_cli, evaluate_cli, kv_store_cli, replay_cli, train_cli
from .config import ConfigError, load_settings
from .memory import POLICIES
from .memory.cosine import SIGNATURES
from .memory_bench import BenchSpec, format_table, run_bench, write_report
from .model.budget import BudgetError
from .model.checkpoint import CheckpointError
from .model.config import ModelConfigError
from .model.init_model import PRESETS, STORAGE_DTYPES, preset, write_random_model
from .model.safetensors_io import SafetensorsError
from .scenes import MAX_CLASSES
from .sim.world import TASKS, TaskSpec

MIN_COSINE = {"numpy": 0.99999, "cuda": 0.999}
USER_ERRORS = (ConfigError, ModelConfigError, CheckpointError, SafetensorsError, BudgetError, ValueError, OSError)


def _token_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"token ids must be comma-separated integers: {text!r}") from exc
    if not ids:
        raise argparse.ArgumentTypeError("at least one token id is needed")
    return ids


def cmd_init_model(args: argparse.Namespace) -> int:
    config = preset(args.preset, args.layers)
    out = write_random_model(args.out, config, seed=args.seed, dtype=args.dtype)
    print(f"wrote {args.preset} ({config.num_hidden_layers} layers, {args.dtype}, seed {args.seed}) to {out}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from .runtime import plan_for

    settings = load_settings(args.config)
    plan, checkpoint = plan_for(settings)
    c = checkpoint.config
    print(f"model      {checkpoint.path} (qwen2, {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
          f"{checkpoint.storage_dtype} on disk)")
    print(plan.table())
    return 0 if plan.fits else 1


def cmd_parity(args: argparse.Namespace) -> int:
    from .parity import run_parity

    report = run_parity(args.model, args.token_ids, args.backend)
    if args.save_logits:
        np.save(args.save_logits, report.last_logits)
    threshold = args.min_cosine if args.min_cosine is not None else MIN_COSINE[report.backend]
    passed = report.worst_cosine() >= threshold
    if args.json:
        print(json.dumps({**report.to_dict(), "min_cosine": threshold, "passed": passed}, indent=2))
    else:
        print(f"parity of {report.model} on {report.backend} against transformers (fp32, CPU), "
              f"{len(report.token_ids)} tokens")
        print(f"  logits                 cosine {report.logits.cosine:.12f}  max|err| {report.logits.max_abs_error:.3e}")
        for index, layer in enumerate(report.layers):
            label = "embeddings" if index == 0 else f"layer {index}" + (" (+norm)" if index == len(report.layers) - 1 else "")
            print(f"  {label:<22} cosine {layer.cosine:.12f}  max|err| {layer.max_abs_error:.3e}")
        print(f"  incremental vs full    cosine {report.incremental.cosine:.12f}  max|err| {report.incremental.max_abs_error:.3e}")
        print(f"  worst cosine {report.worst_cosine():.12f} (bar {threshold}): {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


def cmd_engine(args: argparse.Namespace) -> int:
    from .runtime import load_engine
    from .synthetic import SyntheticCamera

    settings = load_settings(args.config)
    loaded = load_engine(settings)
    engine, plan = loaded.engine, loaded.plan
    c = engine.config
    print(f"engine: {settings['reasoning']['model_dir']} on {plan.backend}, {c.num_hidden_layers} layers, "
          f"{engine.tokens_per_frame} tokens/frame, {c.action.head} head, KV arena {plan.kv_arena_bytes:,} B")
    camera = SyntheticCamera(seed=args.seed)
    totals = []
    for index in range(args.frames):
        result = engine.step(camera.frame())
        totals.append(result.total_ms)
        if index % max(1, args.frames // 10) == 0 or index == args.frames - 1:
            action = np.array2string(result.action, precision=3, separator=", ")
            print(f"frame {index:5d}  cycle {result.total_ms:6.2f} ms (encode {result.encode_ms:.2f}, "
                  f"prefill {result.prefill_ms:.2f}, decode {result.decode_ms:.2f})  kv {engine.arena.used} tokens  "
                  f"action {action}")
    p50, p99 = np.percentile(totals, [50, 99])
    print(f"{args.frames} frames: cycle p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {max(totals):.2f} ms; "
          f"positions stay < {engine.arena.capacity} (next {engine.arena.next_position()})")
    return 0


def _values(status) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


def cmd_run(args: argparse.Namespace) -> int:
    import rclpy

    from .nodes.bringup import Pipeline

    settings = load_settings(args.config)
    if args.image_topic:
        settings["camera_subscriber"]["image_topic"] = args.image_topic
    if args.sim:  # the buffer takes the world's frames as they are (96x96), not resized to a 4:3 camera
        settings["camera_subscriber"]["frame_height"] = settings["camera_subscriber"]["frame_width"] = TaskSpec().image_size
    rclpy.init()
    pipeline = None
    try:
        pipeline = Pipeline(settings, synthetic_camera=args.image_topic is None and args.sim is None,
                            camera_rate_hz=args.camera_rate_hz, use_sim_time=args.use_sim_time, sim_task=args.sim)
        engine = pipeline.reasoning.engine
        source = (f" (simulated robot, {args.sim})" if args.sim else
                  f" (synthetic, {args.camera_rate_hz:.0f} Hz)" if args.image_topic is None else "")
        print(f"vla-edge run: {settings['reasoning']['model_dir']} on {pipeline.plan.backend}, camera "
              f"{settings['camera_subscriber']['image_topic']}{source}, deadline "
              f"{settings['reasoning']['deadline_ms']:.1f} ms, commands on {settings['action_publisher']['command_topic']}"
              f" ({settings['action_publisher']['command_type']}), KV arena {engine.arena.capacity} tokens, "
              f"memory policy {engine.policy.name}")
        loaded = pipeline.loaded
        if loaded.store is not None:
            print(f"KV store {loaded.store.directory} ({'aes-256-gcm' if loaded.store.encrypted else 'PLAIN'}): "
                  f"prompt {'loaded from the store' if loaded.prompt_from_store else 'prefilled'}, episode memory "
                  f"{'restored' if loaded.memory_restored else 'starts empty'}")

        def status_line() -> None:
            camera, reasoning = _values(pipeline.camera.report()), _values(pipeline.reasoning.report())
            publisher = _values(pipeline.publisher.report())
            print(f"in {camera['input_fps']} fps, dropped {camera['dropped']} (+{camera['buffer_overwritten_unread']} "
                  f"unread) | actions {reasoning['actions']}, refused {reasoning['refused']}, stale {reasoning['stale']}, "
                  f"missed {reasoning['missed']}, latency p50 {reasoning['latency_p50_ms']} p99 "
                  f"{reasoning['latency_p99_ms']} ms | kv {reasoning['kv_policy']} {reasoning['kv_tokens']} tokens, "
                  f"{reasoning['kv_bytes']} B (+{reasoning['memory_state_bytes']} B state) | "
                  f"published {publisher['published']}, safe stops {publisher['safe_stops']}"
                  + (f" | sim {pipeline.sim.successes}/{pipeline.sim.episodes} reached" if pipeline.sim else ""), flush=True)

        pipeline.run(args.duration, every_second=status_line)
        summary = {node.get_name(): {"level": int.from_bytes(report.level, "little"), "message": report.message,
                                     **_values(report)}
                   for node, report in ((n, n.report()) for n in (pipeline.camera, pipeline.reasoning, pipeline.publisher))}
        if pipeline.sim is not None:
            sim = pipeline.sim
            summary["sim_world"] = {"task": args.sim, "episodes": sim.episodes, "successes": sim.successes,
                                    "mean_time_to_reach_s": float(np.mean(sim.times_to_reach)) if sim.times_to_reach
                                    else None}
        print("summary: " + json.dumps(summary, indent=2))
        if args.summary_json:
            args.summary_json.write_text(json.dumps(summary, indent=2) + "\n")
    finally:
        if pipeline is not None:
            pipeline.shutdown()
        if rclpy.ok():
            rclpy.shutdown()
    return 0


def _count(text: str, minimum: int = 1) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from exc
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
    return value


def _counts(text: str) -> tuple[int, ...]:
    values = tuple(_count(part) for part in text.split(",") if part.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def _seed(text: str) -> int:
    return _count(text, minimum=0)


def cmd_memory_bench(args: argparse.Namespace) -> int:
    spec = BenchSpec(episodes=args.episodes, distractors=args.distractors, budgets=args.budgets,
                     policies=args.policies, cosine_signatures=args.cosine_signatures, classes=args.classes,
                     seed=args.seed)
    report = run_bench(spec, args.model, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(format_table(report))
    path = write_report(report, args.out)
    print(f"wrote {path} ({report['runtime_s']:.0f} s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vla-edge", description="Vision-Language-Action engine for ROS 2 robots.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("init-model", help="write a randomly initialised checkpoint in HuggingFace format")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--layers", type=int, help="override the number of layers (e.g. a slice of the 1.5B shape)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=STORAGE_DTYPES, default="bfloat16")
    p.set_defaults(func=cmd_init_model)

    p = sub.add_parser("plan", help="print the memory plan of a config against its budget_bytes")
    p.add_argument("--config", type=Path, help="YAML config (default: built-in defaults)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("parity", help="compare our forward pass with HuggingFace transformers")
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--backend", choices=sorted(MIN_COSINE), default="numpy")
    p.add_argument("--token-ids", required=True, type=_token_ids)
    p.add_argument("--save-logits", type=Path, help="write our last-position logits (float32 [vocab]) as .npy")
    p.add_argument("--min-cosine", type=float, help="pass bar (default 0.99999 numpy, 0.999 cuda)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_parity)

    p = sub.add_parser("run", help="start the three ROS 2 nodes (and a synthetic camera) in this process")
    p.add_argument("--config", type=Path, help="YAML config (default: built-in defaults)")
    p.add_argument("--duration", type=float, help="seconds to run (default: until Ctrl-C or SIGTERM)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--image-topic", help="listen to this camera topic instead of starting the synthetic camera")
    source.add_argument("--sim", choices=TASKS, help="close the loop through the 2-D world (a simulated robot: "
                        "its camera in, the commands out) instead of the synthetic camera")
    p.add_argument("--camera-rate-hz", type=float, default=30.0, help="synthetic camera frame rate")
    p.add_argument("--summary-json", type=Path, help="also write the final summary here")
    p.add_argument("--use-sim-time", action="store_true",
                   help="follow /clock, e.g. from `vla-edge play BAG --clock 100` (with --image-topic)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("engine", help="run the engine alone (no ROS, no deadline) on synthetic frames; print timings")
    p.add_argument("--config", type=Path, help="YAML config (default: built-in defaults)")
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_engine)

    p = sub.add_parser("memory-bench", help="does each KV policy still recall a cue after N distractor frames?")
    p.add_argument("--model", type=Path, help="checkpoint directory (default: a random tiny model in a temp dir)")
    bench = BenchSpec()
    p.add_argument("--episodes", type=_count, default=bench.episodes, help="scored episodes per cell")
    p.add_argument("--distractors", type=_counts, default=bench.distractors,
                   help="comma-separated numbers of distractor frames N to sweep")
    p.add_argument("--budgets", type=_counts, default=bench.budgets,
                   help="comma-separated memory budgets F in frames (fifo, cosine)")
    p.add_argument("--policies", type=replay_cli.subset_of(POLICIES), default=bench.policies)
    p.add_argument("--cosine-signatures", type=replay_cli.subset_of(SIGNATURES), default=bench.cosine_signatures,
                   help="cosine signatures to compare (the first is judged by the claims)")
    p.add_argument("--classes", type=int, choices=range(2, MAX_CLASSES + 1), default=bench.classes, metavar="K",
                   help=f"cue classes, 2..{MAX_CLASSES}")
    p.add_argument("--seed", type=_seed, default=bench.seed)
    p.add_argument("--out", type=Path, default=Path("."), help="directory for memory_bench.json")
    p.set_defaults(func=cmd_memory_bench)

    kv_store_cli.register(sub)
    bags_cli.register(sub)
    replay_cli.register(sub)
    evaluate_cli.register(sub)
    train_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        print(f"vla-edge {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
