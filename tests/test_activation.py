import math

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import Activation

A = Activation
X = np.array([-2.5, -0.7, 0.3, 1.9, 7.0])


def _sig(v):
    return 1.0 / (1.0 + math.exp(-v))


# (activation, scalar reference written from the SPEC formulas)
CASES = [
    (A.identity(), lambda v: v),
    (A.relu(), lambda v: max(v, 0.0)),
    (A.leaky_relu(0.1), lambda v: 0.1 * v if v < 0 else v),
    (A.sigmoid(), _sig),
    (A.tanh(), math.tanh),
    (A.scaled_tanh(1.7, 0.6), lambda v: 1.7 * math.tanh(0.6 * v)),
    (A.abs(), abs),
    (A.linear(-0.4), lambda v: -0.4 * v),
    (A.clamp(-1.0, 1.5), lambda v: min(max(v, -1.0), 1.5)),
    (A.gelu_approximation(),
     lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))),
    (A.hard_sigmoid(0.2, 0.5), lambda v: max(0.0, min(1.0, 0.2 * v + 0.5))),
    (A.softplus(2.0, 0.5), lambda v: 2.0 * math.log1p(math.exp(0.5 * v))),
    (A.softsign(), lambda v: v / (1 + abs(v))),
    (A.elu(0.8), lambda v: 0.8 * (math.exp(v) - 1) if v < 0 else v),
    (A.clamped_leaky_relu(0.3, 1.0), lambda v: min(0.3 * v, 1.0) if v < 0 else min(v, 1.0)),
    (A.linear_with_bias(2.0, -1.0), lambda v: 2.0 * v - 1.0),
    (A.log_sigmoid(), lambda v: math.log(_sig(v))),
    (A.selu(), lambda v: 1.0507009873554805 * (v if v > 0 else 1.6732632423543772 * (math.exp(v) - 1))),
    (A.celu(1.3), lambda v: max(0.0, v) + min(0.0, 1.3 * (math.exp(v / 1.3) - 1))),
    (A.hard_shrink(0.5), lambda v: v if abs(v) > 0.5 else 0.0),
    (A.soft_shrink(0.5), lambda v: v - 0.5 if v > 0.5 else (v + 0.5 if v < -0.5 else 0.0)),
    (A.tanh_shrink(), lambda v: v - math.tanh(v)),
    (A.threshold(0.3, -9.0), lambda v: -9.0 if v <= 0.3 else v),
    (A.hard_swish(), lambda v: v * min(max(v + 3, 0.0), 6.0) / 6),
    (A.silu(), lambda v: v * _sig(v)),
    (A.relu6(), lambda v: min(max(v, 0.0), 6.0)),
    (A.erf(), math.erf),
    (A.gelu(), lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2)))),
    (A.gelu_approximation_sigmoid(), lambda v: v * _sig(1.702 * v)),
]
IDS = [c[0].function.name for c in CASES]


def test_every_elementwise_function_is_covered():
    covered = {c[0].function for c in CASES}
    assert covered == {f for f in bf.ActivationFunction if f.is_elementwise}


@pytest.mark.parametrize("act, ref", CASES, ids=IDS)
def test_forward_matches_formula(act, ref):
    expected = np.array([ref(v) for v in X])
    np.testing.assert_allclose(act.forward(X), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("act, ref", CASES, ids=IDS)
def test_derivative_matches_finite_differences(act, ref, rng):
    # points away from every kink used above (0, ±0.5, 0.3, ±1, 1.5, ±3, 6)
    x = np.array([-3.7, -2.2, -0.83, -0.21, 0.12, 0.71, 1.23, 2.4, 4.1, 6.6])
    dy = rng.standard_normal(x.shape)
    eps = 1e-6
    numeric = dy * (act.forward(x + eps) - act.forward(x - eps)) / (2 * eps)
    np.testing.assert_allclose(act.backward(dy, x=x), numeric, rtol=1e-6, atol=1e-8)
    if act.derivative_from_output:
        np.testing.assert_allclose(act.backward(dy, y=act.forward(x)), numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("act, ref", CASES, ids=IDS)
def test_float32_stays_float32_and_input_untouched(act, ref):
    x = X.astype(np.float32)
    before = x.copy()
    y = act.forward(x)
    assert y.dtype == np.float32
    assert act.backward(np.ones_like(x), x=x, y=y).dtype == np.float32
    np.testing.assert_array_equal(x, before)


def test_forward_in_place():
    x = X.copy()
    out = A.tanh().forward(x, out=x)
    assert out is x
    np.testing.assert_allclose(x, np.tanh(X))


def test_function_by_position_keyword_name_and_number():
    assert A(3) == A("sigmoid") == A(function=bf.ActivationFunction.sigmoid) == A.sigmoid()
    assert A(2, 0.1) == A.leaky_relu(0.1)


def test_derivative_needs_input_when_output_does_not_determine_it():
    with pytest.raises(bf.InvalidParameterError, match="gelu.*forward input x"):
        A.gelu().backward(np.ones(3), y=np.ones(3))


@pytest.mark.parametrize("function", ["softmax", "log_softmax", "gumbel", "gumbel_max",
                                      "integer_linear_saturate", "prelu_per_channel"])
def test_non_elementwise_functions_are_refused_where_elementwise_is_required(function):
    act = A(function)
    assert not act.is_elementwise
    with pytest.raises(bf.InvalidParameterError, match=f"per-element activation.*{function}"):
        act.forward(X)
    with pytest.raises(bf.InvalidParameterError, match="LayerX.activation must be a per-element"):
        act.require_elementwise("LayerX.activation")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: A(99), "Activation.function must be"),
        (lambda: A("swishy"), "Activation.function must be one of"),
        (lambda: A(1, alpha=float("nan")), "Activation.alpha must be a finite number"),
        (lambda: A.clamp(2.0, 1.0), r"low <= high"),
        (lambda: A.celu(0.0), "non-zero for CELU"),
    ],
)
def test_bad_parameters_are_refused(make, message):
    with pytest.raises(bf.InvalidParameterError, match=message):
        make()


def test_activation_is_frozen():
    act = A.relu()
    with pytest.raises(AttributeError):
        act.alpha = 2.0  # type: ignore[misc]
