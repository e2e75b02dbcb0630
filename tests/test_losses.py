"""Losses: hand-computed values, finite-difference gradients, label forms, reductions, errors."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw.losses import LossResult, MeanSquaredError, SoftmaxCrossEntropy

from gradcheck import assert_gradient_close, numerical_gradient

REDUCTIONS = ["mean", "sum"]


def softmax_by_hand(row):
    exps = [math.exp(v) for v in row]
    total = sum(exps)
    return [e / total for e in exps]


# Mean squared error.
def test_mse_hand_computed():
    prediction = np.array([[1.0, 2.0], [3.0, 4.0]])
    target = np.array([[0.0, 2.0], [5.0, 1.0]])
    # differences 1, 0, −2, 3; squares 1, 0, 4, 9
    mean = MeanSquaredError().apply(prediction, target)
    assert isinstance(mean, LossResult) and type(mean.loss) is float
    assert mean.loss == pytest.approx(14.0 / 4)
    np.testing.assert_allclose(mean.gradient, [[0.5, 0.0], [-1.0, 1.5]])
    total = MeanSquaredError(reduction="sum").apply(prediction, target)
    assert total.loss == pytest.approx(14.0)
    np.testing.assert_allclose(total.gradient, [[2.0, 0.0], [-4.0, 6.0]])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_mse_gradient_matches_finite_differences(rng, reduction):
    loss = MeanSquaredError(reduction=reduction)
    prediction = rng.standard_normal((2, 3, 4))
    target = rng.standard_normal((2, 3, 4))
    result = loss.apply(prediction, target)
    assert result.gradient.shape == prediction.shape and result.gradient.dtype == np.float64
    numeric = numerical_gradient(lambda: loss.apply(prediction, target).loss, prediction)
    assert_gradient_close(result.gradient, numeric, rtol=1e-6, atol=1e-8)


def test_mse_float32_and_scalar_shapes(rng):
    prediction = rng.standard_normal(5).astype(np.float32)
    target = rng.standard_normal(5).astype(np.float32)
    result = MeanSquaredError().apply(prediction, target)
    assert result.gradient.dtype == np.float32 and type(result.loss) is float
    wide = MeanSquaredError().apply(prediction.astype(np.float64), target.astype(np.float64))
    assert result.loss == pytest.approx(wide.loss, rel=1e-6)
    # Plain sequences are accepted (as float64).
    assert MeanSquaredError().apply([1.0, 3.0], [1.0, 1.0]).loss == pytest.approx(2.0)


# Softmax cross-entropy.
def test_cross_entropy_hand_computed():
    logits = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 0.0]])
    labels = np.array([2, 0])
    p0, p1 = softmax_by_hand(logits[0]), softmax_by_hand(logits[1])
    losses = [-math.log(p0[2]), -math.log(p1[0])]
    total = SoftmaxCrossEntropy(reduction="sum").apply(logits, labels)
    assert total.loss == pytest.approx(sum(losses), rel=1e-12)
    expected = [[p0[0], p0[1], p0[2] - 1], [p1[0] - 1, p1[1], p1[2]]]  # softmax − one-hot
    np.testing.assert_allclose(total.gradient, expected, rtol=1e-12)
    mean = SoftmaxCrossEntropy().apply(logits, labels)
    assert mean.loss == pytest.approx(sum(losses) / 2, rel=1e-12)
    np.testing.assert_allclose(mean.gradient, total.gradient / 2, rtol=1e-12)


def test_cross_entropy_probability_targets_hand_computed():
    logits = np.array([[0.0, math.log(3.0)]])  # softmax = (1/4, 3/4)
    target = np.array([[0.5, 0.5]])
    result = SoftmaxCrossEntropy().apply(logits, target)
    assert result.loss == pytest.approx(-0.5 * math.log(0.25) - 0.5 * math.log(0.75), rel=1e-12)
    np.testing.assert_allclose(result.gradient, [[0.25 - 0.5, 0.75 - 0.5]], rtol=1e-12)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (6,)], ids=["NC", "TNC", "C"])
def test_labels_and_one_hot_agree(rng, reduction, shape):
    loss = SoftmaxCrossEntropy(reduction=reduction)
    logits = rng.standard_normal(shape)
    labels = rng.integers(0, shape[-1], size=shape[:-1])
    one_hot = np.eye(shape[-1])[labels]
    a, b = loss.apply(logits, labels), loss.apply(logits, one_hot)
    assert a.loss == pytest.approx(b.loss, rel=1e-13)
    np.testing.assert_allclose(a.gradient, b.gradient, rtol=1e-13, atol=1e-15)
    assert a.gradient.shape == shape


def test_mean_is_sum_over_samples(rng):
    logits = rng.standard_normal((2, 3, 4))
    labels = rng.integers(0, 4, size=(2, 3))
    mean = SoftmaxCrossEntropy(reduction="mean").apply(logits, labels)
    total = SoftmaxCrossEntropy(reduction="sum").apply(logits, labels)
    assert total.loss == pytest.approx(6 * mean.loss, rel=1e-13)  # 6 samples: every position but classes
    np.testing.assert_allclose(total.gradient, 6 * mean.gradient, rtol=1e-13)
    prediction = rng.standard_normal((2, 3, 4))
    mse_mean = MeanSquaredError(reduction="mean").apply(prediction, logits)
    mse_sum = MeanSquaredError(reduction="sum").apply(prediction, logits)
    assert mse_sum.loss == pytest.approx(24 * mse_mean.loss, rel=1e-13)  # 24 elements


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("target_kind", ["labels", "distribution", "unnormalised"])
def test_cross_entropy_gradient_matches_finite_differences(rng, reduction, target_kind):
    loss = SoftmaxCrossEntropy(reduction=reduction)
    logits = rng.standard_normal((2, 3, 4)) * 3
    if target_kind == "labels":
        target = rng.integers(0, 4, size=(2, 3))
    else:
        target = rng.uniform(0.1, 1.0, size=(2, 3, 4))
        if target_kind == "distribution":
            target /= target.sum(axis=-1, keepdims=True)
    result = loss.apply(logits, target)
    numeric = numerical_gradient(lambda: loss.apply(logits, target).loss, logits)
    assert_gradient_close(result.gradient, numeric, rtol=1e-6, atol=1e-8)


def test_cross_entropy_is_numerically_stable():
    logits = np.array([[1000.0, 0.0, -1000.0]], dtype=np.float32)
    best = SoftmaxCrossEntropy().apply(logits, np.array([0]))
    worst = SoftmaxCrossEntropy().apply(logits, np.array([2]))
    assert best.loss == pytest.approx(0.0, abs=1e-6)
    assert worst.loss == pytest.approx(2000.0, rel=1e-6)
    assert np.all(np.isfinite(worst.gradient)) and worst.gradient.dtype == np.float32
    np.testing.assert_allclose(worst.gradient, [[1.0, 0.0, -1.0]], atol=1e-6)


def test_inputs_are_not_modified(rng):
    logits = rng.standard_normal((3, 4))
    target = rng.uniform(size=(3, 4))
    labels = np.array([0, 3, 1])
    saved = logits.copy(), target.copy(), labels.copy()
    SoftmaxCrossEntropy().apply(logits, target)
    SoftmaxCrossEntropy().apply(logits, labels)
    MeanSquaredError().apply(logits, target)
    for before, after in zip(saved, (logits, target, labels)):
        np.testing.assert_array_equal(before, after)


def test_losses_are_frozen_values():
    assert SoftmaxCrossEntropy() == SoftmaxCrossEntropy(reduction="MEAN")
    assert MeanSquaredError(reduction="sum").reduction == "sum"
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        MeanSquaredError().reduction = "sum"  # type: ignore[misc]
    with pytest.raises(TypeError):
        MeanSquaredError("sum")  # type: ignore[misc]  # keyword-only


# Errors.
@pytest.mark.parametrize("cls", [MeanSquaredError, SoftmaxCrossEntropy])
@pytest.mark.parametrize("bad", ["none", "avg", 1, None])
def test_reduction_errors(cls, bad):
    with pytest.raises(bf.InvalidParameterError, match=f'{cls.__name__}.reduction must be "mean" or "sum"'):
        cls(reduction=bad)


def test_mse_errors():
    mse = MeanSquaredError()
    match = r"MeanSquaredError.apply\(prediction\) must be a float32 or float64 array; got 'int64'"
    with pytest.raises(bf.DTypeError, match=match):
        mse.apply(np.array([1, 2]), np.array([1, 2]))
    with pytest.raises(bf.ShapeError, match=r"MeanSquaredError.apply\(target\) must be of shape \(2,\)"):
        mse.apply(np.ones(2), np.ones(3))
    with pytest.raises(bf.DTypeError, match=r"apply\(target\) must be a float64 array"):
        mse.apply(np.ones(2), np.ones(2, np.float32))
    with pytest.raises(bf.ShapeError, match=r"apply\(prediction\) must be non-empty"):
        mse.apply(np.ones((0, 3)), np.ones((0, 3)))
    real = r"apply\(prediction\) must be an array of real numbers \(float64\); got "
    with pytest.raises(bf.InvalidParameterError, match=real + "'text'"):
        mse.apply("abc", np.ones(3))
    with pytest.raises(bf.InvalidParameterError, match=real + "None"):
        mse.apply(None, np.ones(3))
    with pytest.raises(bf.InvalidParameterError, match=real + "'complex numbers'"):
        mse.apply([1 + 2j, 3.0], np.ones(2))


def test_cross_entropy_errors():
    ce = SoftmaxCrossEntropy()
    logits = np.zeros((2, 3))
    match = r"apply\(target\) must be labels in \[0, 3\); got 'values from 0 to 3'"
    with pytest.raises(bf.InvalidParameterError, match=match):
        ce.apply(logits, np.array([0, 3]))
    with pytest.raises(bf.InvalidParameterError, match=r"labels in \[0, 3\)"):
        ce.apply(logits, np.array([-1, 0]))
    match = r"must be of shape \(2,\) \(integer labels\) or \(2, 3\) \(float64 probabilities\)"
    with pytest.raises(bf.ShapeError, match=match):
        ce.apply(logits, np.array([0, 1, 2]))
    with pytest.raises(bf.ShapeError, match=r"\(float64 probabilities\); got 'shape \(2, 4\) float64'"):
        ce.apply(logits, np.zeros((2, 4)))
    with pytest.raises(bf.DTypeError, match=r"must be float64 \(the prediction's dtype\) for probability"):
        ce.apply(logits, np.zeros((2, 3), np.float32))
    with pytest.raises(bf.DTypeError, match=r"convert integer one-hot arrays with .astype"):
        ce.apply(logits, np.eye(3, dtype=np.int64)[[0, 1]])
    with pytest.raises(bf.DTypeError, match=r"must be integer labels or float64 probabilities; got 'bool'"):
        ce.apply(logits, np.array([True, False]))
    with pytest.raises(bf.InvalidParameterError, match=r"\(target\) must be integer labels or probability"):
        ce.apply(logits, None)
    with pytest.raises(bf.ShapeError, match=r"\(prediction\) must be an array \(\.\.\., C\) with classes"):
        ce.apply(np.array(1.0), np.array(0))
    with pytest.raises(bf.ShapeError, match=r"apply\(prediction\) must be non-empty"):
        ce.apply(np.zeros((0, 3)), np.zeros(0, np.int64))
    with pytest.raises(bf.DTypeError, match=r"apply\(prediction\) must be a float32 or float64 array"):
        ce.apply(np.zeros((2, 3), np.float16), np.array([0, 1]))



@pytest.mark.parametrize("labels", [np.array([0.0, 2.0]), np.array([0, 2], np.float32), [0.0, 2.0]],
                         ids=["float64", "float32", "list of floats"])
def test_float_labels_are_refused_for_their_dtype_not_their_shape(labels):
    """Labels of the right shape but a float dtype: the message names the dtype."""
    match = (r"SoftmaxCrossEntropy.apply\(target\) must be of an integer dtype for labels of shape \(2,\) "
             r"\(convert class indices with .astype\(np.int64\); probability targets have the shape "
             r"\(2, 3\)\); got 'float(64|32)'\.")
    for dtype in (np.float64, np.float32):
        with pytest.raises(bf.DTypeError, match=match):
            SoftmaxCrossEntropy().apply(np.zeros((2, 3), dtype), labels)
    # A float target of neither shape is still a shape error.
    with pytest.raises(bf.ShapeError, match=r"must be of shape \(2,\) \(integer labels\)"):
        SoftmaxCrossEntropy().apply(np.zeros((2, 3)), np.zeros(3))

def test_plain_sequences_as_targets():
    logits = np.array([[0.0, 1.0], [2.0, 0.0]], dtype=np.float32)
    a = SoftmaxCrossEntropy().apply(logits, [1, 0])
    b = SoftmaxCrossEntropy().apply(logits, [[0.0, 1.0], [1.0, 0.0]])
    assert a.loss == pytest.approx(b.loss, rel=1e-6)
    assert b.gradient.dtype == np.float32


# Optional cross-check with PyTorch.
def test_matches_torch(rng):
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    logits = rng.standard_normal((5, 4))
    labels = rng.integers(0, 4, size=5)
    soft = rng.uniform(size=(5, 4))
    soft /= soft.sum(axis=1, keepdims=True)
    target = rng.standard_normal((5, 4))
    for reduction in REDUCTIONS:
        cases = [
            (SoftmaxCrossEntropy(reduction=reduction), labels,
             lambda z: functional.cross_entropy(z, torch.from_numpy(labels), reduction=reduction)),
            (SoftmaxCrossEntropy(reduction=reduction), soft,
             lambda z: functional.cross_entropy(z, torch.from_numpy(soft), reduction=reduction)),
            (MeanSquaredError(reduction=reduction), target,
             lambda z: functional.mse_loss(z, torch.from_numpy(target), reduction=reduction)),
        ]
        for loss, tgt, torch_loss in cases:
            z = torch.from_numpy(logits.copy()).requires_grad_(True)
            value = torch_loss(z)
            value.backward()
            result = loss.apply(logits, tgt)
            assert result.loss == pytest.approx(value.item(), rel=1e-12)
            np.testing.assert_allclose(result.gradient, z.grad.numpy(), rtol=1e-12, atol=1e-15)
