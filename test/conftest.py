"""Shared fixtures: small models built deterministically, never downloaded; the ros marker enforced."""

from __future__ import annotations

import os
import sys

# Without a GPU, CUDA kernels run on Numba's simulator. It must be chosen before numba.cuda is first
# imported anywhere in the process; an explicit NUMBA_ENABLE_CUDASIM=0 (on a GPU machine) wins.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# The test models are tiny: a second OpenMP thread in torch buys nothing, and on a busy machine its spinning
# threads fight the load (two training tests took 330 s beside a training run with two threads, 13 s with
# one). Subprocesses (the command-line tests) inherit it; `vla-edge train --threads` still sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from vla_edge_ros.model.init_model import preset, write_random_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded default preset, written once per test session."""
    return write_random_model(tmp_path_factory.mktemp("models") / "tiny", preset("tiny"), seed=0)


@pytest.fixture(autouse=True)
def _fast_simulated_threads(request: pytest.FixtureRequest):
    """The CUDA simulator runs each GPU thread as a Python thread that meets the others at every
    __syncthreads; a short GIL switch interval makes those barriers several times cheaper. Only for
    simulated-CUDA tests: it slows real multi-threaded code (the ROS nodes) down."""
    simulated = "cuda" in request.node.nodeid or "kernels" in request.node.nodeid
    previous = sys.getswitchinterval()
    if simulated:
        sys.setswitchinterval(1e-3)
    yield
    sys.setswitchinterval(previous)


@pytest.fixture(autouse=True)
def _ros_graphs_only_in_ros_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A test that brings up a ROS graph in this process must be marked ``ros``: `-m "not ros"` (a machine
    without DDS) relies on the marker, so an unmarked one fails here, saying so, instead of going unnoticed."""
    if request.node.get_closest_marker("ros") is not None:
        return
    try:
        import rclpy
    except ImportError:
        return

    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts a ROS graph: mark it @pytest.mark.ros")

    monkeypatch.setattr(rclpy, "init", refuse)
