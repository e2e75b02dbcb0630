"""The backend conformance kit: run every layer configuration on a backend and on the reference.

:func:`check_backend` builds each supported configuration of every layer (LSTM: layers,
directions, peepholes, variable lengths, layouts, activations, dropout, states, dtypes, and
the variants of SPEC §4.1; normalization: every type including RMS, fused activations,
moving statistics, both phases, the forward's statistics, sizes the fast paths take; fully
connected: bias, activation, 2-D and 3-D inputs), runs it forward and
backward on the backend under test and on the reference backend (``numpy``), and compares
every output and gradient within the contract's tolerance (:data:`TOLERANCE`). A backend that
offers the optional ``lstm_prepare_forward`` has its prepared forwards compared with its own
``lstm_forward`` on the same requests, training caches included (through ``lstm_backward``). BNNS's LSTM
cell in one layer and one direction is also compared with the readable LSTM
(:mod:`bnnsfw.backends.numpy.lstm_bptt`), written apart from every backend's kernels, the reference's
included. It reports every disagreement with the configuration that produced it.

>>> from bnnsfw.testing import check_backend
>>> report = check_backend("scipy-blas", quick=True)
>>> report.failures
[]
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator

import attrs
import numpy as np

from . import backends
from .activation import Activation
from .backends.contract import (
    TOLERANCE,
    GemmRequest,
    LSTMBackwardRequest,
    LSTMCacheRequest,
    LSTMForwardRequest,
    LSTMGradientBuffers,
    LSTMPackRequest,
    call_prepared,
)
from .backends.numpy import lstm_bptt as _bptt
from .filter import FilterParameters
from .layers._lstm_workspace import _Workspace
from .layers.fully_connected import FullyConnectedLayer, FullyConnectedParameters
from .layers.lstm import LSTMActivations, LSTMGateGradients, LSTMLayer, LSTMParameters, _configuration
from .layers.normalization import NormalizationLayer, NormalizationParameters, NormalizationType

__all__ = ["check_backend", "ConformanceReport", "ConformanceError"]

REFERENCE = "numpy"


class ConformanceError(AssertionError):
    """A backend disagrees with the reference; the message lists every disagreement."""


@attrs.frozen
class ConformanceReport:
    """What :func:`check_backend` compared: ``checked`` configurations, ``compared`` arrays,
    and ``failures`` (``"configuration: what differed"``), empty for a conforming backend."""

    backend: str
    checked: int
    compared: int
    failures: list[str]


class _Comparison:
    """Collects array comparisons for one backend."""

    def __init__(self, rtol: float | None, atol: float | None) -> None:
        self.rtol, self.atol = rtol, atol
        self.checked = 0
        self.compared = 0
        self.failures: list[str] = []

    def arrays(self, where: str, name: str, got: Any, want: Any) -> None:
        self.compared += 1
        if want is None or got is None:
            if (want is None) != (got is None):
                self.failures.append(f"{where}: {name} is {'missing' if got is None else 'unexpected'}")
            return
        got, want = np.asarray(got), np.asarray(want)
        if got.shape != want.shape or got.dtype != want.dtype:
            self.failures.append(f"{where}: {name} is {got.dtype.name}{got.shape}, "
                                 f"expected {want.dtype.name}{want.shape}")
            return
        rtol, atol = TOLERANCE[want.dtype]
        rtol = rtol if self.rtol is None else self.rtol
        atol = atol if self.atol is None else self.atol
        with np.errstate(invalid="ignore"):
            bad = ~np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
        if bad.any():
            error = np.abs(got.astype(np.float64) - want)[bad].max()
            self.failures.append(f"{where}: {name} differs in {int(bad.sum())} of {want.size} elements "
                                 f"(largest difference {error:.3g}; rtol={rtol:g}, atol={atol:g})")

    def run(self, where: str, check: Callable[[], None]) -> None:
        """One configuration; an exception is a failure of that configuration."""
        self.checked += 1
        try:
            check()
        except Exception as exc:  # report it with its configuration and go on
            self.failures.append(f"{where}: raised {type(exc).__name__}: {exc}")


def _describe(case: dict[str, Any]) -> str:
    """``key=value, …`` with dtypes by name."""
    return ", ".join(f"{k}={np.dtype(v).name if isinstance(v, type) else v}" for k, v in case.items())


# --------------------------------------------------------------------------------------
# Configurations.
# --------------------------------------------------------------------------------------
_CUSTOM_GATES = {  # every gate off its default, derivatives from the input and the output
    "input_gate": Activation.hard_sigmoid(0.2, 0.5),
    "forget_gate": Activation.sigmoid(),
    "candidate_gate": Activation.softsign(),
    "output_gate": Activation.elu(),
}


def _lstm_cases(quick: bool) -> Iterator[dict[str, Any]]:
    dtypes = (np.float64,) if quick else (np.float32, np.float64)
    stacks = ((1, False), (2, True)) if quick else ((1, False), (1, True), (2, False), (2, True))
    peepholes = (None, "diagonal", "full")
    lengths = (False, True)
    variants = itertools.cycle(["plain", "custom", "batch_first", "states", "dropout", "no_bias"])
    combinations = itertools.product(dtypes, stacks, peepholes, lengths)
    for dtype, (layers, bidirectional), peephole, varied in combinations:
        variant = next(variants)
        if variant == "dropout" and layers == 1:
            variant = "states"
        yield dict(dtype=dtype, num_layers=layers, bidirectional=bidirectional, peepholes=peephole,
                   variable_lengths=varied, variant=variant)
    yield dict(dtype=np.float32, num_layers=1, bidirectional=False, peepholes=None, variable_lengths=False,
               variant="long")  # a sequence long and wide enough for a fast path's blocking
    # The variants of SPEC §4.1, each in both dtypes (one in quick mode), with a sequence of length 0.
    for variant, layers, bidirectional, peephole in _VARIANT_CASES:
        for dtype in dtypes:
            yield dict(dtype=dtype, num_layers=layers, bidirectional=bidirectional, peepholes=peephole,
                       variable_lengths=True, variant=variant)


#: SPEC §4.1 variants the kit runs: (variant, layers, bidirectional, peepholes).
_VARIANT_CASES = (
    ("clip", 2, True, "diagonal"),
    ("cell_clip_input_forget", 2, False, "full"),
    ("reverse", 2, False, None),
    ("direction_activations", 1, True, None),
    ("projection_clip", 2, True, None),
    ("layer_norm", 2, True, "diagonal"),
)
_VARIANT_OPTIONS: dict[str, dict[str, Any]] = {
    "clip": dict(clip=0.5),
    "cell_clip_input_forget": dict(cell_clip=0.4, input_forget=True),
    "reverse": dict(reverse=True),
    "direction_activations": dict(direction_activations=(
        LSTMActivations(), LSTMActivations(input_gate=Activation.hard_sigmoid(0.3, 0.45),
                                           candidate_gate=Activation.softsign(),
                                           hidden_activation=Activation.elu()))),
    "projection_clip": dict(projection_size=2, projection_clip=0.2),
    "layer_norm": dict(layer_norm=True),
}


def _lstm_parameters(case: dict[str, Any]) -> LSTMParameters:
    variant = case["variant"]
    size_i, hidden = (5, 24) if variant == "long" else (3, 4)
    options: dict[str, Any] = {}
    if variant == "batch_first":
        options["batch_first"] = True
    if variant == "dropout":
        options["dropout"] = 0.3
    if variant == "custom":
        options["hidden_activation"] = Activation.softsign()
    options.update(_VARIANT_OPTIONS.get(variant, {}))
    params = LSTMParameters.random(input_size=size_i, hidden_size=hidden, num_layers=case["num_layers"],
                                   bidirectional=case["bidirectional"], peepholes=case["peepholes"],
                                   bias=variant != "no_bias", seed=7, dtype=case["dtype"], **options)
    if variant == "custom":
        params = attrs.evolve(params, **{name: attrs.evolve(getattr(params, name), activation=act)
                                         for name, act in _CUSTOM_GATES.items()})
    return params


def _check_lstm(compare: _Comparison, backend: Any, reference: Any, case: dict[str, Any]) -> None:
    params = _lstm_parameters(case)
    where = "LSTM " + _describe(case)
    rng = np.random.default_rng(3)
    dtype = np.dtype(case["dtype"])
    seq_len, batch = (40, 3) if case["variant"] == "long" else (5, 3)
    d, h, p = params.num_directions, params.hidden_size, params.output_size
    size_i = params.input_size
    x_shape = (batch, seq_len, size_i) if params.batch_first else (seq_len, batch, size_i)
    y_shape = (batch, seq_len, d * p) if params.batch_first else (seq_len, batch, d * p)
    hidden_shape, cell_shape = (params.num_layers * d, batch, p), (params.num_layers * d, batch, h)
    x, dy = rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(y_shape).astype(dtype)
    variant = case["variant"]
    states = variant in ("states", "custom") or variant in _VARIANT_OPTIONS
    h0 = rng.standard_normal(hidden_shape).astype(dtype) if states else None
    c0 = rng.standard_normal(cell_shape).astype(dtype) if states else None
    dh = rng.standard_normal(hidden_shape).astype(dtype)
    dc = rng.standard_normal(cell_shape).astype(dtype)
    lengths = None
    if case["variable_lengths"]:  # a sequence of length 0 for the variants (SPEC §4.1)
        lengths = np.array([seq_len, 0 if variant in _VARIANT_OPTIONS else 2, seq_len - 1][:batch])

    def results(spec: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        with LSTMLayer(params, FilterParameters(backend=spec)) as layer:
            inference = layer.apply(x, h0, c0, lengths)
            out.update(inference_output=inference.output, inference_hidden=inference.hidden,
                       inference_cell=inference.cell)
            forward = layer.apply(x, h0, c0, lengths, training=True)
            out.update(output=forward.output, hidden=forward.hidden, cell=forward.cell)
            grads = layer.apply_backward(x, dy, h0, c0, dh, dc, lengths,
                                         training_cache=forward.training_cache)
            out.update(d_input=grads.input, d_hidden=grads.hidden, d_cell=grads.cell)
            for name, g in zip(("input", "forget", "candidate", "output"), grads.gates):
                out.update({f"d_{name}_gate.iw0": g.input_weights[0],
                            f"d_{name}_gate.iw1": g.input_weights[1],
                            f"d_{name}_gate.hidden": g.hidden_weights,
                            f"d_{name}_gate.cell": g.cell_weights,
                            f"d_{name}_gate.bias": g.bias})
            out["d_projection_weights"] = grads.projection_weights
            if grads.layer_norm is not None:
                out.update({f"d_layer_norm.{k}": a for k, a in enumerate(grads.layer_norm.arrays)})
            if params.dropout == 0.0:  # backward without a cache recomputes the forward
                again = layer.apply_backward(x, dy, h0, c0, dh, dc, lengths)
                out.update(recomputed_d_input=again.input,
                           recomputed_d_forget_hidden=again.forget_gate.hidden_weights)
        return out

    def check() -> None:
        want, got = results(reference), results(backend)
        for name, expected in want.items():
            compare.arrays(where, name, got.get(name), expected)

    compare.run(where, check)


#: The layer's gate and field names (``layer0.forward.<gate>.<field>``) in the readable module's letters.
_BPTT_LETTERS = {"input_gate": "i", "forget_gate": "f", "candidate_gate": "g", "output_gate": "o",
                 "input_weights": "W", "hidden_weights": "U", "bias": "b", "cell_weights": "p"}


def _lstm_bptt_cases(quick: bool) -> Iterator[dict[str, Any]]:
    dtypes = (np.float64,) if quick else (np.float32, np.float64)
    for dtype, peepholes in itertools.product(dtypes, (None, "diagonal")):
        yield dict(dtype=dtype, peepholes=peepholes)


def _check_lstm_bptt(compare: _Comparison, backend: Any, case: dict[str, Any]) -> None:
    """One layer and direction of BNNS's cell, from initial states and with final-state gradients,
    against the readable module run in float64 on the layer's own values."""
    where = "LSTM against the readable module " + _describe(case)
    dtype = np.dtype(case["dtype"])
    steps, batch, size_i, size_h = 6, 3, 3, 4
    params = LSTMParameters.random(input_size=size_i, hidden_size=size_h, peepholes=case["peepholes"],
                                   seed=5, dtype=dtype)
    rng = np.random.default_rng(4)
    x, dy = (rng.standard_normal((steps, batch, size)).astype(dtype) for size in (size_i, size_h))
    h0, c0, dh, dc = (rng.standard_normal((1, batch, size_h)).astype(dtype) for _ in range(4))

    def check() -> None:
        with LSTMLayer(params, FilterParameters(backend=backend)) as layer:
            out = layer.apply(x, h0, c0, training=True)
            grads = layer.apply_backward(x, dy, h0, c0, dh, dc, training_cache=out.training_cache)
            weights = _bptt.Weights(W={}, U={}, b={}, p={k: np.zeros(size_h) for k in _bptt.PEEPHOLES})
            for name, array in layer.parameters().items():
                gate, field = name.split(".")[2:]
                getattr(weights, _BPTT_LETTERS[field])[_BPTT_LETTERS[gate]] = array.astype(np.float64)
        x64, dy64, h64, c64, dh64, dc64 = (a.astype(np.float64) for a in (x, dy, h0[0], c0[0], dh[0], dc[0]))
        want = _bptt.forward(x64, weights, h64, c64)
        want_grads = _bptt.backward(dy64, dh64, dc64, want.steps, weights)
        got = dict(output=out.output, hidden=out.hidden[0], cell=out.cell[0], d_input=grads.input,
                   d_hidden=grads.hidden[0], d_cell=grads.cell[0])
        expected = dict(output=want.outputs, hidden=want.h, cell=want.c, d_input=want_grads.x,
                        d_hidden=want_grads.h0, d_cell=want_grads.c0)
        for name, gradient in grads.parameters().items():
            gate, field = name.split(".")[2:]
            got[f"d_{name}"] = gradient
            expected[f"d_{name}"] = getattr(want_grads.weights, _BPTT_LETTERS[field])[_BPTT_LETTERS[gate]]
        for name, value in expected.items():
            compare.arrays(where, name, got[name], value.astype(dtype))

    compare.run(where, check)


def _prepared_cases(quick: bool) -> Iterator[dict[str, Any]]:
    dtypes = (np.float64,) if quick else (np.float32, np.float64)
    stacks = ((1, False, None), (2, True, "diagonal"), (3, False, None))  # (layers, bidirectional, peepholes)
    for dtype, (layers, bidirectional, peepholes), training, states in itertools.product(
            dtypes, stacks, (False, True), (False, True)):
        yield dict(dtype=dtype, num_layers=layers, bidirectional=bidirectional, peepholes=peepholes,
                   training=training, states=states)
    yield dict(dtype=np.float64, num_layers=2, bidirectional=False, peepholes=None, training=True,
               states=True, variant="clip", lengths=True)


def _gradients_like(gate: Any) -> LSTMGateGradients:
    """Empty gradient arrays shaped like one gate's weights."""
    def like(a: Any) -> Any:
        return None if a is None else np.empty_like(a)

    return LSTMGateGradients(input_weights=(like(gate.input_weights[0]), like(gate.input_weights[1])),
                             hidden_weights=like(gate.hidden_weights), cell_weights=like(gate.cell_weights),
                             bias=like(gate.bias))


def _check_prepared_lstm(compare: _Comparison, backend: Any, case: dict[str, Any]) -> None:
    """The backend's prepared forward against its own ``lstm_forward``: two calls of one kind
    on other values each (nothing of the first may leak into the second), outputs, final
    states, and in training the gradients ``lstm_backward`` makes from each one's cache."""
    prepare = getattr(backend, "lstm_prepare_forward", None)
    if prepare is None:
        return
    where = "LSTM prepared forward " + _describe(case)
    dtype = np.dtype(case["dtype"])
    params = LSTMParameters.random(
        input_size=3, hidden_size=4, num_layers=case["num_layers"], bidirectional=case["bidirectional"],
        peepholes=case["peepholes"], seed=11, dtype=dtype, dropout=0.3 if case["num_layers"] > 1 else 0.0,
        clip=0.5 if case.get("variant") == "clip" else None)
    config = _configuration(params)
    seq_len, batch, size_ld = 4, 3, params.num_layers * params.num_directions
    width, h = params.num_directions * params.hidden_size, params.hidden_size
    training = case["training"]
    rng = np.random.default_rng(12)
    lengths = np.array([4, 1, 3], np.int64) if case.get("lengths") else None
    layout = backend.lstm_cache_layout(LSTMCacheRequest(config=config, seq_len=seq_len, batch_size=batch))
    nbytes = layout.nbytes

    def request(weights: Any, x: Any, h0: Any, c0: Any, masks: Any) -> LSTMForwardRequest:
        """A request of the case's kind, on new outputs, cache and workspace."""
        return LSTMForwardRequest(
            config=config, weights=weights, x=x, hidden=h0, cell=c0, sequence_lengths=lengths,
            output=np.empty((seq_len, batch, width), dtype), hidden_out=np.empty((size_ld, batch, h), dtype),
            cell_out=np.empty((size_ld, batch, h), dtype), training=training,
            cache=np.zeros(nbytes, np.uint8) if training else None, dropout_masks=masks if training else None,
            workspace=_Workspace())

    def results(r: LSTMForwardRequest) -> dict[str, Any]:
        out: dict[str, Any] = dict(output=r.output, hidden=r.hidden_out, cell=r.cell_out)
        if r.training:
            assert r.cache is not None
            gates = tuple(_gradients_like(g) for g in params.gates)
            grads = LSTMGradientBuffers(input=np.empty_like(r.x), hidden=np.empty_like(r.hidden_out),
                                        cell=np.empty_like(r.cell_out), gates=gates)  # type: ignore[arg-type]
            backend.lstm_backward(LSTMBackwardRequest(
                config=config, weights=r.weights, x=r.x, cache=r.cache,
                output_gradient=np.ones_like(r.output), hidden_gradient=None, cell_gradient=None,
                sequence_lengths=lengths, gradients=grads, workspace=_Workspace()))
            out.update(d_input=grads.input, d_hidden=grads.hidden, d_cell=grads.cell,
                       d_forget_hidden_weights=gates[1].hidden_weights, d_output_bias=gates[3].bias)
        return out

    def check() -> None:
        weights = backend.lstm_pack_weights(LSTMPackRequest(config=config, gates=params.gates))
        prepared = None
        for call in range(2):
            x = rng.standard_normal((seq_len, batch, 3)).astype(dtype)
            if lengths is not None:
                x[np.arange(seq_len)[:, None] >= lengths[None, :]] = 0.0
            h0 = rng.standard_normal((size_ld, batch, h)).astype(dtype) if case["states"] else None
            c0 = rng.standard_normal((size_ld, batch, h)).astype(dtype) if case["states"] else None
            masks = None
            if config.dropout > 0.0:
                masks = (None, *((rng.random((seq_len, batch, width)) >= config.dropout).astype(dtype) / 0.7
                                 for _ in range(1, params.num_layers)))
            unprepared = request(weights, x, h0, c0, masks)
            backend.lstm_forward(unprepared)
            r = request(weights, x, h0, c0, masks)
            if prepared is None:  # made from the first call's request, used for both
                prepared = prepare(r)
                if prepared is None:  # nothing prepared for this kind: lstm_forward serves it
                    return
            call_prepared(prepared, r)
            want, got = results(unprepared), results(r)
            for name, expected in want.items():
                compare.arrays(where, f"call {call + 1}: {name}", got[name], expected)

    compare.run(where, check)


_NORMALIZATION_SHAPES = {"small": (3, 4, 3, 5), "large": (4, 8, 40, 40)}


def _normalization_cases(quick: bool) -> Iterator[dict[str, Any]]:
    kinds = ("batch", "instance", "layer", "group", "rms")
    activations = ("identity", "relu", "gelu")
    sizes = ("small",) if quick else ("small", "large")
    dtypes = (np.float64,) if quick else (np.float32, np.float64)
    for kind, activation, size, dtype in itertools.product(kinds, activations, sizes, dtypes):
        phases = ("training", "inference") if kind in ("batch", "instance") else ("training",)
        for phase in phases:
            yield dict(kind=kind, activation=activation, size=size, dtype=dtype, phase=phase)


def _normalization_parameters(case: dict[str, Any], rng: np.random.Generator) -> NormalizationParameters:
    shape = _NORMALIZATION_SHAPES[case["size"]]
    channels = shape[1]
    kind = case["kind"]
    if kind == "batch":
        ntype = NormalizationType.batch(rng.standard_normal(channels), rng.uniform(0.5, 2.0, channels))
    elif kind == "instance":
        ntype = NormalizationType.instance(rng.standard_normal(channels), rng.uniform(0.5, 2.0, channels))
    elif kind == "layer":
        ntype = NormalizationType.layer(normalization_axis=1)
    elif kind == "rms":
        ntype = NormalizationType.rms(normalization_axis=1)
    else:
        ntype = NormalizationType.group(group_count=2)
    affine = shape[2:] if kind in ("layer", "rms") else (channels,)
    activations = {"identity": Activation.identity(), "relu": Activation.relu(), "gelu": Activation.gelu()}
    act = activations[case["activation"]]
    return NormalizationParameters(type=ntype, input_shape=shape[1:], gamma=rng.uniform(0.5, 1.5, affine),
                                   beta=None if kind == "rms" else rng.standard_normal(affine), momentum=0.9,
                                   activation=act, dtype=case["dtype"])


def _check_normalization(compare: _Comparison, backend: Any, reference: Any, case: dict[str, Any]) -> None:
    where = "normalization " + _describe(case)
    rng = np.random.default_rng(5)
    params = _normalization_parameters(case, rng)
    shape = _NORMALIZATION_SHAPES[case["size"]]
    x = (rng.standard_normal(shape) + 0.5).astype(case["dtype"])
    dy = rng.standard_normal(shape).astype(case["dtype"])

    def results(spec: Any) -> dict[str, Any]:
        with NormalizationLayer(params, FilterParameters(backend=spec)) as layer:
            forward = layer.apply_with_statistics(x, phase=case["phase"])
            y = forward.output
            grads = layer.apply_backward(x, dy, output=y, phase=case["phase"])
            return dict(output=y, mean=forward.mean, inv_std_dev=forward.inv_std_dev, d_input=grads.input,
                        d_gamma=grads.gamma, d_beta=grads.beta, moving_mean=layer.moving_mean,
                        moving_variance=layer.moving_variance)

    def check() -> None:
        want, got = results(reference), results(backend)
        for name, expected in want.items():
            compare.arrays(where, name, got.get(name), expected)

    compare.run(where, check)


def _fully_connected_cases(quick: bool) -> Iterator[dict[str, Any]]:
    dtypes = (np.float64,) if quick else (np.float32, np.float64)
    combinations = itertools.product(dtypes, (True, False), ("identity", "tanh"), (2, 3))
    for dtype, bias, activation, rank in combinations:
        yield dict(dtype=dtype, bias=bias, activation=activation, rank=rank)


def _check_fully_connected(compare: _Comparison, backend: Any, reference: Any, case: dict[str, Any]) -> None:
    where = "fully connected " + _describe(case)
    rng = np.random.default_rng(9)
    dtype = case["dtype"]
    act = Activation.tanh() if case["activation"] == "tanh" else Activation.identity()
    params = FullyConnectedParameters(
        input_size=6, output_size=5, weights=rng.standard_normal((5, 6)),
        bias=rng.standard_normal(5) if case["bias"] else None, activation=act, dtype=dtype)
    shape = (4, 3, 6) if case["rank"] == 3 else (4, 6)
    x = rng.standard_normal(shape).astype(dtype)
    dy = rng.standard_normal((*shape[:-1], 5)).astype(dtype)

    def results(spec: Any) -> dict[str, Any]:
        with FullyConnectedLayer(params, FilterParameters(backend=spec)) as layer:
            y = layer.apply(x)
            grads = layer.apply_backward(x, dy, output=y)
            return dict(output=y, d_input=grads.input, d_weights=grads.weights, d_bias=grads.bias)

    def check() -> None:
        want, got = results(reference), results(backend)
        for name, expected in want.items():
            compare.arrays(where, name, got.get(name), expected)

    compare.run(where, check)


def _check_gemm(compare: _Comparison, backend: Any, reference: Any) -> None:
    rng = np.random.default_rng(1)
    for dtype, trans_a, trans_b, (alpha, beta) in itertools.product(
            (np.float32, np.float64), (False, True), (False, True), ((1.0, 0.0), (-0.5, 2.0))):
        case = dict(dtype=dtype, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
        where = "gemm " + _describe(case)
        m, n, k = 7, 5, 9
        a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
        b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
        c = rng.standard_normal((m, n)).astype(dtype)

        def product(spec: Any, a: Any = a, b: Any = b, c: Any = c, trans_a: bool = trans_a,
                    trans_b: bool = trans_b, alpha: float = alpha, beta: float = beta) -> Any:
            out = c.copy()
            request = GemmRequest(a=a, b=b, out=out, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
            result = spec.gemm(request).out
            if result is not out:
                raise AssertionError("gemm must return the request's out array when one is given")
            return result

        def check(where: str = where, product: Callable[[Any], Any] = product) -> None:
            compare.arrays(where, "out", product(backend), product(reference))

        compare.run(where, check)


def check_backend(backend: Any, *, rtol: float | None = None, atol: float | None = None, quick: bool = False,
                  raise_on_failure: bool = True) -> ConformanceReport:
    """Run every layer configuration on ``backend`` and on the reference; compare everything.

    Parameters
    ----------
    backend : str or backend object
        A registered name or an object implementing the contract (checked first: an object
        that breaks the contract raises :class:`~bnnsfw.BackendError` naming what it lacks).
    rtol, atol : float, optional
        Override the contract's per-dtype tolerance (:data:`bnnsfw.backends.contract.TOLERANCE`).
    quick : bool
        One dtype (float64) and fewer combinations: a few seconds instead of about ten.
    raise_on_failure : bool
        Raise :class:`ConformanceError` listing every disagreement (default); otherwise
        return them in the report.

    Returns
    -------
    ConformanceReport
    """
    candidate = backends.get_backend(backend)
    reference = backends.get_backend(REFERENCE)
    compare = _Comparison(rtol, atol)
    _check_gemm(compare, candidate, reference)
    for case in _lstm_cases(quick):
        _check_lstm(compare, candidate, reference, case)
    for case in _prepared_cases(quick):
        _check_prepared_lstm(compare, candidate, case)
    for case in _lstm_bptt_cases(quick):
        _check_lstm_bptt(compare, candidate, case)
    for case in _normalization_cases(quick):
        _check_normalization(compare, candidate, reference, case)
    for case in _fully_connected_cases(quick):
        _check_fully_connected(compare, candidate, reference, case)
    report = ConformanceReport(backend=candidate.name, checked=compare.checked, compared=compare.compared,
                               failures=compare.failures)
    if compare.failures and raise_on_failure:
        shown = "\n".join(f"  - {failure}" for failure in compare.failures[:50])
        more = len(compare.failures) - 50
        raise ConformanceError(
            f"backend {candidate.name!r} disagrees with the reference in {len(compare.failures)} of "
            f"{compare.checked} configurations' checks:\n{shown}"
            + (f"\n  … and {more} more" if more > 0 else ""))
    return report
