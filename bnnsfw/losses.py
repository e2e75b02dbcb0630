"""Loss functions with their gradients: mean squared error and softmax cross-entropy.

These correspond to the BNNS loss filters ``BNNSLossFunctionMeanSquareError`` and
``BNNSLossFunctionSoftmaxCrossEntropy``. Each loss is a frozen value whose
``apply(prediction, target)`` returns a :class:`LossResult`: the loss as a Python float and
its gradient with respect to the prediction (same shape and dtype as the prediction), ready
to feed a layer's ``apply_backward``.

Reductions
----------
``reduction`` is ``"sum"`` or ``"mean"``.

- ``"sum"`` adds the loss of every sample. It corresponds to ``BNNSLossReductionSum``
  ("sums the loss of all samples in the batch").
- ``"mean"`` for **softmax cross-entropy** divides that sum by the number of samples, every
  position but the class axis (``N`` for logits ``(N, C)``, ``T·N`` for ``(T, N, C)``). This
  is what Apple documents for ``BNNSLossReductionMean`` ("sums the loss of all samples in the
  batch and divides by the number of samples") and what PyTorch's ``CrossEntropyLoss`` does.
- ``"mean"`` for **mean squared error** divides by the number of *elements*, as PyTorch's
  ``MSELoss`` does, so the value is a mean squared error whatever the shape. Apple's
  documentation does not say how BNNS forms the per-sample loss of a multi-feature MSE; where
  BNNS sums the features of a sample before dividing by the number of samples, its value is
  ``F`` times ours for ``F`` features per sample. Use ``"sum"`` and divide as you need if you
  must match another convention.

BNNS's other reductions (none, weighted mean, non-zero-weight mean), per-sample weights and
label smoothing are not offered; smoothed labels can be passed as probability targets.

All loss values are accumulated in float64 and returned as Python floats; gradients are
computed in the prediction's dtype.
"""

from __future__ import annotations

import attrs
import numpy as np

from ._validation import SUPPORTED_DTYPES, as_input, describe, dtype_text, real_array
from .errors import DTypeError, InvalidParameterError, ShapeError, must_be

__all__ = ["LossResult", "MeanSquaredError", "SoftmaxCrossEntropy"]

_REDUCTIONS = ("mean", "sum")


@attrs.frozen(kw_only=True, eq=False)
class LossResult:
    """A loss value and its gradient.

    Attributes
    ----------
    loss : float
        The reduced loss.
    gradient : ndarray
        d loss / d prediction, same shape and dtype as the prediction.
    """

    loss: float
    gradient: np.ndarray


def _reduction(owner: str, value: object) -> str:
    if isinstance(value, str) and value.strip().lower() in _REDUCTIONS:
        return value.strip().lower()
    raise InvalidParameterError(must_be(f"{owner}.reduction", '"mean" or "sum"', value))


def _mse_reduction(value: object) -> str:
    return _reduction("MeanSquaredError", value)


def _cross_entropy_reduction(value: object) -> str:
    return _reduction("SoftmaxCrossEntropy", value)


def _prediction(where: str, value: object) -> np.ndarray:
    """A non-empty float32 or float64 array (array-likes of real numbers become float64)."""
    if isinstance(value, np.ndarray):
        array = value
    else:
        array = real_array(where, value, np.dtype(np.float64))
    if array.dtype not in SUPPORTED_DTYPES:
        raise DTypeError(must_be(where, "a float32 or float64 array", dtype_text(array.dtype)))
    if array.size == 0:
        raise ShapeError(must_be(where, "non-empty", describe(array)))
    return array


@attrs.frozen(kw_only=True)
class MeanSquaredError:
    """Mean squared error, ``Σ (prediction − target)²`` reduced by ``reduction``.

    ``"mean"`` divides by the number of elements (as PyTorch's ``MSELoss``); ``"sum"`` does
    not divide. The gradient is ``2·(prediction − target)``, divided likewise.

    Examples
    --------
    >>> import numpy as np
    >>> result = MeanSquaredError().apply(np.array([1.0, 2.0]), np.array([0.0, 4.0]))
    >>> result.loss, result.gradient
    (2.5, array([ 1., -2.]))
    >>> MeanSquaredError(reduction="sum").apply(np.array([1.0, 2.0]), np.array([0.0, 4.0])).loss
    5.0
    """

    reduction: str = attrs.field(default="mean", converter=_mse_reduction)

    def apply(self, prediction: object, target: object) -> LossResult:
        """The loss and its gradient.

        Parameters
        ----------
        prediction : ndarray, any non-empty shape, float32 or float64
        target : ndarray, the shape and dtype of ``prediction``

        Neither array is modified.
        """
        p = _prediction("MeanSquaredError.apply(prediction)", prediction)
        t = as_input("MeanSquaredError.apply(target)", target, p.dtype, p.shape)
        diff = p - t
        wide = diff.astype(np.float64, copy=False)
        total = float(np.sum(wide * wide))
        scale = 2.0
        if self.reduction == "mean":
            total /= p.size
            scale /= p.size
        diff *= scale
        return LossResult(loss=total, gradient=diff)


@attrs.frozen(kw_only=True)
class SoftmaxCrossEntropy:
    """Softmax followed by cross-entropy, from logits, with integer or probability targets.

    For logits ``z`` of shape ``(..., C)`` and a target distribution ``t`` per sample, the loss
    of a sample is ``−Σ_c t_c · log softmax(z)_c``; an integer label ``k`` stands for the
    one-hot distribution with ``t_k = 1``. ``"mean"`` divides the sum over samples by the
    number of samples (every position but the class axis); ``"sum"`` does not divide.

    The log-softmax is computed as ``z − max(z) − log Σ exp(z − max(z))``, so large logits do
    not overflow. The gradient is ``softmax(z)·Σ_c t_c − t``, which is ``softmax(z) − t`` for
    labels and for targets summing to 1, scaled by the reduction.

    Examples
    --------
    >>> import numpy as np
    >>> logits = np.array([[0.0, 0.0], [0.0, 0.0]])
    >>> result = SoftmaxCrossEntropy().apply(logits, np.array([0, 1]))
    >>> round(result.loss, 6), result.gradient
    (0.693147, array([[-0.25,  0.25],
           [ 0.25, -0.25]]))
    """

    reduction: str = attrs.field(default="mean", converter=_cross_entropy_reduction)

    def apply(self, prediction: object, target: object) -> LossResult:
        """The loss and its gradient with respect to the logits.

        Parameters
        ----------
        prediction : ndarray, shape (..., C), float32 or float64
            Logits, classes on the last axis.
        target : ndarray
            Either integer class labels of shape ``prediction.shape[:-1]``, each in
            ``[0, C)``, or probability (e.g. one-hot) targets of the prediction's shape and
            dtype.

        Neither array is modified.
        """
        where = "SoftmaxCrossEntropy.apply"
        z = _prediction(f"{where}(prediction)", prediction)
        if z.ndim < 1:
            raise ShapeError(must_be(f"{where}(prediction)", "an array (..., C) with classes last",
                                     describe(z)))
        classes = z.shape[-1]
        labels, probabilities = self._target(f"{where}(target)", target, z)

        rows = z.reshape(-1, classes)
        samples = rows.shape[0]
        shifted = rows - rows.max(axis=1, keepdims=True)
        log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        gradient = np.exp(log_softmax)
        if labels is not None:
            index = np.arange(samples)
            picked = labels.reshape(-1)
            per_sample = -log_softmax[index, picked]
            gradient[index, picked] -= 1
        else:
            assert probabilities is not None
            t = probabilities.reshape(-1, classes)
            per_sample = -(t * log_softmax).sum(axis=1)
            gradient *= t.sum(axis=1, keepdims=True)
            gradient -= t
        total = float(np.sum(per_sample, dtype=np.float64))
        if self.reduction == "mean":
            total /= samples
            gradient *= 1.0 / samples
        return LossResult(loss=total, gradient=gradient.reshape(z.shape))

    @staticmethod
    def _target(where: str, value: object, z: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``(labels, None)`` or ``(None, probabilities)``, validated against the logits ``z``."""
        if value is None:
            raise InvalidParameterError(must_be(where, "integer labels or probability targets", None))
        classes = z.shape[-1]
        label_shape, full_shape = z.shape[:-1], z.shape
        expected = f"of shape {label_shape} (integer labels) or {full_shape} ({z.dtype.name} probabilities)"
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        kind = array.dtype.kind
        if kind in "iu":
            if array.shape == label_shape:
                if array.size and (array.min() < 0 or array.max() >= classes):
                    raise InvalidParameterError(must_be(
                        where, f"labels in [0, {classes})",
                        f"values from {array.min()} to {array.max()}"))
                return array, None
            if array.shape == full_shape:
                raise DTypeError(must_be(
                    where, f"{z.dtype.name} when it holds one-hot or probability targets "
                    "(convert integer one-hot arrays with .astype)", array.dtype.name))
            raise ShapeError(must_be(where, expected, describe(array)))
        if kind == "f":
            if array.shape == label_shape:  # labels by their shape: it is the dtype that is wrong
                raise DTypeError(must_be(
                    where, f"of an integer dtype for labels of shape {label_shape} (convert class indices "
                    f"with .astype(np.int64); probability targets have the shape {full_shape})",
                    array.dtype.name))
            if not isinstance(value, np.ndarray):
                array = array.astype(z.dtype)
            if array.shape != full_shape:
                raise ShapeError(must_be(where, expected, describe(array)))
            if array.dtype != z.dtype:
                rule = f"{z.dtype.name} (the prediction's dtype) for probability targets"
                raise DTypeError(must_be(where, rule, array.dtype.name))
            return None, array
        raise DTypeError(must_be(where, f"integer labels or {z.dtype.name} probabilities", array.dtype.name))
