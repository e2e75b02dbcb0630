"""Optimizers: the first two steps against hand arithmetic, clipping, weight decay, state saving,
in-place updates (seen by a client-pointer layer) and errors."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw import FilterParameters
from bnnsfw.layers.fully_connected import FullyConnectedLayer, FullyConnectedParameters
from bnnsfw.optimizers import SGD, Adam, Optimizer, RMSProp, clip_gradients

P0 = [1.0, -2.0, 0.5]
G1 = [0.5, 1.0, -2.0]
G2 = [-1.0, 0.25, 3.0]


def run(optimizer, gradients, start=P0, dtype=np.float64):
    """Step ``optimizer`` once per gradient on a copy of ``start``; return the parameter after each step."""
    p = np.array(start, dtype=dtype)
    history = []
    for g in gradients:
        optimizer.step([p], [np.array(g, dtype=dtype)])
        history.append(p.copy())
    return history


def close(actual, expected, rel=1e-12):
    np.testing.assert_allclose(actual, expected, rtol=rel, atol=1e-15)


# The update rules, checked by hand for two steps.
def test_sgd_two_steps():
    lr = 0.1
    first, second = run(SGD(lr), [G1, G2])
    p1 = [p - lr * g for p, g in zip(P0, G1)]
    p2 = [p - lr * g for p, g in zip(p1, G2)]
    close(first, p1)
    close(second, p2)


def test_sgd_momentum_two_steps():
    lr, mu = 0.1, 0.9
    first, second = run(SGD(lr, momentum=mu), [G1, G2])
    v1 = list(G1)  # v = μ·0 + g
    p1 = [p - lr * v for p, v in zip(P0, v1)]
    v2 = [mu * v + g for v, g in zip(v1, G2)]
    p2 = [p - lr * v for p, v in zip(p1, v2)]
    close(first, p1)
    close(second, p2)


def test_sgd_nesterov_two_steps():
    lr, mu = 0.1, 0.9
    first, second = run(SGD(lr, momentum=mu, nesterov=True), [G1, G2])
    v1 = list(G1)
    p1 = [p - lr * (g + mu * v) for p, g, v in zip(P0, G1, v1)]
    v2 = [mu * v + g for v, g in zip(v1, G2)]
    p2 = [p - lr * (g + mu * v) for p, g, v in zip(p1, G2, v2)]
    close(first, p1)
    close(second, p2)


def test_adam_two_steps():
    lr, b1, b2, eps = 0.01, 0.8, 0.9, 1e-8
    first, second = run(Adam(lr, beta1=b1, beta2=b2, epsilon=eps), [G1, G2])
    p, m, v = list(P0), [0.0] * 3, [0.0] * 3
    expected = []
    for t, grad in enumerate([G1, G2], start=1):
        for i, g in enumerate(grad):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat = m[i] / (1 - b1**t)
            v_hat = v[i] / (1 - b2**t)
            p[i] -= lr * m_hat / (math.sqrt(v_hat) + eps)
        expected.append(list(p))
    close(first, expected[0])
    close(second, expected[1])
    # After one step each element moves by about lr, against the gradient's sign.
    close(first, [p - lr * math.copysign(1, g) for p, g in zip(P0, G1)], rel=1e-7)


def rmsprop_by_hand(lr, alpha, eps, momentum, centered, gradients):
    p, s, a, b = list(P0), [0.0] * 3, [0.0] * 3, [0.0] * 3
    history = []
    for grad in gradients:
        for i, g in enumerate(grad):
            s[i] = alpha * s[i] + (1 - alpha) * g * g
            if centered:
                a[i] = alpha * a[i] + (1 - alpha) * g
                d = math.sqrt(s[i] - a[i] * a[i]) + eps
            else:
                d = math.sqrt(s[i]) + eps
            if momentum:
                b[i] = momentum * b[i] + g / d
                p[i] -= lr * b[i]
            else:
                p[i] -= lr * g / d
        history.append(list(p))
    return history


@pytest.mark.parametrize("momentum", [0.0, 0.5])
@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_two_steps(momentum, centered):
    lr, alpha, eps = 0.01, 0.9, 1e-8
    got = run(RMSProp(lr, alpha=alpha, epsilon=eps, momentum=momentum, centered=centered), [G1, G2])
    expected = rmsprop_by_hand(lr, alpha, eps, momentum, centered, [G1, G2])
    close(got[0], expected[0])
    close(got[1], expected[1])


# The gradient pipeline: scale → clip by value → clip by norm → weight decay.
def test_clip_by_value():
    (p1,) = run(SGD(1.0, clip_value=1.0), [[3.0, -0.5, -4.0]])
    close(p1, [P0[0] - 1.0, P0[1] + 0.5, P0[2] + 1.0])


def test_clip_by_global_norm_over_all_parameters():
    a, b = np.array([1.0, 1.0]), np.array([2.0])
    SGD(1.0, clip_norm=1.0).step([a, b], [np.array([3.0, 0.0]), np.array([4.0])])
    factor = 1.0 / (5.0 + 1e-6)  # the norm of (3, 0, 4) is 5
    close(a, [1.0 - 3.0 * factor, 1.0])
    close(b, [2.0 - 4.0 * factor])
    assert math.hypot(1.0 - a[0], 2.0 - b[0]) <= 1.0
    # Below the threshold nothing is scaled.
    c = np.array([1.0])
    SGD(1.0, clip_norm=10.0).step([c], [np.array([3.0])])
    close(c, [-2.0])


def test_step_order_scale_clip_then_decay():
    lr, scale, clip, decay = 0.5, 10.0, 1.0, 0.25
    (p1,) = run(SGD(lr, gradient_scale=scale, clip_value=clip, weight_decay=decay), [[0.05, -0.5, 0.02]])
    # scaled: 0.5, −5, 0.2; clipped: 0.5, −1, 0.2; decay adds 0.25·p, which is not clipped.
    g = [0.5 + decay * P0[0], -1.0 + decay * P0[1], 0.2 + decay * P0[2]]
    close(p1, [p - lr * gi for p, gi in zip(P0, g)])


def test_clip_norm_sees_value_clipped_gradients():
    p = np.array([0.0, 0.0])
    SGD(1.0, clip_value=1.0, clip_norm=1.0).step([p], [np.array([10.0, 0.0])])
    # clipped by value to (1, 0): norm 1, so the norm clipping scales by 1/(1 + 1e-6) only.
    close(p, [-1.0 / (1.0 + 1e-6), 0.0])


def test_weight_decay_is_l2_added_to_the_gradient():
    decay = 0.1
    for make in (lambda **kw: Adam(0.01, **kw), lambda **kw: RMSProp(0.01, momentum=0.3, **kw),
                 lambda **kw: SGD(0.1, momentum=0.5, **kw)):
        with_decay = make(weight_decay=decay)
        without = make()
        p = np.array(P0)
        q = np.array(P0)
        for g in (G1, G2):
            with_decay.step([p], [np.array(g)])
            without.step([q], [np.array(g) + decay * q])
        close(p, q)


def test_gradient_scale():
    (p1,) = run(Adam(0.01, gradient_scale=4.0), [G1])
    (q1,) = run(Adam(0.01), [[4.0 * g for g in G1]])
    close(p1, q1)


# State.
CONFIGS = {
    "sgd": lambda: SGD(0.05),
    "sgd-nesterov": lambda: SGD(0.05, momentum=0.9, nesterov=True, weight_decay=0.01, clip_norm=2.0),
    "adam": lambda: Adam(0.01, clip_value=1.5),
    "rmsprop-centered-momentum": lambda: RMSProp(0.01, momentum=0.5, centered=True),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_state_dict_round_trip_continues_identically(rng, name):
    shapes = [(3, 2), (2,)]
    start = [rng.standard_normal(s) for s in shapes]
    grads = [[rng.standard_normal(s) for s in shapes] for _ in range(5)]

    uninterrupted = CONFIGS[name]()
    params = [a.copy() for a in start]
    for g in grads:
        uninterrupted.step(params, g)

    first = CONFIGS[name]()
    resumed = [a.copy() for a in start]
    for g in grads[:3]:
        first.step(resumed, g)
    buffer = io.BytesIO()
    np.savez(buffer, **first.state_dict())
    buffer.seek(0)
    second = CONFIGS[name]()
    with np.load(buffer) as saved:
        second.load_state_dict(saved)
    assert second.step_count == 3
    for g in grads[3:]:
        second.step(resumed, g)
    assert second.step_count == uninterrupted.step_count == 5
    for a, b in zip(resumed, params):
        np.testing.assert_array_equal(a, b)


def test_state_dict_contents_and_copies():
    opt = Adam(0.01)
    assert opt.state_dict() == {"step_count": 0, "parameter_count": 0}
    p = np.array(P0, dtype=np.float32)
    opt.step([p], [np.array(G1, dtype=np.float32)])
    state = opt.state_dict()
    assert set(state) == {"step_count", "parameter_count", "shape.0", "exp_avg.0", "exp_avg_sq.0"}
    assert state["step_count"] == 1 and state["parameter_count"] == 1
    np.testing.assert_array_equal(state["shape.0"], [3])
    assert state["exp_avg.0"].dtype == np.float32
    close(state["exp_avg.0"], [0.1 * g for g in G1], rel=1e-6)
    saved = state["exp_avg.0"].copy()
    opt.step([p], [np.array(G2, dtype=np.float32)])
    np.testing.assert_array_equal(state["exp_avg.0"], saved)  # a copy, not the live buffer
    assert set(SGD(0.1).state_dict()) == {"step_count", "parameter_count"}


def test_load_fresh_state_resets():
    opt = SGD(0.1, momentum=0.9)
    p = np.array(P0)
    opt.step([p], [np.array(G1)])
    opt.load_state_dict(SGD(0.1, momentum=0.9).state_dict())
    assert opt.step_count == 0
    opt.step([np.zeros(5)], [np.ones(5)])  # a new set of parameters is accepted after a reset


# In-place updates.
def test_updates_in_place_and_leaves_gradients_alone():
    for opt in (SGD(0.1, momentum=0.9), Adam(0.1), RMSProp(0.1)):
        p = np.array(P0, dtype=np.float32)
        g = np.array(G1, dtype=np.float32)
        params = [p]
        address = p.__array_interface__["data"][0]
        opt.step(params, [g])
        assert params[0] is p and p.__array_interface__["data"][0] == address
        assert p.dtype == np.float32 and not np.array_equal(p, np.array(P0, dtype=np.float32))
        np.testing.assert_array_equal(g, np.array(G1, dtype=np.float32))


def test_client_pointer_layer_sees_the_update(backend_name, rng):
    params = FullyConnectedParameters.random(input_size=3, output_size=2, seed=4, dtype=np.float64)
    layer = FullyConnectedLayer(params, FilterParameters(backend=backend_name, use_client_pointer=True))
    x = rng.standard_normal((5, 3))
    dy = rng.standard_normal((5, 2))
    grads = layer.apply_backward(x, dy)
    opt = SGD(0.5)
    opt.step([params.weights, params.bias], [grads.weights, grads.bias])
    assert layer.weights is params.weights
    expected_w = params.weights  # updated in place: the same array the layer reads
    np.testing.assert_allclose(layer.apply(x), x @ expected_w.T + params.bias, rtol=1e-12)
    fresh = FullyConnectedParameters.random(input_size=3, output_size=2, seed=4, dtype=np.float64)
    np.testing.assert_allclose(expected_w, fresh.weights - 0.5 * grads.weights, rtol=1e-12)


def test_training_a_layer_reduces_the_loss(backend_name, rng):
    from bnnsfw.losses import MeanSquaredError

    params = FullyConnectedParameters.random(input_size=3, output_size=2, seed=1, dtype=np.float64)
    layer = FullyConnectedLayer(params, FilterParameters(backend=backend_name))
    x = rng.standard_normal((16, 3))
    target = x @ np.array([[1.0, -1.0, 0.5], [0.0, 2.0, -1.0]]).T + 0.3
    opt = Adam(0.05)
    losses = []
    for _ in range(60):
        result = MeanSquaredError().apply(layer.apply(x), target)
        grads = layer.apply_backward(x, result.gradient)
        opt.step([layer.weights, layer.bias], [grads.weights, grads.bias])
        losses.append(result.loss)
    assert losses[-1] < 0.1 * losses[0]


# Hyperparameters.
def test_properties_and_repr():
    opt = RMSProp(0.02, alpha=0.9, momentum=0.1, centered=True, clip_norm=3.0)
    assert (opt.learning_rate, opt.alpha, opt.momentum, opt.centered) == (0.02, 0.9, 0.1, True)
    assert opt.clip_norm == 3.0 and opt.clip_value is None
    assert opt.epsilon == 1e-8 and opt.gradient_scale == 1.0 and opt.weight_decay == 0.0
    assert repr(opt).startswith("RMSProp(learning_rate=0.02, alpha=0.9")
    assert repr(opt).endswith("step_count=0)")
    adam = Adam()
    assert (adam.learning_rate, adam.beta1, adam.beta2, adam.epsilon) == (1e-3, 0.9, 0.999, 1e-8)
    sgd = SGD(0.1, momentum=0.5, nesterov=True)
    assert sgd.momentum == 0.5 and sgd.nesterov and isinstance(sgd, Optimizer)


def test_learning_rate_can_change_between_steps():
    opt = SGD(0.1)
    p = np.array([1.0])
    opt.step([p], [np.array([1.0])])
    opt.learning_rate = 0.5
    opt.step([p], [np.array([1.0])])
    close(p, [1.0 - 0.1 - 0.5])
    opt.learning_rate = 0  # where a schedule may end: the parameters stay as they are
    opt.step([p], [np.array([1.0])])
    close(p, [1.0 - 0.1 - 0.5])
    with pytest.raises(bf.InvalidParameterError, match="SGD.learning_rate must be a finite number >= 0"):
        opt.learning_rate = -0.1


@pytest.mark.parametrize("name", ["momentum", "nesterov", "weight_decay", "clip_norm", "gradient_scale"])
def test_only_the_learning_rate_can_be_assigned(name):
    opt = SGD(0.1, momentum=0.5)
    with pytest.raises(AttributeError):
        setattr(opt, name, getattr(opt, name))
    assert opt.momentum == 0.5 and opt.state_dict() == {"step_count": 0, "parameter_count": 0}


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: SGD(-1.0), "SGD.learning_rate must be a finite number >= 0"),
        (lambda: SGD(lr=-1.0), "SGD.learning_rate must be a finite number >= 0"),
        (lambda: Adam(0.1, lr=0.2), r"Adam\(lr\) must be left out when learning_rate is given"),
        (lambda: RMSProp(learning_rate=0.1, lr=0.1),
         r"RMSProp\(lr\) must be left out .*lr=0.1 and learning_rate=0.1"),
        (lambda: Adam(float("nan")), "Adam.learning_rate must be finite"),
        (lambda: SGD(0.1, momentum=1.0), r"SGD.momentum must be in \[0.0, 1.0\)"),
        (lambda: SGD(0.1, momentum=-0.1), r"SGD.momentum must be in \[0.0, 1.0\)"),
        (lambda: SGD(0.1, nesterov=True), "SGD.momentum must be > 0 when nesterov=True"),
        (lambda: SGD(0.1, momentum=0.5, nesterov=1), "SGD.nesterov must be True or False"),
        (lambda: SGD(0.1, weight_decay=-0.1), r"SGD.weight_decay must be in \[0.0, None\]"),
        (lambda: SGD(0.1, clip_value=0.0), "SGD.clip_value must be a finite number > 0"),
        (lambda: Adam(clip_norm=-1.0), "Adam.clip_norm must be a finite number > 0"),
        (lambda: Adam(gradient_scale=0.0), "Adam.gradient_scale must be a finite number > 0"),
        (lambda: Adam(beta1=1.0), r"Adam.beta1 must be in \[0.0, 1.0\)"),
        (lambda: Adam(beta2=-0.5), r"Adam.beta2 must be in \[0.0, 1.0\)"),
        (lambda: Adam(epsilon=0.0), "Adam.epsilon must be a finite number > 0"),
        (lambda: RMSProp(alpha=1.0), r"RMSProp.alpha must be in \[0.0, 1.0\)"),
        (lambda: RMSProp(momentum=1.5), r"RMSProp.momentum must be in \[0.0, 1.0\)"),
        (lambda: RMSProp(epsilon=-1e-8), "RMSProp.epsilon must be a finite number > 0"),
        (lambda: RMSProp(centered="yes"), "RMSProp.centered must be True or False"),
        (lambda: SGD("fast"), "SGD.learning_rate must be a number"),
    ],
)
def test_hyperparameter_errors(make, match):
    with pytest.raises(bf.InvalidParameterError, match=match):
        make()


# Step errors.
def test_step_argument_errors():
    opt = Adam()
    p = np.array(P0)
    match = r"Adam.step\(parameters\) must be a list or tuple of arrays \(wrap a single array in a list\)"
    with pytest.raises(bf.InvalidParameterError, match=match):
        opt.step(p, [np.array(G1)])
    match = r"Adam.step\(gradients\) must be 1 arrays, one per parameter; got '2 arrays'"
    with pytest.raises(bf.InvalidParameterError, match=match):
        opt.step([p], [np.array(G1), np.array(G2)])
    with pytest.raises(bf.InvalidParameterError, match=r"step\(parameters\) must be at least one array"):
        opt.step([], [])
    with pytest.raises(bf.ShapeError, match=r"Adam.step\(gradients\[0\]\) must be of shape \(3,\)"):
        opt.step([p], [np.ones(4)])
    with pytest.raises(bf.DTypeError, match=r"Adam.step\(gradients\[0\]\) must be a float64 array"):
        opt.step([p], [np.ones(3, np.float32)])
    with pytest.raises(bf.DTypeError, match=r"step\(parameters\[0\]\) must be a float32 or float64 array"):
        opt.step([np.ones(3, np.int64)], [np.ones(3)])
    match = r"step\(parameters\[0\]\) must be a NumPy array \(updated in place; layer.parameters\(\) and"
    with pytest.raises(bf.InvalidParameterError, match=match):
        opt.step([[1.0, 2.0]], [[1.0, 1.0]])
    frozen = np.ones(3)
    frozen.flags.writeable = False
    with pytest.raises(bf.InvalidParameterError, match=r"step\(parameters\[0\]\) must be a writable array"):
        opt.step([frozen], [np.ones(3)])
    assert opt.step_count == 0  # nothing happened
    np.testing.assert_array_equal(p, P0)


def test_later_steps_must_match_the_first():
    opt = SGD(0.1, momentum=0.9)
    a, b = np.ones(3), np.ones((2, 2))
    opt.step([a, b], [np.ones(3), np.ones((2, 2))])
    match = r"SGD.step\(parameters\) must be the 2 arrays of the earlier steps"
    with pytest.raises(bf.InvalidParameterError, match=match):
        opt.step([a], [np.ones(3)])
    match = r"SGD.step\(parameters\[1\]\) must be of shape \(2, 2\), as in the earlier steps"
    with pytest.raises(bf.ShapeError, match=match):
        opt.step([a, np.ones(4)], [np.ones(3), np.ones(4)])
    match = r"step\(parameters\[0\]\) must be float64, as in the earlier steps"
    with pytest.raises(bf.DTypeError, match=match):
        opt.step([np.ones(3, np.float32), b], [np.ones(3, np.float32), np.ones((2, 2))])
    assert opt.step_count == 1
    # Gradients may be plain sequences.
    opt.step([a, b], [[1.0, 1.0, 1.0], np.ones((2, 2))])
    assert opt.step_count == 2


@pytest.mark.parametrize("name", list(CONFIGS))
def test_steps_by_name_pair_arrays_by_name_whatever_the_order(rng, name):
    shapes = {"w": (3, 2), "b": (2,), "v": (4,)}
    start = {n: rng.standard_normal(s) for n, s in shapes.items()}
    grads = [{n: rng.standard_normal(s) for n, s in shapes.items()} for _ in range(4)]
    by_position, listed = CONFIGS[name](), [a.copy() for a in start.values()]
    by_name, named = CONFIGS[name](), {n: a.copy() for n, a in start.items()}
    for step, g in enumerate(grads):
        by_position.step(listed, list(g.values()))
        shuffled = dict(reversed(g.items())) if step % 2 else g   # the order of the names does not matter
        by_name.step(named, shuffled)
    for a, b in zip(listed, named.values()):
        np.testing.assert_array_equal(a, b)
    state = by_name.state_dict()
    assert state["parameter_names"].tolist() == ["w", "b", "v"]
    resumed = CONFIGS[name]()
    resumed.load_state_dict(state)
    with pytest.raises(bf.InvalidParameterError, match=r"missing names \['v'\], unexpected names \['u'\]"):
        resumed.step({"w": named["w"], "b": named["b"], "u": named["v"]},
                     {"w": grads[0]["w"], "b": grads[0]["b"], "u": grads[0]["v"]})
    resumed.step(dict(reversed(named.items())), grads[0])
    assert resumed.step_count == 5


def test_by_name_and_by_position_do_not_mix():
    named = SGD(0.1)
    named.step({"a": np.ones(2)}, {"a": np.ones(2)})
    with pytest.raises(bf.InvalidParameterError,
                       match=r"SGD.step\(parameters\) must be a mapping of name to array, as in the earlier"):
        named.step([np.ones(2)], [np.ones(2)])
    positional = SGD(0.1)
    positional.step([np.ones(2)], [np.ones(2)])
    with pytest.raises(bf.InvalidParameterError, match=r"must be a list or tuple, as in the earlier steps"):
        positional.step({"a": np.ones(2)}, {"a": np.ones(2)})
    with pytest.raises(bf.InvalidParameterError,
                       match=r"SGD.step\(gradients\) must be a mapping of name to gradient, like parameters"):
        SGD(0.1).step({"a": np.ones(2)}, [np.ones(2)])
    with pytest.raises(bf.InvalidParameterError, match=r"must be a mapping with str names; got 0"):
        SGD(0.1).step({0: np.ones(2)}, {0: np.ones(2)})
    with pytest.raises(bf.InvalidParameterError, match=r"parameter_names'\] must be 1 distinct names"):
        SGD(0.1).load_state_dict({**named.state_dict(), "parameter_names": np.array(["a", "b"])})


def test_load_state_dict_errors():
    adam = Adam()
    adam.step([np.ones(3)], [np.ones(3)])
    state = adam.state_dict()
    sgd = SGD(0.1, momentum=0.9)
    match = (r"SGD.load_state_dict\(state\) must be a SGD state with these options; "
             r"got \"missing keys \['momentum_buffer.0'\], unexpected keys \['exp_avg.0', 'exp_avg_sq.0'\]\"")
    with pytest.raises(bf.InvalidParameterError, match=match):
        sgd.load_state_dict(state)
    centered = RMSProp(centered=True)
    rms_state = RMSProp().state_dict() | {"step_count": 1, "parameter_count": 1, "shape.0": np.array([3]),
                                          "square_avg.0": np.ones(3)}
    with pytest.raises(bf.InvalidParameterError, match=r"missing keys \['grad_avg.0'\]"):
        centered.load_state_dict(rms_state)
    match = r"Adam.load_state_dict\(state\)\['exp_avg.0'\] must be of shape \(3,\) \(shape.0\)"
    with pytest.raises(bf.ShapeError, match=match):
        Adam().load_state_dict(state | {"exp_avg.0": np.ones(4)})
    match = r"\['exp_avg_sq.0'\] must be float64, like the other arrays of position 0"
    with pytest.raises(bf.DTypeError, match=match):
        Adam().load_state_dict(state | {"exp_avg_sq.0": np.ones(3, np.float32)})
    with pytest.raises(bf.InvalidParameterError, match=r"\['step_count'\] must be an integer >= 0; got -1"):
        Adam().load_state_dict(state | {"step_count": -1})
    with pytest.raises(bf.InvalidParameterError, match="parameter_count is 0 exactly when step_count is 0"):
        Adam().load_state_dict(state | {"step_count": 0})
    with pytest.raises(bf.InvalidParameterError, match=r"\['shape.0'\] must be a 1-D array of integers >= 0"):
        Adam().load_state_dict(state | {"shape.0": np.array([3.0])})
    with pytest.raises(bf.InvalidParameterError, match=r"must be a mapping from state_dict\(\) or np.load"):
        Adam().load_state_dict([("step_count", 0)])  # type: ignore[arg-type]
    with pytest.raises(bf.InvalidParameterError, match="must be a state with the key 'parameter_count'"):
        Adam().load_state_dict({"step_count": 0})
    # A failed load changes nothing.
    fresh = Adam()
    with pytest.raises(bf.ShapeError):
        fresh.load_state_dict(state | {"exp_avg.0": np.ones(4)})
    assert fresh.step_count == 0 and fresh.state_dict() == {"step_count": 0, "parameter_count": 0}
    # A loaded state fixes the shapes of later steps.
    loaded = Adam()
    loaded.load_state_dict(state)
    with pytest.raises(bf.ShapeError, match=r"must be of shape \(3,\), as in the earlier steps"):
        loaded.step([np.ones(2)], [np.ones(2)])


# Optional cross-check with PyTorch.
def test_matches_torch_optimizers(rng):
    torch = pytest.importorskip("torch")
    shapes = [(3, 2), (4,)]
    start = [rng.standard_normal(s) for s in shapes]
    grads = [[rng.standard_normal(s) * 2 for s in shapes] for _ in range(4)]
    cases = [
        (lambda: SGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
         lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
        (lambda: Adam(0.01, beta1=0.8, beta2=0.95, weight_decay=0.1),
         lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.95), weight_decay=0.1)),
        (lambda: RMSProp(0.01, alpha=0.9, momentum=0.5, centered=True, weight_decay=0.05),
         lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.9, momentum=0.5, centered=True,
                                        weight_decay=0.05)),
        (lambda: RMSProp(0.01),
         lambda ps: torch.optim.RMSprop(ps, lr=0.01)),
    ]
    for ours_factory, theirs_factory in cases:
        ours = ours_factory()
        params = [a.copy() for a in start]
        tensors = [torch.tensor(a.copy(), requires_grad=True) for a in start]
        theirs = theirs_factory(tensors)
        for step_grads in grads:
            ours.step(params, step_grads)
            for t, g in zip(tensors, step_grads):
                t.grad = torch.from_numpy(g.copy())
            theirs.step()
        for a, t in zip(params, tensors):
            np.testing.assert_allclose(a, t.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_clip_norm_matches_torch(rng):
    torch = pytest.importorskip("torch")
    grads = [rng.standard_normal((3, 2)) * 5, rng.standard_normal(4) * 5]
    tensors = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in grads]
    for t, g in zip(tensors, grads):
        t.grad = torch.from_numpy(g.copy())
    torch.nn.utils.clip_grad_norm_(tensors, max_norm=1.5)
    params = [np.zeros(g.shape) for g in grads]
    SGD(1.0, clip_norm=1.5).step(params, grads)
    for p, t in zip(params, tensors):
        np.testing.assert_allclose(-p, t.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("make", [SGD, Adam, RMSProp])
def test_lr_is_the_learning_rate_as_pytorch_spells_it(make):
    assert make(lr=0.25).learning_rate == make(learning_rate=0.25).learning_rate == 0.25
    assert make(0.25).learning_rate == 0.25


# Clipping by global norm, on its own and inside a step.
def test_clip_gradients_scales_in_place_by_the_torch_rule_and_returns_the_norm_before():
    w, b = np.array([[3.0, 0.0]]), np.array([4.0], dtype=np.float64)
    grads = {"w": w, "b": b}
    assert clip_gradients(grads, max_norm=2.0) == 5.0
    assert grads["w"] is w and grads["b"] is b
    factor = 2.0 / (5.0 + 1e-6)
    close(w, [[3.0 * factor, 0.0]])
    close(b, [4.0 * factor])
    below = {"w": np.array([0.3, -0.4], dtype=np.float32)}
    before = below["w"].copy()
    assert clip_gradients(below, max_norm=0.6) == pytest.approx(0.5, rel=1e-7)  # factor ≥ 1: untouched
    np.testing.assert_array_equal(below["w"], before)
    assert clip_gradients({}, 1.0) == 0.0


def test_clip_gradients_norm_is_taken_in_float64():
    big = {"g": np.full(4, 3e20, dtype=np.float32)}  # squares overflow float32
    assert clip_gradients(big, 1e30) == pytest.approx(6e20, rel=1e-7)


def test_clip_gradients_clips_a_models_gradients_that_the_optimizer_then_uses(rng):
    layer = FullyConnectedLayer(FullyConnectedParameters.random(input_size=3, output_size=2, seed=0,
                                                                dtype=np.float64))
    x = rng.standard_normal((4, 3))
    grads = layer.apply_backward(x, np.full((4, 2), 10.0))
    expected = math.sqrt(sum(float(np.sum(g**2)) for g in grads.parameters().values()))
    norm = clip_gradients(grads.parameters(), 1.0)
    assert norm == pytest.approx(expected, rel=1e-12) and norm > 1.0
    after = math.sqrt(sum(float(np.sum(g**2)) for g in grads.parameters().values()))
    assert after == pytest.approx(1.0, rel=1e-6)
    layer.close()


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda g: clip_gradients(g, float("inf")), bf.InvalidParameterError,
         r"clip_gradients\(max_norm\) must be finite"),
        (lambda g: clip_gradients(g, -1.0), bf.InvalidParameterError,
         r"clip_gradients\(max_norm\) must be in \[0.0"),
        (lambda g: clip_gradients([g["w"]], 1.0), bf.InvalidParameterError,
         r"clip_gradients\(gradients\) must be a mapping"),
        (lambda g: clip_gradients({"w": [1.0]}, 1.0), bf.InvalidParameterError,
         r"gradients\['w'\]\) must be a NumPy array"),
        (lambda g: clip_gradients({"w": np.ones(2, dtype=np.int64)}, 1.0), bf.DTypeError,
         "float32 or float64 array; got 'int64'"),
        (lambda g: clip_gradients(g, 1.0, error_if_nonfinite=1), bf.InvalidParameterError,
         "must be True or False"),
    ],
)
def test_clip_gradients_refuses_bad_input_naming_the_argument(call, error, match):
    grads = {"w": np.array([1.0, 2.0])}
    with pytest.raises(error, match=match):
        call(grads)
    np.testing.assert_array_equal(grads["w"], [1.0, 2.0])


def test_clip_gradients_refuses_read_only_arrays():
    frozen = np.array([1.0, 2.0])
    frozen.flags.writeable = False
    with pytest.raises(bf.InvalidParameterError, match=r"gradients\['w'\]\) must be a writable array"):
        clip_gradients({"w": frozen}, 1.0)


def test_clip_gradients_non_finite_raises_naming_the_array_or_returns_the_norm_untouched():
    grads = {"a": np.array([1.0]), "b": np.array([np.nan, 1.0])}
    with pytest.raises(bf.InvalidParameterError, match=r"clip_gradients\(gradients\['b'\]\) must be finite"):
        clip_gradients(grads, 1.0)
    assert math.isnan(clip_gradients(grads, 1.0, error_if_nonfinite=False))
    np.testing.assert_array_equal(grads["a"], [1.0])
    huge = {"a": np.array([1e200, 1e200])}  # finite arrays, overflowing norm
    with pytest.raises(bf.InvalidParameterError, match=r"clip_gradients\(gradients\) must be finite.*inf"):
        clip_gradients(huge, 1.0)


def test_an_optimizer_reports_the_norm_its_clip_norm_saw():
    opt = SGD(0.1, clip_norm=1.0, gradient_scale=2.0)
    assert opt.last_gradient_norm is None
    p = np.zeros(2)
    opt.step({"p": p}, {"p": np.array([3.0, 4.0])})
    assert opt.last_gradient_norm == 10.0  # after gradient_scale, before clipping
    close(p, [-0.1 * 6.0 / (10.0 + 1e-6), -0.1 * 8.0 / (10.0 + 1e-6)])
    assert SGD(0.1).last_gradient_norm is None
    off = SGD(0.1)
    off.step([p], [np.ones(2)])
    assert off.last_gradient_norm is None


def test_clip_gradients_matches_torch(rng):
    torch = pytest.importorskip("torch")
    grads = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    tensors = [torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float64)) for g in grads.values()]
    for tensor, g in zip(tensors, grads.values()):
        tensor.grad = torch.tensor(g)
    expected = float(torch.nn.utils.clip_grad_norm_(tensors, max_norm=0.5))
    assert clip_gradients(grads, 0.5) == pytest.approx(expected, rel=1e-12)
    for tensor, g in zip(tensors, grads.values()):
        np.testing.assert_allclose(g, tensor.grad.numpy(), rtol=1e-12)
