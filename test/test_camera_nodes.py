"""Camera frames over real DDS: synthetic camera -> camera subscriber -> frame buffer, and /diagnostics.

Every test runs in its own graph (context + DDS domain). Subscriptions are depth 1, so messages are
sent one at a time and each is waited for; a publisher is first "connected" by repeating a good
frame until one arrives, since discovery can finish on one side before the other.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")

import cv2  # noqa: E402
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from rcl_interfaces.msg import Log  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image, JointState  # noqa: E402

import vla_edge_ros.nodes.camera_subscriber as camera_subscriber  # noqa: E402
from ros_graph import WAIT_S, leased_domain, private_graph  # noqa: E402
from vla_edge_ros.config import defaults  # noqa: E402
from vla_edge_ros.nodes.camera_subscriber import DROP_REASONS, INTERNAL_ERROR, CameraSubscriber  # noqa: E402
from vla_edge_ros.nodes.synthetic_camera import SyntheticCameraPublisher  # noqa: E402
from vla_edge_ros.runtime.frame_buffer import FrameBuffer  # noqa: E402
from vla_edge_ros.runtime.image_codec import REASONS  # noqa: E402
from vla_edge_ros.runtime.observation import SYNC_DEPTH  # noqa: E402

pytestmark = pytest.mark.ros
TOPIC = "/test_camera/image_raw"
H, W = 48, 64
RELIABLE = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)


def _settings(**overrides) -> dict:
    return {**defaults()["camera_subscriber"], "image_topic": TOPIC, "frame_height": H, "frame_width": W,
            **overrides}


def _scene(height: int = H, width: int = W, seed: int = 0) -> np.ndarray:
    """A smooth RGB image (JPEG keeps it close) with a little texture so pixels differ per seed."""
    yy, xx = np.mgrid[0:height, 0:width]
    rng = np.random.default_rng(seed)
    base = np.stack([xx * 255 // width, yy * 255 // height, (xx + yy) * 127 // (height + width)], axis=-1)
    return np.clip(base + rng.integers(0, 8, size=(1, 1, 3)), 0, 255).astype(np.uint8)


def _image(pixels: np.ndarray, stamp_ns: int = 0, encoding: str = "rgb8", **fields) -> Image:
    msg = Image(height=pixels.shape[0], width=pixels.shape[1], encoding=encoding,
                step=pixels.shape[1] * pixels.shape[2], data=pixels.tobytes())
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
    for name, value in fields.items():
        setattr(msg, name, value)
    return msg


def _jpeg(rgb: np.ndarray, stamp_ns: int = 0) -> CompressedImage:
    ok, encoded = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    msg = CompressedImage(format="jpeg", data=encoded.tobytes())
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
    return msg


def _spin_until(executor: SingleThreadedExecutor, done: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out waiting for the graph"
        executor.spin_once(timeout_sec=0.02)


def _connect(executor: SingleThreadedExecutor, publisher, msg, camera: CameraSubscriber) -> None:
    """Repeat a good frame until the camera has written one from this publisher."""
    target = camera.written + 1
    deadline = time.monotonic() + WAIT_S
    while camera.written < target:
        assert time.monotonic() < deadline, f"no frame arrived on {publisher.topic_name}"
        publisher.publish(msg)
        end = time.monotonic() + 0.1
        while camera.written < target and time.monotonic() < end:
            executor.spin_once(timeout_sec=0.02)


def _deliver(executor: SingleThreadedExecutor, publisher, msg, camera: CameraSubscriber) -> None:
    """Publish once and wait until the camera has handled it, as a frame or as a drop."""
    target = camera.received + 1
    publisher.publish(msg)
    _spin_until(executor, lambda: camera.received >= target)


def _values(status: DiagnosticStatus) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


@pytest.fixture
def graph() -> Iterator[tuple]:
    """The graph's executor, a function adding nodes to it, and the context to build them in."""
    with private_graph() as (context, executor):
        nodes: list[Node] = []

        def add(node: Node) -> Node:
            executor.add_node(node)
            nodes.append(node)
            return node

        yield context, executor, add
        for node in nodes:
            node.destroy_node()


@pytest.fixture
def camera(graph):
    """A camera subscriber on TOPIC with its buffer, and a reliable raw and compressed publisher."""
    context, executor, add = graph
    buffer = FrameBuffer(H, W)
    node = add(CameraSubscriber(buffer, _settings(), context=context))
    driver = add(Node("driver", context=context))
    raw = driver.create_publisher(Image, TOPIC, RELIABLE)
    compressed = driver.create_publisher(CompressedImage, TOPIC + "/compressed", RELIABLE)
    return executor, node, buffer, raw, compressed


def test_synthetic_camera_frames_reach_the_buffer_with_their_stamps(graph):
    context, executor, add = graph
    buffer = FrameBuffer(H, W)
    add(CameraSubscriber(buffer, _settings(), context=context))
    sent: dict[int, np.ndarray] = {}  # header stamp -> pixels, as a second subscriber saw them

    def listen(msg: Image) -> None:
        sent[camera_subscriber.stamp_ns(msg.header.stamp)] = np.frombuffer(msg.data, np.uint8).reshape(H, W, 3)

    add(Node("listener", context=context)).create_subscription(Image, TOPIC, listen, qos_profile_sensor_data)
    before_ns = time.time_ns()
    synthetic = add(SyntheticCameraPublisher(topic=TOPIC, rate_hz=100.0, height=H, width=W, seed=3,
                                             context=context))
    stamps = []
    for _ in range(3):
        previous = buffer.stats().written
        _spin_until(executor, lambda: buffer.stats().written > previous)
        frame = buffer.read_latest()
        assert frame.image.shape == (H, W, 3) and frame.image.dtype == np.uint8
        assert frame.receive_ns <= time.monotonic_ns()
        _spin_until(executor, lambda: frame.stamp_ns in sent)  # the listener may be one callback behind
        np.testing.assert_array_equal(frame.image, sent[frame.stamp_ns])
        stamps.append(frame.stamp_ns)
    assert stamps == sorted(stamps) and len(set(stamps)) == 3
    assert before_ns <= stamps[0] and stamps[-1] <= time.time_ns()  # the node clock: system time by default
    assert synthetic.published >= 3


def test_compressed_jpeg_is_decoded_to_rgb(camera):
    executor, node, buffer, _, compressed = camera
    rgb = _scene(seed=1)
    _connect(executor, compressed, _jpeg(rgb, stamp_ns=12_000_000_345), node)
    frame = buffer.read_latest()
    assert frame.stamp_ns == 12_000_000_345
    assert np.abs(frame.image.astype(int) - rgb).mean() < 2.0  # JPEG at quality 95, channels not swapped


def test_other_frame_size_is_resized_with_area_interpolation(camera):
    executor, node, buffer, raw, _ = camera
    rgb = _scene(2 * H, 2 * W, seed=2)
    _connect(executor, raw, _image(rgb[..., ::-1].copy(), stamp_ns=7, encoding="bgr8"), node)
    frame = buffer.read_latest()
    assert frame.stamp_ns == 7
    np.testing.assert_array_equal(frame.image, cv2.resize(rgb, (W, H), interpolation=cv2.INTER_AREA))


def test_malformed_messages_are_counted_by_reason_and_good_frames_still_arrive(camera):
    executor, node, buffer, raw, compressed = camera
    good = _scene(seed=4)
    _connect(executor, raw, _image(good), node)
    _connect(executor, compressed, _jpeg(good), node)
    bad = [
        (raw, _image(good, encoding="nv24"), "unknown_encoding"),
        (raw, _image(good, data=good.tobytes()[: -W * 3]), "short_buffer"),
        (raw, _image(good, step=W * 3 - 1), "bad_step"),
        (raw, _image(good, width=0), "bad_dimensions"),
        (compressed, CompressedImage(format="jpeg", data=b"\xff\xd8\xff" + b"garbage" * 40), "undecodable"),
        (compressed, CompressedImage(format="bmp", data=b"BM" + bytes(64)), "unsupported_format"),
    ]
    written = node.written
    for publisher, msg, _ in bad:
        _deliver(executor, publisher, msg, node)
    expected = {reason: 0 for reason in DROP_REASONS}
    expected.update({reason: 1 for _, _, reason in bad})
    assert node.dropped == expected and node.written == written

    _connect(executor, raw, _image(_scene(seed=5), stamp_ns=99), node)
    frame = buffer.read_latest()
    assert frame.stamp_ns == 99
    np.testing.assert_array_equal(frame.image, _scene(seed=5))


def test_each_reason_is_logged_once_per_interval_not_per_message(camera, graph, monkeypatch):
    executor, node, _, raw, _ = camera
    context, _, add = graph
    lines: list[str] = []
    history = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)  # /rosout keeps its recent lines
    add(Node("log_reader", context=context)).create_subscription(
        Log, "/rosout", lambda msg: lines.append(msg.msg) if msg.name == "camera_subscriber" else None, history)
    monkeypatch.setattr(camera_subscriber, "LOG_EVERY_S", 3600.0)  # one interval, however slow the machine
    _connect(executor, raw, _image(_scene()), node)
    for encoding in ("nv24", "nv24", "32FC1", "rgb8"):
        _deliver(executor, raw, _image(_scene(), encoding=encoding), node)  # the last one is good
    _deliver(executor, raw, _image(_scene(), step=1), node)
    _spin_until(executor, lambda: any("bad_step" in line for line in lines))
    assert sum("unknown_encoding" in line for line in lines) == 1 and node.dropped["unknown_encoding"] == 3

    monkeypatch.setattr(camera_subscriber, "LOG_EVERY_S", 0.2)  # the interval over, one line tells the rest
    time.sleep(0.25)  # at least this long: a busy machine only makes it longer
    _deliver(executor, raw, _image(_scene(), encoding="nv24"), node)
    _spin_until(executor, lambda: sum("unknown_encoding" in line for line in lines) == 2)
    assert "(unknown_encoding; 2 more since the last such line)" in lines[-1]


def test_a_bug_in_decoding_is_counted_as_internal_error_and_never_raised(camera, monkeypatch):
    executor, node, buffer, raw, _ = camera
    _connect(executor, raw, _image(_scene()), node)

    def broken(*args):
        raise RuntimeError("decoder bug")

    with monkeypatch.context() as patch:
        patch.setattr(camera_subscriber, "frame_from_message", broken)
        _deliver(executor, raw, _image(_scene()), node)  # spin_once would re-raise a callback's exception
    assert node.dropped[INTERNAL_ERROR] == 1
    _connect(executor, raw, _image(_scene(), stamp_ns=5), node)
    assert buffer.read_latest().stamp_ns == 5


def test_diagnostics_message_reports_the_counters(camera, graph):
    executor, node, _, raw, _ = camera
    context, _, add = graph
    reports: list[DiagnosticStatus] = []
    add(Node("monitor", context=context)).create_subscription(
        DiagnosticArray, "/diagnostics", lambda msg: reports.extend(msg.status), 10)
    _connect(executor, raw, _image(_scene()), node)
    _deliver(executor, raw, _image(_scene(), encoding="nv24"), node)
    _spin_until(executor, lambda: any(_values(s).get("dropped_unknown_encoding") == "1" for s in reports))

    latest = next(s for s in reversed(reports) if _values(s).get("dropped_unknown_encoding") == "1")
    values = _values(latest)
    assert latest.name == "vla_edge_ros: camera_subscriber" and latest.hardware_id == "camera_subscriber"
    assert {f"dropped_{reason}" for reason in REASONS} | {"dropped_internal_error"} <= set(values)
    written = int(values["written"])
    assert written >= 1 and int(values["received"]) == written + 1 and values["dropped"] == "1"
    assert values["buffer_overwritten_unread"] == str(written - 1)  # nobody read: all but the newest
    assert values["topic"] == TOPIC and values["qos"] == "sensor_data" and values["frame_size"] == f"{W}x{H}"
    assert float(values["input_fps"]) >= 0.0 and float(values["last_frame_age_s"]) >= 0.0


def test_diagnostic_levels_follow_the_documented_thresholds(camera):
    executor, node, buffer, raw, _ = camera
    # Reports at chosen times, counted from the node's own start and frame times, so that no time the test
    # itself takes (a busy machine) moves a report across a threshold.
    start = node._start_ns
    first = node.report(start)
    assert first.level == DiagnosticStatus.OK and "waiting for the first frame" in first.message
    assert _values(first)["last_frame_age_s"] == "never"
    assert node.report(start + 2_000_000_000).level == DiagnosticStatus.WARN
    never = node.report(start + 6_000_000_000)
    assert never.level == DiagnosticStatus.ERROR and f"no valid frame on {TOPIC} since start (6.0 s)" in never.message

    _connect(executor, raw, _image(_scene()), node)
    now = buffer.read_latest().receive_ns  # the frame's receive time: when the node last saw a valid frame
    assert node.report(now).level == DiagnosticStatus.OK
    assert node.report(now + 2_000_000_000).level == DiagnosticStatus.WARN
    stale = node.report(now + 6_000_000_000)
    assert stale.level == DiagnosticStatus.ERROR and f"no valid frame on {TOPIC} for 6.0 s" in stale.message

    _deliver(executor, raw, _image(_scene(), step=1), node)
    repeated = buffer.read_latest()  # a repeat of the connecting frame may have arrived while spinning
    now = now if repeated is None else repeated.receive_ns
    dropping = node.report(now + 500_000_000)  # the frame still fresh; the drop came at most a second before
    assert dropping.level == DiagnosticStatus.WARN and "bad_step: 1" in dropping.message
    stale = node.report(now + 1_500_000_000)
    assert stale.level == DiagnosticStatus.WARN and f"no valid frame on {TOPIC} for 1.5 s" in stale.message


@pytest.mark.parametrize("qos, reliability", [("sensor_data", ReliabilityPolicy.BEST_EFFORT),
                                              ("reliable", ReliabilityPolicy.RELIABLE)],
                         ids=["sensor_data", "reliable"])
def test_qos_parameter_sets_the_subscriptions(graph, qos, reliability):
    context, executor, add = graph
    buffer = FrameBuffer(H, W)
    node = add(CameraSubscriber(buffer, _settings(qos=qos), context=context))
    for topic in (TOPIC, TOPIC + "/compressed"):
        (info,) = node.get_subscriptions_info_by_topic(topic)
        assert info.qos_profile.reliability == reliability
    raw = add(Node("driver", context=context)).create_publisher(Image, TOPIC, RELIABLE)
    _connect(executor, raw, _image(_scene()), node)  # a reliable publisher reaches both


def test_buffer_and_configured_size_must_agree(graph):
    context, _, _ = graph
    with pytest.raises(ValueError, match="frame buffer is 32x32 but camera_subscriber is configured for 48x64"):
        CameraSubscriber(FrameBuffer(32, 32), _settings(), context=context)


def test_synthetic_camera_refuses_a_rate_it_cannot_keep(graph):
    context, _, _ = graph
    with pytest.raises(ValueError, match="rate_hz"):
        SyntheticCameraPublisher(rate_hz=0.0, context=context)


def test_synthetic_camera_runs_standalone_and_stops_cleanly_on_sigint(tmp_path):
    script = ("import sys; from vla_edge_ros.nodes.entry import synthetic_camera; "
              "sys.exit(synthetic_camera(['synthetic_camera'] + sys.argv[1:]))")
    with leased_domain() as domain:
        _run_synthetic_camera(script, domain)


def _run_synthetic_camera(script: str, domain: int) -> None:
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, "ROS_DOMAIN_ID": str(domain)}
    bad = subprocess.run([sys.executable, "-c", script, "--rate-hz", "0"], capture_output=True, text=True,
                         timeout=WAIT_S, env=env)
    assert bad.returncode == 2 and "rate_hz must be positive" in bad.stderr
    process = subprocess.Popen([sys.executable, "-c", script, "--rate-hz", "10", "--height", "8", "--width", "8"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    context = rclpy.context.Context()
    rclpy.init(context=context, domain_id=domain)
    try:
        listener = Node("listener", context=context)
        received = []
        listener.create_subscription(Image, "/camera/image_raw", received.append, qos_profile_sensor_data)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(listener)
        deadline = time.monotonic() + WAIT_S
        while not received and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
        listener.destroy_node()
        executor.shutdown()
    finally:
        rclpy.shutdown(context=context)
    assert received and (received[0].height, received[0].width, received[0].encoding) == (8, 8, "rgb8")
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=WAIT_S)
    assert process.returncode == 0, err[-2000:]
    assert "Traceback" not in err


# --- observations: a second camera and the robot's state -----------------------------------------------------

WRIST = "/test_camera/wrist/image_raw"
STATES = "/test_camera/joint_states"


def _joint_state(position, names=("shoulder", "elbow"), stamp_ns: int = 1_000_000_000) -> JointState:
    msg = JointState(name=list(names), position=[float(v) for v in position])
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
    return msg


@pytest.fixture
def observing(graph):
    """A camera subscriber on two cameras and a 2-joint state (slop 10 ms, state age 50 ms), its buffer, and
    reliable publishers of both cameras and the state."""
    from vla_edge_ros.config import ObservationKnobs
    from vla_edge_ros.runtime.observation import observation_buffer

    context, executor, add = graph
    settings = _settings(extra_image_topics=[WRIST], sync_slop_ms=10.0, state_topic=STATES,
                         state_joint_names=["shoulder", "elbow"], state_max_age_ms=50.0)
    buffer = observation_buffer(H, W, ObservationKnobs.of(settings))
    node = add(CameraSubscriber(buffer, settings, context=context))
    driver = add(Node("driver", context=context))
    front, wrist = (driver.create_publisher(Image, topic, RELIABLE) for topic in (TOPIC, WRIST))
    states = driver.create_publisher(JointState, STATES, RELIABLE)
    return executor, node, buffer, front, wrist, states


def _connect_state(executor, states, msg, node) -> None:
    """Repeat a state until the node has read one from this publisher (discovery may lag on either side)."""
    deadline = time.monotonic() + WAIT_S
    while node.states.received == 0:
        assert time.monotonic() < deadline, "no state arrived"
        states.publish(msg)
        _spin_briefly(executor)


def _spin_briefly(executor, seconds: float = 0.1) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        executor.spin_once(timeout_sec=0.02)


def _deliver_state(executor, states, msg, node) -> None:
    target = node.states.received + 1
    states.publish(msg)
    _spin_until(executor, lambda: node.states.received >= target)


def _observe(executor, node, front, wrist, stamp_ns: int) -> None:
    """Both cameras' frames at ``stamp_ns`` (the wrist's 3 ms later), each repeated until its camera has one (a
    publisher may not be discovered yet)."""
    for index, (publisher, offset, seed) in enumerate(((front, 0, 1), (wrist, 3_000_000, 2))):
        camera, target = node.cameras[index], node.cameras[index].frames + 1
        deadline = time.monotonic() + WAIT_S
        while camera.frames < target:
            assert time.monotonic() < deadline, f"no frame arrived on {publisher.topic_name}"
            publisher.publish(_image(_scene(seed=seed), stamp_ns=stamp_ns + offset))
            end = time.monotonic() + 0.1
            while camera.frames < target and time.monotonic() < end:
                executor.spin_once(timeout_sec=0.02)


def test_two_cameras_and_a_joint_state_become_one_observation(observing):
    executor, node, buffer, front, wrist, states = observing
    _connect_state(executor, states, _joint_state([0.1, -0.2], stamp_ns=1_000_000_000), node)
    deadline = time.monotonic() + WAIT_S
    while node.written == 0:  # discovery: repeat both cameras' frames until one observation is made
        assert time.monotonic() < deadline, "no observation"
        front.publish(_image(_scene(seed=1), stamp_ns=1_010_000_000))
        wrist.publish(_image(_scene(seed=2), stamp_ns=1_013_000_000))
        _spin_briefly(executor)
    frame = buffer.read_latest()
    assert frame.stamp_ns == 1_010_000_000  # the primary camera's stamp
    np.testing.assert_array_equal(frame.image, _scene(seed=1))
    np.testing.assert_array_equal(frame.extra_images[0], _scene(seed=2))
    assert frame.state.tolist() == pytest.approx([0.1, -0.2])
    values = _values(node.report())
    assert values["extra_topics"] == WRIST and values["state_topic"] == STATES and values["no_state"] == "0"


@pytest.mark.parametrize("bad, reason", [
    (_joint_state([0.1, float("nan")]), "not_finite"),
    (_joint_state([0.1, 0.2], names=("shoulder", "knee")), "missing_joint"),
    (_joint_state([0.1]), "wrong_length"),
])
def test_a_bad_state_over_dds_is_dropped_counted_reported_and_never_paired(observing, bad, reason):
    executor, node, buffer, front, wrist, states = observing
    _connect_state(executor, states, bad, node)
    for _ in range(3):
        _deliver_state(executor, states, bad, node)
    _observe(executor, node, front, wrist, stamp_ns=1_000_000_000)
    assert node.state_dropped[reason] == node.states.received >= 4 and node.written == 0
    assert buffer.read_latest() is None and node.assembler.no_state >= 1
    report = node.report()
    assert report.level == DiagnosticStatus.WARN and f"dropping state messages (totals: {reason}:" in report.message
    values = _values(report)
    assert values[f"state_dropped_{reason}"] == str(node.states.received)
    assert values["last_refusal"] == "no robot state: none has arrived yet"


def test_a_stale_state_and_a_silent_camera_are_named_on_diagnostics(observing):
    executor, node, buffer, front, wrist, states = observing
    _connect_state(executor, states, _joint_state([0.0, 0.0], stamp_ns=1_000_000_000), node)
    _observe(executor, node, front, wrist, stamp_ns=1_200_000_000)  # 200 ms after the state
    assert node.written == 0 and node.assembler.no_state >= 1
    now = node.cameras[1].last_frame_ns
    stale = node.report(now + 6_000_000_000)
    assert stale.level == DiagnosticStatus.ERROR  # nothing for 6 s: every part is silent by then
    fresh = node.report(now)  # every part has just arrived, no observation yet: the reason is the state's
    assert "no robot state: the nearest is 200.0 ms older than the frames (state_max_age_ms 50)" in fresh.message
    for _ in range(SYNC_DEPTH + 2):  # the wrist camera goes silent: the front's frames find no partner
        _deliver(executor, front, _image(_scene(), stamp_ns=1_300_000_000), node)  # front: connected above
    silent = node.report(node.cameras[1].last_frame_ns + 6_000_000_000)
    assert silent.level == DiagnosticStatus.ERROR and f"no valid frame on {WRIST} for" in silent.message
    assert int(_values(silent)["unsynced_frames"]) >= 2 and node.written == 0


def test_odometry_is_the_state_of_a_mobile_robot(graph):
    import math

    from nav_msgs.msg import Odometry

    from vla_edge_ros.config import ObservationKnobs
    from vla_edge_ros.runtime.observation import observation_buffer

    context, executor, add = graph
    settings = _settings(state_topic="/test_camera/odom", state_type="odometry")
    buffer = observation_buffer(H, W, ObservationKnobs.of(settings))
    node = add(CameraSubscriber(buffer, settings, context=context))
    driver = add(Node("driver", context=context))
    odometry = driver.create_publisher(Odometry, "/test_camera/odom", RELIABLE)
    camera = driver.create_publisher(Image, TOPIC, RELIABLE)
    msg = Odometry()
    msg.header.stamp.sec = 1  # an unstamped state is refused: its age cannot be judged
    msg.pose.pose.position.x, msg.pose.pose.position.y = 1.5, -0.5
    msg.pose.pose.orientation.z, msg.pose.pose.orientation.w = math.sin(0.3), math.cos(0.3)  # yaw 0.6
    msg.twist.twist.linear.x, msg.twist.twist.angular.z = 0.2, -0.1
    _connect_state(executor, odometry, msg, node)
    _connect(executor, camera, _image(_scene(), stamp_ns=1_000_000_000), node)
    np.testing.assert_allclose(buffer.read_latest().state, [1.5, -0.5, 0.6, 0.2, 0.0, -0.1], rtol=1e-6, atol=1e-7)
    msg.pose.pose.orientation.w = msg.pose.pose.orientation.z = 0.0  # no rotation at all: refused, never yaw 0
    _deliver_state(executor, odometry, msg, node)
    assert node.state_dropped["bad_orientation"] == 1
