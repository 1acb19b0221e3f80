"""Observations put together without ROS: cameras synced by stamp, the state read and paired, bad input refused."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from vla_edge_ros.config import ObservationKnobs
from vla_edge_ros.runtime.clock import NS_PER_MS
from vla_edge_ros.runtime.frame_buffer import FrameBuffer
from vla_edge_ros.runtime.observation import SYNC_DEPTH, ObservationAssembler, Settled, Written, observation_buffer
from vla_edge_ros.runtime.robot_state import (REASONS, JointStateReader, OdometryReader, StateInput,
                                              StateInputError)

H, W = 4, 6
MS = NS_PER_MS


def image(value: int) -> np.ndarray:
    return np.full((H, W, 3), value, np.uint8)


def joints(names, position, velocity=()):
    return SimpleNamespace(name=list(names), position=list(position), velocity=list(velocity))


def odometry(x=0.0, y=0.0, q=(0.0, 0.0, 0.0, 1.0), vx=0.0, vy=0.0, wz=0.0):
    quaternion = SimpleNamespace(x=q[0], y=q[1], z=q[2], w=q[3])
    pose = SimpleNamespace(position=SimpleNamespace(x=x, y=y, z=0.0), orientation=quaternion)
    twist = SimpleNamespace(linear=SimpleNamespace(x=vx, y=vy, z=0.0), angular=SimpleNamespace(x=0.0, y=0.0, z=wz))
    return SimpleNamespace(pose=SimpleNamespace(pose=pose), twist=SimpleNamespace(twist=twist))


# --- the state from its message ---

def test_joint_state_is_picked_by_name_in_the_configured_order_with_velocities_after() -> None:
    reader = JointStateReader(["elbow", "wrist"], velocities=True)
    msg = joints(["wrist", "base", "elbow"], [0.3, 9.0, -0.2], [3.0, 90.0, -2.0])
    np.testing.assert_array_equal(reader.vector(msg), np.float32([-0.2, 0.3, -2.0, 3.0]))
    assert reader.dim == 4 and JointStateReader(["a"], velocities=False).dim == 1


@pytest.mark.parametrize("msg, reason, words", [
    (joints(["elbow", "base"], [0.1, 0.2]), "missing_joint", "'wrist' is not in the message"),
    (joints(["elbow", "wrist", "elbow"], [0.1, 0.2, 0.3]), "duplicate_joint", "'elbow' twice"),
    (joints(["elbow", "wrist"], [0.1]), "wrong_length", "position has 1 values for 2 joint names"),
    (joints(["elbow", "wrist"], [0.1, float("nan")]), "not_finite", "wrist"),
    (joints(["elbow", "wrist"], [0.1, float("inf")]), "not_finite", "wrist"),
    (joints(["elbow", "wrist"], [0.1, 1e300]), "not_finite", "wrist"),  # beyond float32: not silently inf
])
def test_a_joint_state_that_cannot_be_read_is_refused_with_its_reason(msg, reason, words) -> None:
    with pytest.raises(StateInputError, match=words) as caught:
        JointStateReader(["elbow", "wrist"], velocities=False).vector(msg)
    assert caught.value.reason == reason and reason in REASONS


def test_velocities_asked_of_a_driver_that_sends_none_are_refused() -> None:
    with pytest.raises(StateInputError, match="velocity has 0 values") as caught:
        JointStateReader(["elbow"], velocities=True).vector(joints(["elbow"], [0.1]))
    assert caught.value.reason == "wrong_length"


def test_a_nan_in_a_joint_the_model_does_not_read_is_no_concern() -> None:
    msg = joints(["elbow", "camera_tilt"], [0.5, float("nan")])
    np.testing.assert_array_equal(JointStateReader(["elbow"], velocities=False).vector(msg), np.float32([0.5]))


def test_odometry_gives_x_y_yaw_and_the_planar_twist() -> None:
    yaw = 0.7
    msg = odometry(1.0, -2.0, (0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2)), 0.4, 0.1, -0.3)
    np.testing.assert_allclose(OdometryReader().vector(msg), [1.0, -2.0, yaw, 0.4, 0.1, -0.3], rtol=1e-6)
    scaled = odometry(q=(0.0, 0.0, 3 * math.sin(yaw / 2), 3 * math.cos(yaw / 2)))  # not normalised: the same yaw
    assert OdometryReader().vector(scaled)[2] == pytest.approx(yaw, rel=1e-6)


@pytest.mark.parametrize("msg, reason", [
    (odometry(q=(0.0, 0.0, 0.0, 0.0)), "bad_orientation"),
    (odometry(x=float("nan")), "not_finite"),
    (odometry(wz=float("-inf")), "not_finite"),
    (odometry(q=(0.0, 0.0, float("nan"), 1.0)), "not_finite"),
])
def test_odometry_that_cannot_be_read_is_refused(msg, reason) -> None:
    with pytest.raises(StateInputError) as caught:
        OdometryReader().vector(msg)
    assert caught.value.reason == reason


def test_a_refused_state_is_counted_and_never_replaces_the_last_good_one() -> None:
    kept = []
    states = StateInput(JointStateReader(["a"], velocities=False), lambda values, stamp: kept.append((values, stamp)))
    assert states.receive(joints(["a"], [0.5]), 10, 11) is None
    error = states.receive(joints(["a"], [float("nan")]), 20, 21)
    assert isinstance(error, StateInputError) and error.reason == "not_finite"
    assert states.receive(joints(["b"], [0.1]), 30, 31).reason == "missing_joint"
    assert [stamp for _, stamp in kept] == [10] and states.last_state_ns == 11 and states.received == 3
    assert states.dropped == {**dict.fromkeys(REASONS, 0), "not_finite": 1, "missing_joint": 1}
    assert "'a' is not in the message" in states.last_refusal


def test_an_unstamped_state_is_refused_since_its_age_cannot_be_judged() -> None:
    """Two unstamped sources (state and camera both at 0) would always look fresh together, however old the state."""
    kept = []
    states = StateInput(JointStateReader(["a"], velocities=False), lambda values, stamp: kept.append(stamp))
    error = states.receive(joints(["a"], [0.5]), 0, 11)
    assert error.reason == "unstamped" and "header stamp is zero" in str(error) and kept == []
    assert states.dropped["unstamped"] == 1 and states.last_state_ns is None


# --- cameras synced, the state paired ---

def assembler(cameras: int = 2, state_dim: int = 0, slop_ms: float = 10.0, max_age_ms: float = 50.0):
    buffer = FrameBuffer(H, W, cameras - 1, state_dim)
    return ObservationAssembler(buffer, slop_ms, max_age_ms), buffer


def written(settled: list[Settled]) -> Written | None:
    """The one observation a call wrote (None: it settled nothing, or refused what it settled)."""
    assert len(settled) <= 1, settled
    return settled[0].written if settled else None


def test_one_camera_without_state_writes_every_frame_at_once() -> None:
    assemble, buffer = assembler(cameras=1)
    for i in range(3):
        assert written(assemble.frame(0, image(i), stamp_ns=i * 33 * MS, receive_ns=i)).seq == i
    frame = buffer.read_latest()
    assert frame.seq == 2 and frame.extra_images == () and frame.state is None and buffer.stats().dropped == 2


def test_frames_of_two_cameras_within_the_slop_make_one_observation() -> None:
    assemble, buffer = assembler()
    assert assemble.frame(0, image(1), 100 * MS, 1000) == []  # waiting for camera 1
    assert written(assemble.frame(1, image(2), 108 * MS, 900)).seq == 0
    frame = buffer.read_latest()
    assert frame.image[0, 0, 0] == 1 and frame.extra_images[0][0, 0, 0] == 2
    assert frame.stamp_ns == 100 * MS  # the primary camera's stamp
    assert frame.receive_ns == 900  # from the earliest arrival: the deadline runs from the oldest part
    assert assemble.observations == 1 and assemble.unsynced == [0, 0]


def test_frames_further_apart_than_the_slop_never_make_an_observation() -> None:
    assemble, buffer = assembler(slop_ms=10.0)
    for i in range(10):  # camera 1 always 15 ms behind camera 0
        assemble.frame(0, image(i), i * 33 * MS, i)
        assert assemble.frame(1, image(i), i * 33 * MS + 15 * MS, i) == []
    assert buffer.read_latest() is None and assemble.observations == 0
    assert sum(assemble.unsynced) == 20 - 2 * SYNC_DEPTH  # the queues are bounded; every frame leaves counted
    assert "no partner within sync_slop_ms 10" in assemble.last_refusal


def test_a_silent_camera_means_no_observation_and_a_bounded_wait() -> None:
    assemble, buffer = assembler()
    assemble.names = ("/front", "/wrist")
    for i in range(20):
        assert assemble.frame(0, image(i), i * 33 * MS, i) == []
    assert buffer.read_latest() is None and buffer.stats().written == 0
    assert assemble.unsynced == [20 - SYNC_DEPTH, 0] and len(assemble._waiting[0]) == SYNC_DEPTH
    assert assemble.last_refusal == "/front: frames found no partner within sync_slop_ms 10 (nothing waiting from /wrist)"
    # when it speaks again, the newest partner of its frame is taken, and what is older goes
    assert written(assemble.frame(1, image(99), 19 * 33 * MS + 2 * MS, 100)) is not None
    assert buffer.read_latest().image[0, 0, 0] == 19
    assert assemble.unsynced == [20 - 1, 0] and not any(assemble._waiting)


def test_the_newest_set_within_the_slop_is_taken() -> None:
    """Camera 1's frame could pair with camera 0's frames at 95 and 103 ms: the newer one makes the observation,
    and the older one, passed by it, is counted."""
    assemble, buffer = assembler(slop_ms=10.0)
    assemble.frame(0, image(95), 95 * MS, 0)
    assemble.frame(0, image(103), 103 * MS, 1)
    assemble.frame(1, image(7), 100 * MS, 2)
    assert buffer.read_latest().image[0, 0, 0] == 103 and assemble.unsynced == [1, 0]


def test_of_frames_with_equal_stamps_the_latest_arrival_is_taken() -> None:
    """Cameras that stamp nothing (all 0) still pair their newest frames, not the oldest waiting ones."""
    assemble, buffer = assembler()
    for value in (1, 2, 3):
        assemble.frame(1, image(value), 0, value)
    assert written(assemble.frame(0, image(9), 0, 4)) is not None
    assert buffer.read_latest().extra_images[0][0, 0, 0] == 3 and assemble.unsynced == [0, 2]


def test_a_set_needs_every_member_within_the_slop_of_each_other() -> None:
    """Three cameras: camera 1 at -8 ms and camera 2 at +8 ms of camera 0 are each within 10 ms of it, but 16 ms
    apart: no observation, until camera 1 sends a frame that fits."""
    assemble, buffer = assembler(cameras=3, slop_ms=10.0)
    assemble.frame(1, image(1), 92 * MS, 0)
    assemble.frame(2, image(2), 108 * MS, 1)
    assert assemble.frame(0, image(0), 100 * MS, 2) == []
    assert written(assemble.frame(1, image(11), 101 * MS, 3)) is not None
    frame = buffer.read_latest()
    assert [frame.image[0, 0, 0], *(x[0, 0, 0] for x in frame.extra_images)] == [0, 11, 2]


def streams(assemble: ObservationAssembler, states_ms: list[int], frames_ms: list[int]) -> None:
    """States, then frames, stamped at these times (ms): what the assembler reads the two periods from."""
    for t in states_ms:
        assemble.state(np.float32([t]), t * MS)
    for t in frames_ms:
        assemble.frame(0, image(t), t * MS, t * MS)


def test_a_frame_that_arrives_before_its_state_waits_for_it() -> None:
    """Over DDS a frame often arrives just before the state published with it: it is held, not paired with the
    older state, and written when its own arrives."""
    assemble, buffer = assembler(cameras=1, state_dim=1, max_age_ms=50.0)
    streams(assemble, [34, 67], [34, 67])
    assert assemble.frame(0, image(0), 100 * MS, 0) == [] and assemble.holding
    [settled] = assemble.state(np.float32([100]), 100 * MS)
    assert settled.stamp_ns == 100 * MS and settled.written is not None and not assemble.holding
    latest = buffer.read_latest()
    assert latest.state.tolist() == [100.0] and latest.stamp_ns == 100 * MS
    assert assemble.state(np.float32([133]), 133 * MS) == []  # nothing is held


@pytest.mark.parametrize("next_ms, taken", [(105, 105.0), (135, 70.0)])
def test_a_held_frame_takes_the_state_stamped_nearest_it_either_side(next_ms, taken) -> None:
    assemble, buffer = assembler(cameras=1, state_dim=1, max_age_ms=50.0)
    streams(assemble, [40, 70], [67])
    assert assemble.frame(0, image(0), 100 * MS, 0) == []
    assert written(assemble.state(np.float32([next_ms]), next_ms * MS)) is not None
    assert buffer.read_latest().state.tolist() == [taken]


def test_a_frame_waits_for_no_state_that_is_not_nearer_or_not_due_before_the_next_frame() -> None:
    """A 10 Hz state and a 30 Hz camera: frames near the newest state are written at once with it; a frame 76 ms
    past it waits for the one due 24 ms after it (before the next frame), and takes it."""
    assemble, buffer = assembler(cameras=1, state_dim=1, max_age_ms=100.0)
    streams(assemble, [-10, 90], [67])
    for t in (100, 133):
        assert written(assemble.frame(0, image(0), t * MS, t * MS)) is not None
        assert buffer.read_latest().state.tolist() == [90.0]
    assert assemble.frame(0, image(0), 166 * MS, 166 * MS) == [] and assemble.holding
    assert written(assemble.state(np.float32([190]), 190 * MS)) is not None
    assert buffer.read_latest().state.tolist() == [190.0]


def test_a_state_topic_that_falls_silent_holds_one_frame_then_none() -> None:
    """The frame the next state was due for waits until the next frame comes, then takes the newest state; the
    next frame waits for nothing (the state is overdue) and is refused at once, its state older than the age."""
    assemble, buffer = assembler(cameras=1, state_dim=1, max_age_ms=50.0)
    streams(assemble, [34, 67], [34, 67])
    assert assemble.frame(0, image(0), 100 * MS, 100) == []
    held, refused = assemble.frame(0, image(0), 133 * MS, 133)
    assert held.stamp_ns == 100 * MS and held.written is not None and buffer.read_latest().state.tolist() == [67.0]
    assert refused.stamp_ns == 133 * MS and refused.written is None and not assemble.holding
    assert "the nearest is 66.0 ms older than the frames" in refused.reason


@pytest.mark.parametrize("state_ns, words", [
    (None, "no robot state: none has arrived yet"),
    (40 * MS, "the nearest is 60.0 ms older than the frames (state_max_age_ms 50)"),
    (160 * MS, "stamped 60.0 ms after the frames (state_max_age_ms 50); do the camera and the state share a clock?"),
])
def test_without_a_fresh_state_there_is_no_observation(state_ns, words) -> None:
    assemble, buffer = assembler(cameras=1, state_dim=1, max_age_ms=50.0)
    if state_ns is not None:
        assemble.state(np.float32([1]), state_ns)
    [refused] = assemble.frame(0, image(0), 100 * MS, 0)
    assert refused.written is None and refused.reason.endswith(words) and assemble.last_refusal.endswith(words)
    assert buffer.stats().written == 0 and assemble.no_state == 1 and assemble.observations == 0


def test_the_buffer_follows_the_configured_observation() -> None:
    knobs = ObservationKnobs.of({"extra_image_topics": ["a", "b"], "state_topic": "joint_states",
                                 "state_joint_names": ["j1", "j2"], "state_joint_velocities": True})
    buffer = observation_buffer(H, W, knobs)
    assert (buffer.extra_cameras, buffer.state_dim) == (2, 4)
    odometry_buffer = observation_buffer(H, W, ObservationKnobs.of({"state_topic": "odom", "state_type": "odometry"}))
    assert (odometry_buffer.extra_cameras, odometry_buffer.state_dim) == (0, 6)
    assert observation_buffer(H, W, ObservationKnobs.of({})).state_dim == 0  # no state_topic: no state
