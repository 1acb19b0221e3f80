"""The reasoning node's vla/debug_image over DDS: off by default, switched on live, at its capped rate, the right
size and encoding, in the namespace, and never stopped by a bad frame or a bad value."""

from __future__ import annotations

import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")

from rcl_interfaces.srv import SetParameters  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from ros_graph import private_graph, run_until  # noqa: E402
from vla_edge_ros.config import parse_settings  # noqa: E402
from vla_edge_ros.nodes.bringup import Pipeline  # noqa: E402
from vla_edge_ros.nodes.debug_image import QOS  # noqa: E402
from vla_edge_ros.runtime.debug_image import layout_for  # noqa: E402

pytestmark = pytest.mark.ros


def _settings(tiny_model):
    # the longest deadline the schema allows: on a busy machine the gate would rightly refuse 33 ms cycles, and
    # the pictures of refused cycles are pictures too, but the test wants actions to be drawn as well
    return parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 128,
                                          "deadline_ms": 1000.0}},
        "camera_subscriber": {"ros__parameters": {"frame_height": 48, "frame_width": 64}}}, "test.yaml")



def test_off_by_default_no_publisher_and_no_copies(tiny_model):
    with private_graph() as (context, _):
        pipeline = Pipeline(_settings(tiny_model), context=context, synthetic_camera=True)
        listener = Node("listener", context=context)
        pictures = []
        listener.create_subscription(Image, "/vla/debug_image", pictures.append, QOS)
        pipeline.executor.add_node(listener)
        try:
            assert run_until(pipeline, lambda: pipeline.reasoning.actions >= 10)
            assert listener.count_publishers("/vla/debug_image") == 0 and pictures == []
            debug = pipeline.reasoning.debug_image
            assert debug.feed.latest() is None and debug.copies.main(pipeline.camera.written - 1) is None
            assert pipeline.reasoning.figures()["debug_image"] == "off"
        finally:
            pipeline.executor.remove_node(listener)
            listener.destroy_node()
            pipeline.shutdown()


def _bad_images() -> list[Image]:
    """What a broken camera driver may send: too few bytes, an unknown encoding, odd sizes (the last two decode)."""
    return [Image(height=48, width=64, encoding="rgb8", step=192, data=bytes(100)),
            Image(height=48, width=64, encoding="yuv_weird", step=192, data=bytes(48 * 192)),
            Image(height=1, width=1, encoding="rgb8", step=3, data=bytes([255, 0, 255])),
            Image(height=7, width=13, encoding="mono8", step=13, data=bytes(range(91)))]


def test_switched_on_live_it_publishes_the_picture_at_its_rate_and_bad_input_never_stops_it(tiny_model):
    """In namespace robot1, through the real set_parameters service as `ros2 param set` calls it; drawn only while
    something subscribes."""
    with private_graph() as (context, _):
        pipeline = Pipeline(_settings(tiny_model), context=context, namespace="robot1", synthetic_camera=True)
        listener = Node("listener", context=context)
        client = listener.create_client(SetParameters, "/robot1/reasoning/set_parameters")

        def set_(**values) -> list[tuple[bool, str]]:
            request = SetParameters.Request(parameters=[Parameter(f"debug_image.{name}", value=value).to_parameter_msg()
                                                        for name, value in values.items()])
            answer = client.call_async(request)
            assert run_until(pipeline, answer.done)  # the pipeline's executor serves the node's parameters
            return [(r.successful, r.reason) for r in answer.result().results]

        pictures: list[tuple[float, Image]] = []
        watching = listener.create_subscription(Image, "/robot1/vla/debug_image",
                                                lambda m: pictures.append((time.monotonic(), m)), QOS)
        camera = listener.create_publisher(Image, "/robot1/camera/image_raw", qos_profile_sensor_data)
        pipeline.executor.add_node(listener)
        try:
            assert run_until(pipeline, lambda: pipeline.reasoning.actions >= 3)
            assert set_(enabled=True, rate_hz=2.0, width=320) == [(True, "")] * 3
            assert run_until(pipeline, lambda: len(pictures) >= 2)
            assert listener.count_publishers("/robot1/vla/debug_image") == 1
            first = pictures[-1][1]
            layout = layout_for((48, 64), 320, "twist")
            assert (first.encoding, first.width, first.height, first.step) == ("rgb8", 320, layout.height, 960)
            assert len(first.data) == layout.height * 960
            assert np.frombuffer(first.data, np.uint8).std() > 0  # a picture, not a blank

            window_start, before = time.monotonic(), len(pictures)
            bad = _bad_images()
            while time.monotonic() - window_start < 4.0:  # bad frames between the camera's good ones
                camera.publish(bad[int(time.monotonic() * 10) % len(bad)])
                pipeline.run(duration_s=0.05)
            window = time.monotonic() - window_start
            arrived = [t for t, _ in pictures[before:]]
            assert arrived and len(arrived) <= 2.0 * window + 1  # at most rate_hz, however many cycles ran
            dropped = pipeline.camera.dropped
            assert dropped["short_buffer"] > 0 and dropped["unknown_encoding"] > 0
            assert pipeline.reasoning.state == "active" and pipeline.reasoning.engine_errors == 0
            figures = pipeline.reasoning.figures()
            assert figures["debug_image"] == "on" and figures["debug_image_errors"] == 0
            assert figures["debug_images_published"] >= len(pictures)

            refused = set_(width=100, rate_hz=0.0)  # below the schema's minimums: refused with the reason
            assert [ok for ok, _ in refused] == [False, False] and "debug_image.width" in refused[0][1]
            assert run_until(pipeline, lambda: len(pictures) > before + len(arrived))  # still drawing

            listener.destroy_subscription(watching)  # nobody watches: nothing is drawn, though cycles go on
            debug = pipeline.reasoning.debug_image
            assert run_until(pipeline, lambda: debug._publisher.get_subscription_count() == 0)
            drawn, actions = debug.published, pipeline.reasoning.actions
            pipeline.run(duration_s=1.5)
            assert debug.published == drawn and pipeline.reasoning.actions > actions

            assert set_(enabled=False) == [(True, "")]
            assert run_until(pipeline, lambda: listener.count_publishers("/robot1/vla/debug_image") == 0)
            assert debug.feed.latest() is None and pipeline.reasoning.figures()["debug_image"] == "off"
        finally:
            pipeline.executor.remove_node(listener)
            listener.destroy_node()
            pipeline.shutdown()
