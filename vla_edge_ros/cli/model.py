"""``vla-edge init-model | plan | parity | engine``: checkpoints, memory plans, proof, the engine alone."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ..config import choices_of, load_settings
from ..model.config import ACTION_HEADS
from ..model.init_model import PRESETS, STORAGE_DTYPES, preset, write_random_model
from ..model.known_models import KNOWN_MODELS
from ..numerics.weight_formats import DEFAULT_INT4_GROUP, INT4_GROUPS
from .args import image_size, token_ids



def cmd_init_model(args: argparse.Namespace) -> int:
    config = preset(args.preset, args.layers, cameras=args.cameras, state_dim=args.state_dim, head=args.head,
                    chunk=args.chunk, dof=args.dof)
    out = write_random_model(args.out, config, seed=args.seed, dtype=args.dtype)
    seen = f"{config.cameras} camera{'s' if config.cameras > 1 else ''}" + (
        f" + a {config.state.dim}-value state" if config.state else "")
    action = config.action
    acts = f"{action.head} head, {action.chunk} action{'s' if action.chunk > 1 else ''} of {action.dof} a cycle"
    print(f"wrote {args.preset} ({config.num_hidden_layers} layers, {seen}, {acts}, {args.dtype}, seed {args.seed}) "
          f"to {out}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from ..model.budget import edge_table
    from ..runtime.loader import check_settings, plan_for, plan_known

    settings = load_settings(args.config)
    if args.known_model:
        plan, config = plan_known(settings, args.known_model)
        where, stored = f"{args.known_model}: public config.json, no weights", "bf16"
        held = settings["reasoning"]["weights"].replace("auto", "bfloat16 (as stored)")
    else:
        plan, checkpoint = plan_for(settings)
        check_settings(settings, checkpoint)  # what `run` would refuse, refused here with the same line
        config, where, stored, held = checkpoint.config, str(checkpoint.path), checkpoint.storage_dtype, \
            checkpoint.held_as
    family = config.vl.family if config.vl else "qwen2"
    print(f"model      {where} ({family}, {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
          f"{stored} on disk, held as {held})")
    v = config.vision
    if config.vl:
        print(f"frames     {v.image_size}x{v.image_size} (reasoning.vision_max_pixels "
              f"{settings['reasoning']['vision_max_pixels']}): {v.tokens_per_frame} tokens each, "
              f"{plan.kv_bytes_per_token * v.tokens_per_frame:,} B of KV")
    state = f" + 1 state token ({config.state.dim} values)" if config.state else ""
    print(f"observation {config.cameras} camera{'s' if config.cameras > 1 else ''} x {v.tokens_per_frame} tokens"
          f"{state} = {config.observation_tokens} tokens, {plan.kv_bytes_per_observation:,} B of KV")
    print(plan.table())
    print(f"against edge memory (the same plan):\n{edge_table(plan)}")
    return 0 if plan.fits else 1


def cmd_parity(args: argparse.Namespace) -> int:
    from ..tools.parity import pass_bar, run_parity

    report = run_parity(args.model, args.token_ids, args.backend, image_size=args.image_size, seed=args.seed,
                        allow_nonfinite=args.allow_nonfinite_weights, weights=args.weights,
                        weights_group=args.weights_group)
    if args.save_logits:
        np.save(args.save_logits, report.last_logits)
    threshold = args.min_cosine if args.min_cosine is not None else pass_bar(report)
    passed = report.worst_cosine() >= threshold
    if args.json:
        print(json.dumps({**report.to_dict(), "min_cosine": threshold, "passed": passed}, indent=2))
    else:
        grids = ", ".join("x".join(map(str, grid)) for grid in report.image_grid_thw)
        images = f", {len(report.image_grid_thw)} images (t x h x w patches: {grids})" if grids else ""
        print(f"parity of {report.model} on {report.backend} ({report.weights} weights) against transformers "
              f"(fp32, CPU), "
              f"{len(report.token_ids)} tokens{images}")
        for label, agreement in report.agreements().items():
            print(f"  {label:<22} " + (agreement.nonfinite() or
                                      f"cosine {agreement.cosine:.12f}  max|err| {agreement.max_abs_error:.3e}"))
        bad = report.nonfinite()
        if bad:
            print(f"  outputs are not finite, first at {bad[0]}")
        print(f"  worst cosine {report.worst_cosine():.12f} (bar {threshold}): {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


def cmd_engine(args: argparse.Namespace) -> int:
    from ..runtime.loader import load_engine
    from ..worlds.synthetic import SyntheticCamera

    settings = load_settings(args.config)
    loaded = load_engine(settings)
    engine, plan = loaded.engine, loaded.plan
    c = engine.config
    print(f"engine: {settings['reasoning']['model_dir']} on {plan.backend}, {c.num_hidden_layers} layers, "
          f"{c.observation_tokens} tokens/observation, {c.action.head} head, KV arena {plan.kv_arena_bytes:,} B")
    primary, *extra = (SyntheticCamera(seed=args.seed + i) for i in range(c.cameras))
    state = None if engine.state_proj is None else engine.state_proj.mean
    if state is not None:
        print("state: the checkpoint's mean, every frame (synthetic, as the frames are)")
    totals = []
    for index in range(args.frames):
        result = engine.step(primary.frame(), tuple(camera.frame() for camera in extra), state)
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


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("init-model", help="write a randomly initialised checkpoint in HuggingFace format")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--layers", type=int, help="override the number of layers (e.g. a slice of the 1.5B shape)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=STORAGE_DTYPES, default="bfloat16")
    p.add_argument("--cameras", type=int, default=1,
                   help="camera frames per observation (default 1): camera_subscriber.extra_image_topics names the rest")
    p.add_argument("--state-dim", type=int, default=0, metavar="N",
                   help="read an N-value robot state as one token (state_proj, random; vla.state) (default: no state)")
    p.add_argument("--head", choices=ACTION_HEADS,
                   help="the action head (default: the preset's); mlp: a continuous chunk head, hidden as wide as "
                   "the decoder")
    p.add_argument("--chunk", type=int, default=1, metavar="H",
                   help="actions a cycle, one control period apart (vla.action.chunk; default 1; more needs the mlp head, "
                   "or bins decoded in parallel)")
    p.add_argument("--dof", type=int, metavar="N",
                   help="values of each action (vla.action.dof; default: the preset's): 4 for the Meta-World arm "
                   "(dx, dy, dz, grip), which no preset has")
    p.set_defaults(func=cmd_init_model)

    p = sub.add_parser("plan", help="print the memory plan of a config against its budget_bytes and edge memory")
    p.add_argument("--config", type=Path, help="YAML config (default: built-in defaults)")
    p.add_argument("--known-model", choices=sorted(KNOWN_MODELS),
                   help="plan a real checkpoint's shapes by name (bf16 weights, cuda backend) instead of model_dir")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("parity", help="compare our forward pass with HuggingFace transformers")
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--backend", choices=("cuda", "numpy"), default="numpy")
    p.add_argument("--weights", choices=choices_of("reasoning", "weights"), default="auto",
                   help="hold our matrices in this format (reasoning.weights; default auto: as stored)")
    p.add_argument("--weights-group", type=int, choices=INT4_GROUPS, default=DEFAULT_INT4_GROUP,
                   help=f"int4: inputs per scale (default {DEFAULT_INT4_GROUP})")
    p.add_argument("--token-ids", required=True, type=token_ids,
                   help="prompt ids, comma-separated; 'img' places a random image (VL checkpoints)")
    p.add_argument("--image-size", type=image_size, default=(56, 56), metavar="HxW",
                   help="size of each random image before the image processor (default 56x56)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random images")
    p.add_argument("--save-logits", type=Path, help="write our last-position logits (float32 [vocab]) as .npy")
    p.add_argument("--min-cosine", type=float, help="pass bar (default 0.99999 numpy, 0.999 cuda; with weights "
                   "that round the stored ones, at most 0.9999 bfloat16, 0.999 int8, 0.99 int4)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--allow-nonfinite-weights", action="store_true",
                   help="debugging: load weights holding NaN or Inf (refused otherwise) to see where outputs go bad")
    p.set_defaults(func=cmd_parity)

    p = sub.add_parser("engine", help="run the engine alone (no ROS, no deadline) on synthetic frames; print timings")
    p.add_argument("--config", type=Path, help="YAML config (default: built-in defaults)")
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_engine)
