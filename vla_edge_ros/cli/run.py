"""``vla-edge run``: the three ROS 2 nodes in this process, fed by a camera topic, a synthetic camera, the
simulated robot or the simulated Meta-World arm; one status line a second, then a summary. The managed nodes
come up active; `ros2 lifecycle` (or a ChangeState call) may deactivate, clean up and configure them again
while it runs, and the status line then says which state reasoning is in."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..config import Settings, load_settings
from ..tools.arm_world import CAMERA_RATE_HZ, PREFIX, arm_tasks
from ..worlds.sim.world import TASKS, TaskSpec
from ..worlds.synthetic import RATE_HZ as SYNTHETIC_RATE_HZ


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def status_line(camera: dict, reasoning: dict, publisher: dict, sim: str = "") -> str:
    """One line a second from the nodes' figures (reasoning's engine figures only while it has an engine)."""
    state = "" if reasoning["state"] == "active" else f"reasoning {reasoning['state']} | "
    thinking = "" if "actions" not in reasoning else (
        f"actions {reasoning['actions']}, refused {reasoning['refused']}, stale {reasoning['stale']}, missed "
        f"{reasoning['missed']}, invalid {reasoning['invalid_outputs']}, latency p50 "
        f"{_ms(reasoning['latency_p50_ms'])} p99 {_ms(reasoning['latency_p99_ms'])} ms | kv {reasoning['kv_policy']} "
        f"{reasoning['kv_tokens']} tokens, "
        f"{reasoning['kv_bytes']} B (+{reasoning['memory_state_bytes']} B state) | ")
    publishing = "" if publisher["state"] == "active" else f"publisher {publisher['state']}, "
    chunks = "" if reasoning.get("deadline") != "horizon" or "horizon_left_ms" not in publisher else (
        f" | {publisher['execution']}: horizon left {publisher['horizon_left_ms']:.0f} ms, cycle predicted "
        f"{_ms(reasoning['cycle_predicted_ms'])} ms, starved {publisher['starvation_events']}x, distinct "
        f"{publisher['distinct_commands_hz']:.1f}/s")
    return (f"in {camera['input_fps']:.1f} fps, dropped {camera['dropped']} (+{camera['buffer_overwritten_unread']} "
            f"unread) | {state}{thinking}{publishing}published {publisher['published']}, safe stops "
            f"{publisher['safe_stops']}" + chunks + (f" | instruction {reasoning['instruction']!r} for "
                                            f"{reasoning['instruction_age_s']:g} s" if reasoning.get("instruction")
                                            else "") + (f" | {sim}" if sim else ""))


def cmd_run(args: argparse.Namespace) -> int:
    from ..nodes.bringup import Pipeline
    from ..nodes.ros_session import ros_session

    settings = load_settings(args.config)
    if args.model is not None:
        settings = settings.replace("reasoning", {"model_dir": str(args.model.resolve())})
    if args.image_topic:
        settings = settings.replace("camera_subscriber", {"image_topic": args.image_topic})
    if args.sim in TASKS:  # the buffer takes the world's frames as they are (96x96), not resized to a 4:3 camera
        size = TaskSpec().image_size  # (the arm's: bringup.Pipeline)
        settings = settings.replace("camera_subscriber", {"frame_height": size, "frame_width": size})
    templates = sim_templates(args, settings)
    with ros_session():
        pipeline = Pipeline(settings, synthetic_camera=args.image_topic is None and args.sim is None,
                            camera_rate_hz=args.camera_rate_hz, use_sim_time=args.use_sim_time, sim_task=args.sim,
                            sim_instructions=templates)
        try:
            print(_banner(args, pipeline.settings, pipeline))
            pipeline.run(args.duration, every_second=lambda: print(status_line(
                pipeline.camera.figures(), pipeline.reasoning.figures(), pipeline.publisher.figures(),
                pipeline.sim.status() if pipeline.sim else ""), flush=True),
                stop=args.stop)
            reports = {node: node.report() for node in (pipeline.camera, pipeline.reasoning, pipeline.publisher)}
            pipeline.stop()  # the robot's explicit stop is part of the summary
            summary = _summary(args, pipeline, reports)
        finally:
            pipeline.shutdown()
    print("summary: " + json.dumps(summary, indent=2))
    if args.summary_json:
        args.summary_json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def sim_templates(args: argparse.Namespace, settings: Settings) -> tuple[str, ...]:
    """``--instructions FILE``'s templates for the simulated robot's lang-reach (none without it: the world's own
    phrasing), each checked with every colour against the checkpoint's tokenizer before anything starts;
    ValueError for a bad file, or the flag without ``--sim lang-reach``."""
    if args.instructions is None:
        return ()
    if args.sim != "lang-reach":
        raise ValueError("--instructions is for --sim lang-reach, whose simulated robot words each episode's goal")
    from ..runtime.loader import load_model
    from ..tools.lang_reach import instructor_for, read_templates
    from ..worlds.sim.render import COLOUR_NAMES

    templates = read_templates(args.instructions)
    instructor_for(templates, load_model(settings), settings["reasoning"]["instruction_max_tokens"]).check(COLOUR_NAMES)
    return templates


def _banner(args: argparse.Namespace, settings: Settings, pipeline) -> str:
    """What runs, from where, on what."""
    engine, loaded = pipeline.reasoning.engine, pipeline.reasoning.loaded
    source = (f" ({pipeline.sim.describe()})" if pipeline.sim else
              f" (synthetic, {args.camera_rate_hz or SYNTHETIC_RATE_HZ:.0f} Hz)" if args.image_topic is None else "")
    lines = [f"vla-edge run: {settings['reasoning']['model_dir']} on {loaded.plan.backend}, weights "
             f"{engine.checkpoint.held_as}, camera "
             f"{settings['camera_subscriber']['image_topic']}{source}{_state(settings)}, deadline "
             f"{settings['reasoning']['deadline_ms']:.1f} ms, commands on {settings['action_publisher']['command_topic']}"
             f" ({settings['action_publisher']['command_type']}), KV arena {engine.arena.capacity} tokens, "
             f"memory policy {engine.policy.name}"]
    if loaded.store is not None:
        lines.append(f"KV store {loaded.store.directory} ({'aes-256-gcm' if loaded.store.encrypted else 'PLAIN'}): "
                     f"prompt {'loaded from the store' if loaded.prompt_from_store else 'prefilled'}, episode memory "
                     f"{'restored' if loaded.memory_restored else 'starts empty'}")
    return "\n".join(lines)


def _state(settings: Settings) -> str:
    """The robot state the nodes read, for the banner ("" when none)."""
    camera = settings["camera_subscriber"]
    return f", state {camera['state_topic']} ({camera['state_type']})" if camera["state_topic"] else ""


def _summary(args: argparse.Namespace, pipeline, reports: dict) -> dict:
    """Each node's level and message as the run ended (``reports``, taken before the nodes were deactivated),
    and its figures after the stop (and the simulated robot's or arm's episodes, under its node's name)."""
    summary = {node.get_name(): {"level": int.from_bytes(report.level, "little"), "message": report.message,
                                 **node.figures()} for node, report in reports.items()}
    if pipeline.sim is not None:
        summary[pipeline.sim.get_name()] = pipeline.sim.summary()
    return summary


def sim_task(text: str) -> str:
    """``--sim``: a 2-D world task, or one Meta-World task (``metaworld/<task>``, checked against its names)."""
    if text in TASKS:
        return text
    try:
        if len(arm_tasks(text)) == 1:
            return text
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; the 2-D world's are {', '.join(TASKS)}") from None
    raise argparse.ArgumentTypeError(f"a simulated arm runs one Meta-World task ({PREFIX}<task>), not {text}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="start the three ROS 2 nodes (and a synthetic camera) in this process")
    p.add_argument("--config", type=Path, help="YAML config (default: built-in defaults)")
    p.add_argument("--duration", type=float, help="seconds to run (default: until Ctrl-C or SIGTERM)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--image-topic", help="listen to this camera topic instead of starting the synthetic camera")
    source.add_argument("--sim", type=sim_task, metavar="TASK",
                        help=f"close the loop through a simulated robot instead of the synthetic camera: a 2-D world "
                             f"task ({', '.join(TASKS)}; its camera and odometry in, Twist commands out) or "
                             f"{PREFIX}<task> (Meta-World's arm: its camera and JointState in, 4-D actions out at 80 "
                             "Hz; the task's description is the instruction)")
    p.add_argument("--model", type=Path, metavar="DIR",
                   help="the checkpoint directory, instead of the configuration's reasoning.model_dir")
    p.add_argument("--instructions", type=Path, metavar="FILE",
                   help="with --sim lang-reach: instruction templates, one a line with {color} (the format of "
                        "evaluate --instructions); each episode's is drawn from its seed (default: the world's own "
                        "phrasing, 'go to the {color} target')")
    p.add_argument("--camera-rate-hz", type=float, default=None,
                   help=f"the synthetic camera's frame rate (default {SYNTHETIC_RATE_HZ:g}), or the simulated arm's "
                        f"(default {CAMERA_RATE_HZ:g}: 80 Hz over a whole number of steps)")
    p.add_argument("--summary-json", type=Path, help="also write the final summary here")
    p.add_argument("--use-sim-time", action="store_true",
                   help="follow /clock, e.g. from `vla-edge play BAG --clock 100` (with --image-topic)")
    p.set_defaults(func=cmd_run)
