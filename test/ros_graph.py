"""A private ROS 2 graph per test: its own context and DDS domain, so tests never cross-talk."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager

import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor

_domains = itertools.count(10 + os.getpid() % 100)


@contextmanager
def private_graph() -> Iterator[tuple[Context, SingleThreadedExecutor]]:
    context = Context()
    rclpy.init(context=context, domain_id=next(_domains) % 230)
    executor = SingleThreadedExecutor(context=context)
    try:
        yield context, executor
    finally:
        executor.shutdown()
        rclpy.shutdown(context=context)


def call(executor: SingleThreadedExecutor, client, request, timeout_s: float = 10.0):
    """Call a service and spin until its answer arrives."""
    if not client.wait_for_service(timeout_sec=timeout_s):
        raise TimeoutError(f"service {client.srv_name} did not appear")
    future = client.call_async(request)
    executor.spin_until_future_complete(future, timeout_sec=timeout_s)
    if not future.done():
        raise TimeoutError(f"no answer from {client.srv_name}")
    return future.result()
