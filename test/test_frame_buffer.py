"""The latest-frame buffer: exact counting, no torn or changing frames under a racing writer."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from vla_edge_ros.runtime.frame_buffer import FrameBuffer, FrameBufferStats

H, W = 8, 8  # 192 bytes: 24 little-endian uint64 words per frame
_WORD = np.arange(H * W * 3 // 8, dtype=np.uint64)
_MIX = np.uint64(0x9E3779B97F4A7C15)


def pattern(seq: int) -> np.ndarray:
    """Pixels that identify ``seq`` in every 8-byte word (word 0 is ``seq`` itself).

    Each word is a bijection of ``seq``, so bytes from two different frames never pass as one.
    """
    words = (_WORD + np.uint64(seq)) * _MIX
    words ^= words >> np.uint64(29)
    words[0] = seq
    return words.view(np.uint8).reshape(H, W, 3)


def assert_frame_intact(image: np.ndarray, seq: int) -> None:
    embedded = int(image.reshape(-1)[:8].view(np.uint64)[0])
    assert embedded == seq, f"metadata says frame {seq}, pixels say {embedded}"
    assert np.array_equal(image, pattern(seq)), f"frame {seq} is torn"


@pytest.fixture
def tiny_switch_interval() -> Iterator[None]:
    """Switch threads every few bytecodes, so interleavings between list operations happen.

    Narrow windows are still hit only sometimes: a reader that takes before it releases (one
    slot short) fails here in about one run of four, not always.
    """
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


def test_write_read_then_nothing_new() -> None:
    buf = FrameBuffer(H, W)
    assert buf.read_latest() is None
    assert buf.write(pattern(0), stamp_ns=111, receive_ns=222) == 0
    frame = buf.read_latest()
    assert frame is not None
    assert (frame.seq, frame.stamp_ns, frame.receive_ns) == (0, 111, 222)
    assert_frame_intact(frame.image, 0)
    assert buf.read_latest() is None
    assert buf.stats() == FrameBufferStats(written=1, read=1, dropped=0, pending=0)


def test_newest_wins_and_overwritten_frames_are_dropped() -> None:
    buf = FrameBuffer(H, W)
    for seq in range(3):
        buf.write(pattern(seq), stamp_ns=1000 + seq)
    assert buf.stats() == FrameBufferStats(written=3, read=0, dropped=2, pending=1)
    frame = buf.read_latest()
    assert frame is not None and frame.seq == 2 and frame.stamp_ns == 1002
    assert_frame_intact(frame.image, 2)
    assert buf.read_latest() is None
    assert buf.stats() == FrameBufferStats(written=3, read=1, dropped=2, pending=0)


def test_receive_time_defaults_to_monotonic_clock() -> None:
    buf = FrameBuffer(H, W)
    before = time.monotonic_ns()
    buf.write(pattern(0), stamp_ns=5)
    frame = buf.read_latest()
    assert frame is not None and before <= frame.receive_ns <= time.monotonic_ns()


@pytest.mark.parametrize("image", [
    np.zeros((H, W + 1, 3), np.uint8),
    np.zeros((H, W, 4), np.uint8),
    np.zeros((H, W, 3), np.float32),
])
def test_wrong_frame_is_refused_and_changes_nothing(image: np.ndarray) -> None:
    buf = FrameBuffer(H, W)
    buf.write(pattern(0), stamp_ns=1)
    before = buf.stats()
    with pytest.raises(ValueError):
        buf.write(image, stamp_ns=2)
    assert buf.stats() == before
    frame = buf.read_latest()
    assert frame is not None and frame.seq == 0 and frame.stamp_ns == 1
    assert_frame_intact(frame.image, 0)


def test_every_slot_has_exactly_one_owner() -> None:
    """Writer's back slot, the published slot, the reader's slot and the free ones partition the
    three slots after any sequence of calls."""
    buf = FrameBuffer(H, W)
    rng = np.random.default_rng(0)
    seq = 0
    for _ in range(500):
        if rng.random() < 0.6:
            buf.write(pattern(seq), stamp_ns=seq)
            seq += 1
        else:
            buf.read_latest()
        owned = [buf._back, *buf._ready, *buf._free] + ([] if buf._front is None else [buf._front])
        assert sorted(owned) == [0, 1, 2]
    stats = buf.stats()
    assert stats.written == seq == stats.read + stats.dropped + stats.pending


def test_held_frame_is_read_only_and_untouched_while_the_writer_keeps_writing(
        tiny_switch_interval: None) -> None:
    buf = FrameBuffer(H, W)
    buf.write(pattern(0), stamp_ns=0)
    held = buf.read_latest()
    assert held is not None
    with pytest.raises(ValueError):
        held.image[0, 0, 0] = 1  # the reader cannot scribble on a slot either

    stop = threading.Event()

    def keep_writing() -> None:
        seq = 1
        while not stop.is_set():
            buf.write(pattern(seq), stamp_ns=seq)
            seq += 1

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        deadline = time.monotonic() + 60.0  # checking all the while, until the writer has lapped the slots
        while buf.stats().written <= 100:  # many times over (however slowly a busy machine lets it write)
            assert time.monotonic() < deadline, "the writer never got to write"
            assert_frame_intact(held.image, 0)
    finally:
        stop.set()
        writer.join()
    assert buf.stats().written > 100  # the writer really did cycle through the other slots
    assert_frame_intact(held.image, 0)
    newest = buf.read_latest()
    assert newest is not None and newest.seq == buf.stats().written - 1


def test_racing_writer_and_slow_reader(tiny_switch_interval: None) -> None:
    """100,000 frames against a reader that works between reads: every byte of every frame read
    is checked on taking it and again just before letting it go; sequence numbers only go up;
    the last frame arrives; written == read + dropped exactly."""
    frames = 100_000
    buf = FrameBuffer(H, W)
    errors: list[BaseException] = []
    done = threading.Event()

    def writer() -> None:
        try:
            for seq in range(frames):
                assert buf.write(pattern(seq), stamp_ns=seq) == seq
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)
        finally:
            done.set()

    seen: list[int] = []
    nones = 0
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        deadline = time.monotonic() + 300.0  # a generous bound on waiting, not a speed requirement
        while not (done.is_set() and (errors or seen and seen[-1] == frames - 1)):
            assert time.monotonic() < deadline, "the last frame never arrived"
            frame = buf.read_latest()
            if frame is None:
                nones += 1
                time.sleep(0)
                continue
            assert not seen or frame.seq > seen[-1], f"frame {frame.seq} after {seen[-1]}"
            assert frame.stamp_ns == frame.seq
            assert_frame_intact(frame.image, frame.seq)
            seen.append(frame.seq)
            if len(seen) % 3 == 0:
                time.sleep(50e-6)  # a slow reasoning step: the writer laps us here
            assert_frame_intact(frame.image, frame.seq)  # still ours, still unchanged
    finally:
        thread.join()
    assert not errors, errors[0]
    stats = buf.stats()
    assert stats.written == frames
    assert stats.read == len(seen)
    assert stats.pending == 0
    assert stats.written == stats.read + stats.dropped
    assert stats.dropped > 0 and len(seen) > 100, (stats, nones)  # both paths were exercised


def observation(seq: int) -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray]:
    """An observation of three cameras and a 3-value state, every part saying ``seq`` its own way."""
    return pattern(seq), (pattern(seq + 1_000_000), pattern(seq + 2_000_000)), np.full(3, seq, np.float32)


def assert_observation_intact(frame, seq: int) -> None:
    """Every camera's pixels and the state are ``seq``'s: no part comes from another observation."""
    assert_frame_intact(frame.image, seq)
    assert len(frame.extra_images) == 2
    assert_frame_intact(frame.extra_images[0], seq + 1_000_000)
    assert_frame_intact(frame.extra_images[1], seq + 2_000_000)
    assert frame.state.tolist() == [seq] * 3, f"state of observation {frame.state[0]:.0f} beside frames of {seq}"


def test_an_observation_is_handed_over_whole_and_read_only() -> None:
    buf = FrameBuffer(H, W, extra_cameras=2, state_dim=3)
    image, extra, state = observation(5)
    assert buf.write(image, stamp_ns=50, receive_ns=60, extra_images=extra, state=state) == 0
    state[:] = -1  # the caller's arrays are copied, not kept
    frame = buf.read_latest()
    assert (frame.seq, frame.stamp_ns, frame.receive_ns) == (0, 50, 60)
    assert_observation_intact(frame, 5)
    with pytest.raises(ValueError):
        frame.extra_images[1][0, 0, 0] = 1
    with pytest.raises(ValueError):
        frame.state[0] = 1.0


def test_a_buffer_without_extra_cameras_or_state_hands_over_the_frame_alone() -> None:
    buf = FrameBuffer(H, W)
    buf.write(pattern(1), stamp_ns=1)
    frame = buf.read_latest()
    assert frame.extra_images == () and frame.state is None


@pytest.mark.parametrize("part, change, why", [
    ("extra", lambda o: o[1][:1], "extra camera frames"),
    ("extra", lambda o: (o[1][0], np.zeros((H, W + 1, 3), np.uint8)), "frame must be"),
    ("state", lambda o: None, "finite values"),
    ("state", lambda o: np.array([1.0, np.nan, 2.0]), "finite values"),
    ("state", lambda o: np.array([1.0, np.inf, 2.0]), "finite values"),
    ("state", lambda o: np.zeros(2), "finite values"),
])
def test_an_observation_that_does_not_fit_is_refused_whole(part, change, why) -> None:
    """A camera missing or misshapen, a state missing, not finite or of the wrong length: ValueError, and the
    buffer still holds the previous observation, untouched (nothing is filled in)."""
    buf = FrameBuffer(H, W, extra_cameras=2, state_dim=3)
    image, extra, state = observation(0)
    buf.write(image, 0, 0, extra, state)
    before = buf.stats()
    image, extra, state = observation(1)
    parts = {"extra": extra, "state": state}
    parts[part] = change((image, extra, state))
    with pytest.raises(ValueError, match=why):
        buf.write(image, 1, 1, parts["extra"], parts["state"])
    assert buf.stats() == before
    assert_observation_intact(buf.read_latest(), 0)


def test_a_state_is_refused_by_a_buffer_that_holds_none() -> None:
    buf = FrameBuffer(H, W)
    with pytest.raises(ValueError, match="holds no state"):
        buf.write(pattern(0), 0, state=np.zeros(1))
    assert buf.stats().written == 0


def test_racing_writer_never_tears_an_observation(tiny_switch_interval: None) -> None:
    """Observations of three cameras and a state, written as fast as the writer can against a slow reader:
    every observation read has all its parts from one write, on taking it and before letting it go."""
    count = 20_000
    buf = FrameBuffer(H, W, extra_cameras=2, state_dim=3)
    done = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for seq in range(count):
                image, extra, state = observation(seq)
                buf.write(image, seq, seq, extra, state)
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)
        finally:
            done.set()

    seen: list[int] = []
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        deadline = time.monotonic() + 300.0
        while not (done.is_set() and (errors or seen and seen[-1] == count - 1)):
            assert time.monotonic() < deadline, "the last observation never arrived"
            frame = buf.read_latest()
            if frame is None:
                time.sleep(0)
                continue
            assert_observation_intact(frame, frame.seq)
            seen.append(frame.seq)
            if len(seen) % 3 == 0:
                time.sleep(50e-6)
            assert_observation_intact(frame, frame.seq)
    finally:
        thread.join()
    assert not errors, errors[0]
    stats = buf.stats()
    assert stats.written == count == stats.read + stats.dropped and stats.dropped > 0 and len(seen) > 100
