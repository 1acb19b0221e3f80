"""Re-tasking a running robot over DDS: instructions on the topic or the parameter, refused ones counted and
harmless, a flood that cannot starve the reasoning loop, the memory kept or reset, a repeat loaded from the store."""

from __future__ import annotations

from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy")

from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from ros_graph import private_graph, run_until  # noqa: E402
from vla_edge_ros.config import parse_settings  # noqa: E402
from vla_edge_ros.model.init_model import preset, write_random_model  # noqa: E402
from vla_edge_ros.model.instruction import InstructionTokenizer  # noqa: E402
from vla_edge_ros.model.tokenizer_files import write_tokenizer  # noqa: E402
from vla_edge_ros.nodes.bringup import Pipeline  # noqa: E402

pytestmark = pytest.mark.ros

CORPUS = ["go to the red one", "go to the blue one", "reach the cued target", "user", "assistant"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = write_random_model(tmp_path_factory.mktemp("models") / "tiny", preset("tiny"), seed=0)
    return write_tokenizer(out, CORPUS, preset("tiny").vocab_size)


def _settings(model_dir: Path, **reasoning):
    return parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(model_dir), "backend": "numpy", "kv_capacity_tokens": 256,
                                          "deadline_ms": 1000.0, "instruction": "go to the red one", **reasoning}},
        "camera_subscriber": {"ros__parameters": {"frame_height": 48, "frame_width": 64}},
    }, "test.yaml")


def _ids(model_dir: Path, text: str) -> list[int]:
    return InstructionTokenizer.load(model_dir, preset("tiny").vocab_size).prompt_ids(text, 64).tolist()



@pytest.fixture
def running(model_dir, request):
    """(pipeline, a publisher on vla/instruction) on a private graph, reasoning already acting."""
    overrides = getattr(request, "param", {})
    with private_graph() as (context, _):
        pipeline = Pipeline(_settings(model_dir, **overrides), context=context, synthetic_camera=True)
        user = Node("user", context=context)
        publisher = user.create_publisher(String, "/vla/instruction", 10)
        pipeline.executor.add_node(user)
        try:
            assert run_until(pipeline, lambda: pipeline.reasoning.actions >= 3
                              and publisher.get_subscription_count() > 0)
            yield pipeline, publisher
        finally:
            pipeline.executor.remove_node(user)
            user.destroy_node()
            pipeline.shutdown()


def test_an_instruction_on_the_topic_retasks_the_robot_from_the_next_cycle(running, model_dir):
    pipeline, publisher = running
    reasoning = pipeline.reasoning
    assert reasoning.engine.prompt_ids.tolist() == _ids(model_dir, "go to the red one")
    cycles = reasoning.cycles
    publisher.publish(String(data="go to the blue one"))
    assert run_until(pipeline, lambda: reasoning.instructions.desk.applied_count == 1)
    assert reasoning.cycles - cycles <= 2  # taken at the first turn of the loop after it arrived
    assert reasoning.engine.prompt_ids.tolist() == _ids(model_dir, "go to the blue one")
    actions = reasoning.actions
    assert run_until(pipeline, lambda: reasoning.actions > actions + 2)  # and it acts under the new one
    figures = reasoning.figures()
    assert figures["instruction"] == "go to the blue one" and figures["instructions_applied"] == 1
    assert reasoning.gate.snapshot().kinds["prompt"].warmup == 1  # the prompt ran as a block of its own
    assert figures["episodes"] == 2  # kv.on_instruction: reset (the default) starts a new episode


def test_refused_instructions_are_counted_and_the_robot_keeps_its_own(running, model_dir):
    pipeline, publisher = running
    reasoning = pipeline.reasoning
    for bad in ("", "   ", "zebra " * 400, "go\x07 now"):
        publisher.publish(String(data=bad))
    assert run_until(pipeline, lambda: reasoning.instructions.desk.refused == 4)
    actions = reasoning.actions
    assert run_until(pipeline, lambda: reasoning.actions > actions + 2)
    assert reasoning.engine.prompt_ids.tolist() == _ids(model_dir, "go to the red one")
    figures = reasoning.figures()
    assert figures["instructions_refused"] == 4 and "control character" in figures["instruction_last_refusal"]
    result = reasoning.set_parameters([Parameter("instruction", value="")])[0]
    assert not result.successful and "instruction is empty" in result.reason
    assert reasoning.params["instruction"] == "go to the red one"


def test_the_parameter_retasks_too(running, model_dir):
    pipeline, _ = running
    reasoning = pipeline.reasoning
    assert reasoning.set_parameters([Parameter("instruction", value="reach the cued target")])[0].successful
    assert run_until(pipeline, lambda: reasoning.instructions.desk.applied_count == 1)
    assert reasoning.engine.prompt_ids.tolist() == _ids(model_dir, "reach the cued target")


def test_a_flood_of_instructions_cannot_starve_the_reasoning_loop(running):
    pipeline, publisher = running
    reasoning = pipeline.reasoning
    actions, texts = reasoning.actions, ("go to the red one", "go to the blue one")
    for i in range(300):
        publisher.publish(String(data=texts[i % 2]))
        if i % 20 == 0:
            pipeline.run(duration_s=0.02)
    assert run_until(pipeline, lambda: reasoning.actions > actions + 5)
    desk = reasoning.instructions.desk
    assert 1 <= desk.applied_count <= reasoning.cycles  # at most one prompt change per frame cycle
    assert desk.superseded > desk.applied_count  # a burst became one change (DDS kept the newest 10 per burst)


@pytest.mark.parametrize("running", [{"kv.on_instruction": "keep"}], indirect=True)
def test_keep_carries_the_memory_into_the_new_instruction(running, model_dir):
    pipeline, publisher = running
    reasoning = pipeline.reasoning
    assert run_until(pipeline, lambda: reasoning.engine.policy.frames_kept() >= 3)
    seen = reasoning.engine.memory_stats().frames_seen
    publisher.publish(String(data="go to the blue one"))
    assert run_until(pipeline, lambda: reasoning.instructions.desk.applied_count == 1)
    assert reasoning.episodes == 1 and reasoning.engine.memory_stats().frames_seen >= seen  # the episode goes on
    assert reasoning.engine.prompt_ids.tolist() == _ids(model_dir, "go to the blue one")


@pytest.fixture
def store_dir(tmp_path) -> Path:
    return tmp_path / "store"


def test_a_repeated_instruction_is_loaded_from_the_kv_store(model_dir, store_dir):
    with private_graph() as (context, _):
        pipeline = Pipeline(_settings(model_dir, **{"kv_store.dir": str(store_dir), "kv_store.encryption": "none"}),
                            context=context, synthetic_camera=True)
        user = Node("user", context=context)
        publisher = user.create_publisher(String, "/vla/instruction", 10)
        pipeline.executor.add_node(user)
        try:
            reasoning = pipeline.reasoning
            assert run_until(pipeline, lambda: reasoning.actions >= 2 and publisher.get_subscription_count() > 0)
            for count, text in enumerate(("go to the blue one", "go to the red one", "go to the blue one"), 1):
                hits = reasoning.store.hits
                publisher.publish(String(data=text))
                assert run_until(pipeline, lambda: reasoning.instructions.desk.applied_count == count)
                assert reasoning.store.hits == hits + (count > 1)  # both came before by then
        finally:
            pipeline.executor.remove_node(user)
            user.destroy_node()
            pipeline.shutdown()
