"""Shared fixtures: every layer test runs on every registered backend."""

from __future__ import annotations

import os

import numpy as np
import pytest

# The suite runs every call compiled, compiling where it must (bit-for-bit repeatable, and the
# numba tests test the compiled kernels); the tests of the background compiles set their mode.
os.environ["BNNSFW_COMPILE"] = "wait"

import bnnsfw  # noqa: E402

BACKENDS = bnnsfw.available_backends()


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    """Each registered backend's name in turn."""
    return request.param


@pytest.fixture
def direct_calls(backend_name: str, monkeypatch: pytest.MonkeyPatch) -> list[int] | None:
    """On ``numba``, the layer count of each call of its direct LSTM inference, in order (a spy
    on ``StackInference``, which its prepared forward runs without the stack's layers of
    calls); None on the other backends."""
    if backend_name != "numba":
        return None
    from bnnsfw.backends.numba._lstm import StackInference

    calls: list[int] = []
    run = StackInference.__call__

    def spy(self, *args):
        calls.append(len(self._layers))
        return run(self, *args)

    monkeypatch.setattr(StackInference, "__call__", spy)
    return calls


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)


class PackRecorder(bnnsfw.backends.NumpyBackend):
    """The reference backend, noting the ``version`` of every packing it is asked for."""

    name = "recording"

    def __init__(self) -> None:
        self.versions: list[int] = []

    def lstm_pack_weights(self, request):
        self.versions.append(request.version)
        return super().lstm_pack_weights(request)


@pytest.fixture
def pack_recorder() -> PackRecorder:
    """A backend that records the versions of the LSTM weight packings it makes."""
    return PackRecorder()
