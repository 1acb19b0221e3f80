"""The simulated robot's state: a checkpoint that reads one gets the robot's odometry with every frame, in
`vla-edge evaluate` and `vla-edge run --sim`, with nothing set by hand; one of another size is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vla_edge_ros.cli import main
from vla_edge_ros.config import parse_settings
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.runtime.clock import VirtualClock
from vla_edge_ros.runtime.driver import Driver
from vla_edge_ros.runtime.loader import load_engine
from vla_edge_ros.runtime.observation import SIM_ODOMETRY_TOPIC, simulated_robot_observation
from vla_edge_ros.runtime.robot_state import OdometryReader, odometry_message
from vla_edge_ros.tools.evaluate import BAG_START_NS, EXPERT, clock_start, evaluate, run_episode
from vla_edge_ros.tools.replay import parse_cost
from vla_edge_ros.worlds.sim.world import ODOMETRY, CueReachEnv, TaskSpec

SPEC = TaskSpec(name="reach", time_limit_s=1.0)
FIXED = parse_cost("fixed:encode=8ms,decode=1ms")


@pytest.fixture(scope="module")
def odometry_model(tmp_path_factory) -> Path:
    """The tiny model reading a 6-value state, as the retrained models/sim does."""
    return write_random_model(tmp_path_factory.mktemp("models") / "odom", preset("tiny", state_dim=6), seed=0)


def _settings(model_dir: Path, **camera):
    return parse_settings({
        "camera_subscriber": {"ros__parameters": {"frame_height": 96, "frame_width": 96, **camera}},
        "reasoning": {"ros__parameters": {"model_dir": str(model_dir), "backend": "numpy"}}}, "test.yaml")


def test_an_odometry_message_reads_back_as_the_state_it_was_made_of():
    values = np.array([0.25, 0.75, 0.5, -0.3, 0.2, 0.1], dtype=np.float32)
    assert OdometryReader().vector(odometry_message(values)) == pytest.approx(values, abs=1e-6)


def test_the_simulated_robot_gives_odometry_to_a_checkpoint_that_reads_a_state(odometry_model, tiny_model):
    settings = _settings(odometry_model)
    state = preset("tiny", state_dim=6).state
    sim = simulated_robot_observation(settings, state, "evaluate")
    assert sim["camera_subscriber"]["state_topic"] == SIM_ODOMETRY_TOPIC
    assert sim["camera_subscriber"]["state_type"] == "odometry"
    mine = simulated_robot_observation(_settings(odometry_model, state_topic="/robot/odom"), state, "evaluate")
    assert mine["camera_subscriber"]["state_topic"] == "/robot/odom"  # a topic the user named stays
    plain = _settings(tiny_model)
    assert simulated_robot_observation(plain, None, "evaluate") is plain  # no state read: nothing changes
    with pytest.raises(ValueError, match="reads a robot state of 4 values .* odometry, 6 values"):
        simulated_robot_observation(settings, preset("tiny", state_dim=4).state, "evaluate")
    with pytest.raises(ValueError, match="evaluate feeds one camera and the robot's odometry"):
        simulated_robot_observation(_settings(odometry_model, extra_image_topics=["wrist"]), state, "evaluate")


def test_each_observation_holds_the_odometry_of_the_frame_it_was_seen_in(odometry_model):
    """Every frame the reasoner takes carries the state the robot was in when the world rendered it: the world's
    odometry at that tick, paired by stamp through the live assembler (none refused for want of a state)."""
    settings = simulated_robot_observation(_settings(odometry_model), preset("tiny", state_dim=6).state, "evaluate")
    engine = load_engine(settings).engine
    driver = Driver(engine, settings, VirtualClock(clock_start(settings)), FIXED, (96, 96))
    assert driver.clock() == BAG_START_NS  # a state stamped zero would read as unstamped
    env = CueReachEnv(SPEC, 4)
    truth, seen = {}, []
    cycle = driver.reasoner.cycle

    def spy(frame, horizon=None):
        seen.append((frame.stamp_ns, frame.state.copy()))
        return cycle(frame, horizon)

    driver.reasoner.cycle = spy
    episode = run_episode(env, 4, driver, at_tick=lambda tick, now: truth.__setitem__(now, env.odometry().copy()))
    assert episode.actions > 5 and driver.assembler.no_state == 0 and driver.states.received == len(truth)
    assert len(seen) > 5
    for stamp, state in seen:
        assert state.tolist() == truth[stamp].tolist()
    assert len({tuple(state[:2]) for _, state in seen}) > 1  # the robot moved: the states are the world's, not one


def test_evaluate_runs_a_state_reading_checkpoint_and_refuses_one_of_another_size(odometry_model, tmp_path,
                                                                                  capsys):
    report = evaluate(_settings(odometry_model), SPEC, ["fifo"], [4], episodes=2, seed=0, costs=FIXED,
                      out=tmp_path / "ok")
    cells = {c["variant"]: c for c in report["cells"]}
    assert cells["fifo"]["actions"] > 10 and cells[EXPERT]["episodes"] == 2
    assert cells["fifo"]["cue_swap"]["trials"] == 2 * SPEC.targets  # the probe runs with the state too
    wrong = write_random_model(tmp_path / "four", preset("tiny", state_dim=4), seed=0)
    config = tmp_path / "c.yaml"
    config.write_text(f"camera_subscriber:\n  ros__parameters:\n    frame_height: 96\n    frame_width: 96\n"
                      f"reasoning:\n  ros__parameters:\n    model_dir: {wrong}\n")
    code = main(["evaluate", "--config", str(config), "--task", "reach", "--policy", "fifo", "--budgets", "4",
                 "--episodes", "1", "--cost", "fixed:encode=8ms,decode=1ms", "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "reads a robot state of 4 values" in err and ", ".join(ODOMETRY) in err


def test_lang_reach_s_probes_run_with_the_state_too(tmp_path):
    from vla_edge_ros.model.tokenizer_files import write_tokenizer

    model = write_tokenizer(write_random_model(tmp_path / "m", preset("tiny", state_dim=6), seed=0),
                            ["go to the red target", "user", "assistant"], preset("tiny").vocab_size)
    report = evaluate(_settings(model), TaskSpec(name="lang-reach", time_limit_s=1.5), ["fifo"], [4], episodes=1,
                      seed=0, costs=parse_cost("fixed:encode=8ms,decode=1ms,prompt=5ms"), out=tmp_path / "r",
                      templates=("drive to the {color} disc",))
    fifo = next(c for c in report["cells"] if c["variant"] == "fifo")
    assert fifo["actions"] > 10 and fifo["language"]["blind"]["episodes"] == fifo["language"]["switch"]["episodes"] == 1


def test_run_sim_refuses_a_bad_instructions_file_before_anything_starts(tmp_path, capsys):
    """A file evaluate would refuse, a template too long for the checkpoint's tokenizer, or the flag without
    lang-reach: one line and exit 2, before any node starts."""
    pytest.importorskip("rclpy")
    from vla_edge_ros.model.tokenizer_files import write_tokenizer

    model = write_tokenizer(write_random_model(tmp_path / "m", preset("tiny"), seed=0),
                            ["go to the red target", "user", "assistant"], preset("tiny").vocab_size)
    config = tmp_path / "c.yaml"
    config.write_text(f"reasoning:\n  ros__parameters:\n    model_dir: {model}\n    instruction_max_tokens: 16\n")
    files = {"bad": "go to the target\n", "good": "drive to the {color} disc\n",
             "long": "please " * 40 + "go to the {color} one\n"}
    for name, text in files.items():
        (tmp_path / f"{name}.txt").write_text(text)
    for argv, message in ((["lang-reach", "bad"], "holds {color} exactly once"),
                          (["lang-reach", "none"], "not a regular file"),
                          (["lang-reach", "long"], "with red"),
                          (["reach", "good"], "--instructions is for --sim lang-reach")):
        code = main(["run", "--config", str(config), "--duration", "0.1", "--sim", argv[0], "--instructions",
                     str(tmp_path / f"{argv[1]}.txt")])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
