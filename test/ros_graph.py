"""A private ROS 2 graph per test: its own context and DDS domain, so tests never cross-talk.

The domain id is leased with a lock file, so two test processes on one machine (two developers' suites,
or a suite and a `vla-edge run` it started) never share a domain either: their nodes would discover
each other and a listener would hear the other process's commands.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor

WAIT_S = 60.0  # how long a test waits for an outcome on the graph: only a broken graph or node takes this long
_FIRST, _COUNT = 10, 220  # domain ids 10..229 (Fast DDS computes its ports from ids up to 232)
_candidates = itertools.count(os.getpid() % _COUNT)
_LOCKS = Path(tempfile.gettempdir()) / "vla_edge_ros_test_domains"


@contextmanager
def leased_domain() -> Iterator[int]:
    """A DDS domain id that no other process on this machine holds through this function until we leave."""
    _LOCKS.mkdir(exist_ok=True)
    for _ in range(_COUNT):
        domain = _FIRST + next(_candidates) % _COUNT
        fd = os.open(_LOCKS / f"{domain}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by the kernel if this process dies
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield domain
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        return
    raise RuntimeError(f"all {_COUNT} DDS domain ids are leased by other processes")


@contextmanager
def private_graph() -> Iterator[tuple[Context, SingleThreadedExecutor]]:
    with leased_domain() as domain:
        context = Context()
        rclpy.init(context=context, domain_id=domain)
        executor = SingleThreadedExecutor(context=context)
        try:
            yield context, executor
        finally:
            executor.shutdown()
            rclpy.shutdown(context=context)


def call(executor: SingleThreadedExecutor, client, request, timeout_s: float = WAIT_S):
    """Call a service and spin until its answer arrives."""
    if not client.wait_for_service(timeout_sec=timeout_s):
        raise TimeoutError(f"service {client.srv_name} did not appear")
    future = client.call_async(request)
    executor.spin_until_future_complete(future, timeout_sec=timeout_s)
    if not future.done():
        raise TimeoutError(f"no answer from {client.srv_name}")
    return future.result()


def run_until(pipeline, done, timeout_s: float = WAIT_S, step_s: float = 0.05) -> bool:
    """Spin ``pipeline`` (nodes/bringup.Pipeline) until ``done()``; False if it still does not hold after
    ``timeout_s``: tests wait for outcomes, never for a time."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        pipeline.run(duration_s=step_s)
    return True
