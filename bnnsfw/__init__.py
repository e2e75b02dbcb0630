"""bnnsfw: Apple's Accelerate BNNS layers (LSTM, normalization) in NumPy and SciPy.

Layers are created from frozen parameter objects, run forward and backward on a pluggable
compute backend, and follow BNNS semantics so results can be compared with BNNS itself.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from .activation import Activation
from .backends import (
    Backend,
    available_backends,
    current_backend,
    get_backend,
    register_backend,
    use_backend,
)
from .enums import (
    ActivationFunction,
    DataLayout,
    DataType,
    FilterType,
    LayerFlags,
    LearningPhase,
    NDArrayFlags,
)
from .errors import (
    BackendError,
    BNNSError,
    DTypeError,
    FilterClosedError,
    InvalidParameterError,
    ShapeError,
    UnknownBackendError,
    UnknownNameError,
    UnsupportedError,
)
from .filter import Filter, FilterParameters, IncompatibleKeys
from .layers.fully_connected import FullyConnectedGradients, FullyConnectedLayer, FullyConnectedParameters
from .layers.lstm import (
    LSTMActivations,
    LSTMGateDescriptor,
    LSTMGateGradients,
    LSTMGradients,
    LSTMLayer,
    LSTMLayerNorm,
    LSTMLayerNormGradients,
    LSTMOutput,
    LSTMParameters,
    LSTMStream,
)
from .layers.normalization import (
    NormalizationGradients,
    NormalizationLayer,
    NormalizationOutput,
    NormalizationParameters,
    NormalizationType,
)
from .sequential import (Dropout, FinalState, LastStep, Sequential, SequentialGradients, SequentialOutput,
                         Softmax)
from .serialization import load_weights, save_weights
from .optimizers import clip_gradients
from .schedules import CosineAnnealing, LearningRateSchedule, LinearWarmup, SequentialSchedule, StepDecay
from .workers import init_worker, worker_environment, worker_threads
from . import losses, optimizers, schedules

try:
    __version__ = _metadata.version("bnnsfw")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "__version__",
    # parameters and values
    "Activation",
    "ActivationFunction",
    "DataLayout",
    "DataType",
    "FilterType",
    "LayerFlags",
    "LearningPhase",
    "NDArrayFlags",
    "FilterParameters",
    "FullyConnectedParameters",
    "NormalizationParameters",
    "NormalizationType",
    "LSTMGateDescriptor",
    "LSTMActivations",
    "LSTMLayerNorm",
    "LSTMParameters",
    # layers and their results
    "Filter",
    "NormalizationLayer",
    "NormalizationGradients",
    "NormalizationOutput",
    "LSTMLayer",
    "LSTMStream",
    "LSTMOutput",
    "LSTMGradients",
    "LSTMGateGradients",
    "LSTMLayerNormGradients",
    "FullyConnectedLayer",
    "FullyConnectedGradients",
    "Sequential",
    "LastStep",
    "FinalState",
    "Softmax",
    "Dropout",
    "SequentialGradients",
    "SequentialOutput",
    # training
    "IncompatibleKeys",
    "save_weights",
    "load_weights",
    "losses",
    "optimizers",
    "schedules",
    "clip_gradients",
    "LearningRateSchedule",
    "StepDecay",
    "CosineAnnealing",
    "LinearWarmup",
    "SequentialSchedule",
    # worker processes
    "worker_threads",
    "worker_environment",
    "init_worker",
    # backends
    "Backend",
    "available_backends",
    "current_backend",
    "get_backend",
    "register_backend",
    "use_backend",
    # errors
    "BackendError",
    "BNNSError",
    "DTypeError",
    "FilterClosedError",
    "InvalidParameterError",
    "ShapeError",
    "UnknownBackendError",
    "UnknownNameError",
    "UnsupportedError",
]


def __getattr__(name: str) -> object:
    """BNNS C-style names (``bnnsfw.BNNSDirectApplyLSTMBatchBackward``…) come from
    :mod:`bnnsfw.bnns`, loaded on first use; the deprecated ones warn when called."""
    if name.startswith("BNNS"):
        from . import bnns

        if name in bnns.__all__:
            return getattr(bnns, name)
    raise AttributeError(f"module 'bnnsfw' has no attribute {name!r}")
