"""Shared fixtures: small models built deterministically, never downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from vla_edge_ros.model.init_model import preset, write_random_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded default preset, written once per test session."""
    return write_random_model(tmp_path_factory.mktemp("models") / "tiny", preset("tiny"), seed=0)
