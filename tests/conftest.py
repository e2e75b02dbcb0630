"""Shared fixtures: every layer test runs on every registered backend."""

from __future__ import annotations

import numpy as np
import pytest

import bnnsfw

BACKENDS = bnnsfw.available_backends()


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    """Each registered backend's name in turn."""
    return request.param


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)
