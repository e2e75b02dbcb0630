"""The fully connected layer (BNNS filter type 1): ``y = act(x @ Wᵀ + b)``, forward and backward.

:class:`FullyConnectedParameters` holds the weights ``W`` of shape ``(output_size,
input_size)`` (row = output unit, as BNNS and PyTorch store them), an optional bias and a fused
per-element activation. :class:`FullyConnectedLayer` applies them to a batch ``(N, in)`` or a
sequence of batches ``(T, N, in)``, and :meth:`FullyConnectedLayer.apply_backward` returns the
input, weights and bias gradients as a :class:`FullyConnectedGradients`.

Both products go through the layer's backend ``gemm`` (the contract's matrix product); the
bias is added in place.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

from .._named import read_only
from .._validation import (
    as_input,
    as_output,
    describe,
    layer_dtype,
    parameter_array,
    positive_int,
    separate_outputs,
)
from ..activation import Activation
from ..backends.contract import GemmRequest
from ..errors import InvalidParameterError, ShapeError, must_be
from ..filter import Filter, FilterParameters, guarded

__all__ = ["FullyConnectedParameters", "FullyConnectedGradients", "FullyConnectedLayer"]

_PARAMS = "FullyConnectedParameters"


def _input_size(value: object) -> int:
    return positive_int(f"{_PARAMS}.input_size", value)


def _output_size(value: object) -> int:
    return positive_int(f"{_PARAMS}.output_size", value)


def _dtype(value: object) -> np.dtype:
    return layer_dtype(value, f"{_PARAMS}.dtype")


def _check_activation(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, Activation):
        raise InvalidParameterError(must_be(f"{_PARAMS}.activation", "an Activation", value))
    value.require_elementwise(f"{_PARAMS}.activation")


_ARRAY_EQ = attrs.cmp_using(eq=np.array_equal)


@attrs.frozen(kw_only=True)
class FullyConnectedParameters:
    """The weights, bias and activation of a fully connected layer.

    Parameters
    ----------
    input_size, output_size : int
        Features in and out (both >= 1).
    weights : array_like, shape (output_size, input_size)
        Row ``o`` holds the weights of output unit ``o``. Converted to ``dtype``; an ndarray
        that already has ``dtype`` is kept as is (not copied), so that a layer created with
        ``FilterParameters(use_client_pointer=True)`` works on the caller's own array.
    bias : array_like, shape (output_size,), optional
        ``None`` for a layer without bias.
    activation : Activation
        A per-element activation fused after the product (default identity).
    dtype : float32 or float64
        The layer's dtype (default float32).

    Examples
    --------
    >>> import numpy as np
    >>> p = FullyConnectedParameters(input_size=2, output_size=1, weights=[[1.0, -1.0]], bias=[0.5])
    >>> p.weights.dtype, p.weights.shape, p.bias
    (dtype('float32'), (1, 2), array([0.5], dtype=float32))
    """

    input_size: int = attrs.field(converter=_input_size)
    output_size: int = attrs.field(converter=_output_size)
    weights: np.ndarray = attrs.field(eq=_ARRAY_EQ, hash=False)
    bias: np.ndarray | None = attrs.field(default=None, eq=_ARRAY_EQ, hash=False)
    activation: Activation = attrs.field(factory=Activation.identity, validator=_check_activation)
    dtype: np.dtype = attrs.field(default=np.float32, converter=_dtype)

    def __attrs_post_init__(self) -> None:
        # The array fields depend on dtype and the sizes, so they are converted here, once.
        weights = parameter_array(f"{_PARAMS}.weights", self.weights, self.dtype,
                                  (self.output_size, self.input_size), copy=False)
        object.__setattr__(self, "weights", weights)
        if self.bias is not None:
            bias = parameter_array(f"{_PARAMS}.bias", self.bias, self.dtype, (self.output_size,), copy=False)
            object.__setattr__(self, "bias", bias)

    @classmethod
    def random(
        cls,
        *,
        input_size: int,
        output_size: int,
        bias: bool = True,
        activation: Activation | None = None,
        seed: int = 0,
        dtype: object = np.float32,
    ) -> "FullyConnectedParameters":
        """Weights and bias drawn from U(−1/√input_size, 1/√input_size), as PyTorch's ``nn.Linear``.

        The draw is made in float64 by ``numpy.random.default_rng(seed)`` and then cast, so
        the float32 and float64 layers of one seed hold the same numbers up to rounding.

        >>> p = FullyConnectedParameters.random(input_size=4, output_size=3, seed=1)
        >>> p.weights.shape, bool(np.all(np.abs(p.weights) <= 0.5))
        ((3, 4), True)
        """
        input_size = positive_int(f"{_PARAMS}.input_size", input_size)
        output_size = positive_int(f"{_PARAMS}.output_size", output_size)
        if not isinstance(bias, (bool, np.bool_)):
            raise InvalidParameterError(must_be(f"{_PARAMS}.random(bias)", "True or False", bias))
        rng = np.random.default_rng(seed)
        bound = 1.0 / math.sqrt(input_size)
        weights = rng.uniform(-bound, bound, size=(output_size, input_size))
        bias_values = rng.uniform(-bound, bound, size=output_size) if bias else None
        return cls(
            input_size=input_size,
            output_size=output_size,
            weights=weights,
            bias=bias_values,
            activation=Activation.identity() if activation is None else activation,
            dtype=dtype,
        )

    def to_state(self) -> dict[str, Any]:
        """The parameters as plain data: sizes, ``activation`` as ``[function, alpha, beta]``,
        ``dtype`` by name, and the arrays ``weights`` and ``bias`` (themselves, not copies;
        ``bias`` is ``None`` when absent). :meth:`from_state` reads it back.

        >>> state = FullyConnectedParameters.random(input_size=4, output_size=3, bias=False).to_state()
        >>> state["weights"].shape, state["bias"], state["activation"], state["dtype"]
        ((3, 4), None, [0, 0.0, 0.0], 'float32')
        """
        return {
            "input_size": self.input_size,
            "output_size": self.output_size,
            "activation": self.activation.to_state(),
            "dtype": self.dtype.name,
            "weights": self.weights,
            "bias": self.bias,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "FullyConnectedParameters":
        """The parameters that :meth:`to_state` described; an absent ``bias`` is ``None``."""
        from .._state import StateReader

        reader = StateReader(_PARAMS, state)
        parameters = cls(
            **reader.required_entries("input_size", "output_size", "weights", "dtype"),
            bias=reader.optional("bias"),
            activation=Activation.from_state(reader.required("activation")),
        )
        reader.finish()
        return parameters


@attrs.frozen(kw_only=True, eq=False)
class FullyConnectedGradients:
    """What :meth:`FullyConnectedLayer.apply_backward` returns.

    Attributes
    ----------
    input : ndarray
        d loss / d x, the shape of ``x``.
    weights : ndarray, shape (output_size, input_size)
        d loss / d W, summed over every sample (and time step).
    bias : ndarray, shape (output_size,), or None
        d loss / d b, summed likewise; ``None`` when the layer has no bias.
    """

    input: np.ndarray
    weights: np.ndarray
    bias: np.ndarray | None

    def parameters(self) -> dict[str, np.ndarray]:
        """The weight gradients under the names of :meth:`FullyConnectedLayer.parameters`:
        ``weights``, and ``bias`` when the layer has one (the arrays themselves)."""
        named = {"weights": self.weights}
        if self.bias is not None:
            named["bias"] = self.bias
        return named


class FullyConnectedLayer(Filter):
    """A fully connected layer, ``y = act(x @ Wᵀ + b)``, with its backward pass.

    Parameters
    ----------
    parameters : FullyConnectedParameters
        Sizes, weights, bias, activation and dtype.
    filter_parameters : FilterParameters, optional
        Backend, thread count, and ``use_client_pointer``: with it the layer keeps the
        parameter object's weight and bias arrays (the caller's, when they already had the
        layer's dtype), so in-place updates to them are seen by the next call; without it
        (the default) the layer works on copies, which :meth:`parameters` hands out.

    Notes
    -----
    ``layer(x)`` is ``layer.apply(x)``. An unbatched ``x`` of shape ``(input_size,)`` gives an
    ``(output_size,)`` result (a batch axis is added and removed, as PyTorch does).

    Examples
    --------
    >>> import numpy as np
    >>> from bnnsfw import Activation
    >>> p = FullyConnectedParameters(input_size=2, output_size=2, weights=[[1.0, 2.0], [-1.0, 0.0]],
    ...                              bias=[0.0, 1.0], activation=Activation.relu(), dtype=np.float64)
    >>> with FullyConnectedLayer(p) as layer:
    ...     y = layer.apply(np.array([[1.0, 1.0], [3.0, -1.0]]))
    ...     grads = layer.apply_backward(np.array([[1.0, 1.0], [3.0, -1.0]]), np.ones((2, 2)), output=y)
    >>> y
    array([[3., 0.],
           [1., 0.]])
    >>> grads.weights
    array([[4., 0.],
           [0., 0.]])
    >>> grads.bias
    array([2., 0.])
    """

    _parameters_class = FullyConnectedParameters

    def __init__(self, parameters: FullyConnectedParameters,
                 filter_parameters: FilterParameters | None = None) -> None:
        if not isinstance(parameters, FullyConnectedParameters):
            raise InvalidParameterError(must_be(
                "FullyConnectedLayer(parameters)", "a FullyConnectedParameters", type(parameters).__name__))
        super().__init__(filter_parameters)
        self._parameters = parameters
        self._activation = parameters.activation
        self._dtype = parameters.dtype
        self._input_size = parameters.input_size
        self._output_size = parameters.output_size
        if self.filter_parameters.use_client_pointer:
            self._weights: np.ndarray | None = parameters.weights
            self._bias: np.ndarray | None = parameters.bias
            self._public = parameters
        else:
            self._weights = parameters.weights.copy()
            self._bias = None if parameters.bias is None else parameters.bias.copy()
            self._public = attrs.evolve(parameters, weights=read_only(self._weights),
                                        bias=read_only(self._bias))
        self._has_bias = parameters.bias is not None

    # Read-only description.
    @property
    def layer_parameters(self) -> FullyConnectedParameters:
        """The parameters the layer computes with, holding its live arrays.

        With ``use_client_pointer`` the parameter object it was created from; otherwise the
        same with read-only views of the layer's own copies (they show the current values;
        train through :meth:`parameters`).
        """
        self._check_open("layer_parameters")
        return self._public

    @property
    def input_size(self) -> int:
        return self._input_size

    @property
    def output_size(self) -> int:
        return self._output_size

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def activation(self) -> Activation:
        return self._activation

    @property
    @guarded
    def weights(self) -> np.ndarray:
        """The live weight array ``(output_size, input_size)`` the layer computes with.

        Updating it in place (``layer.weights -= lr * grad``, or an optimizer's ``step``)
        changes what the next :meth:`apply` computes.
        """
        self._check_open("weights")
        assert self._weights is not None
        return self._weights

    @property
    @guarded
    def bias(self) -> np.ndarray | None:
        """The live bias array ``(output_size,)``, or ``None`` for a layer without bias."""
        self._check_open("bias")
        return self._bias

    def _live_parameters(self) -> FullyConnectedParameters:
        return self._public

    def _named_parameters(self) -> dict[str, np.ndarray]:
        assert self._weights is not None  # released by close() only, and callers check the layer is open
        named = {"weights": self._weights}
        if self._bias is not None:
            named["bias"] = self._bias
        return named

    # Forward.
    @guarded
    def apply(self, x: object, output: np.ndarray | None = None, *, training: bool = False) -> np.ndarray:
        """Compute ``act(x @ Wᵀ + b)``.

        Parameters
        ----------
        x : ndarray, shape (N, input_size), (T, N, input_size) or (input_size,), the layer's dtype
            Not modified. An unbatched ``(input_size,)`` gives an ``(output_size,)`` result.
        output : ndarray, optional
            Buffer of shape ``x.shape[:-1] + (output_size,)`` to write into.
        training : bool
            Accepted as every layer's ``apply`` accepts it; the two phases compute the same.

        Returns
        -------
        ndarray, shape ``x.shape[:-1] + (output_size,)``
        """
        self._check_open("apply")
        if not isinstance(training, (bool, np.bool_)):
            raise InvalidParameterError(must_be("FullyConnectedLayer.apply(training)", "True or False",
                                                training))
        x = self._data("FullyConnectedLayer.apply(x)", x)
        shape = x.shape[:-1] + (self._output_size,)
        output = as_output("FullyConnectedLayer.apply(output)", output, self._dtype, shape)
        if x.ndim == 1:  # unbatched: a batch of one, through views of the caller's arrays
            result = self.apply(x[None], None if output is None else output[None])
            return output if output is not None else result[0]
        with self._threads():
            x2d = x.reshape(-1, self._input_size)
            target = self._direct(output, (x, self._weights, self._bias))
            y2d = self._affine(x2d, None if target is None else target.reshape(-1, self._output_size))
            if not self._activation.is_identity:
                self._activation.forward(y2d, out=y2d)
            if output is None:
                return y2d.reshape(shape)
            if target is None:
                np.copyto(output, y2d.reshape(shape))
            return output

    # Backward.
    @guarded
    def apply_backward(
        self,
        x: object,
        dy: object,
        output: object | None = None,
        *,
        input_gradient: np.ndarray | None = None,
        weights_gradient: np.ndarray | None = None,
        bias_gradient: np.ndarray | None = None,
        accumulate: bool = False,
    ) -> FullyConnectedGradients:
        """Gradients of the loss with respect to ``x``, the weights and the bias.

        Parameters
        ----------
        x : ndarray, shape (N, input_size), (T, N, input_size) or (input_size,)
            The forward input.
        dy : ndarray, shape ``x.shape[:-1] + (output_size,)``
            d loss / d output.
        output : ndarray, same shape as ``dy``, optional
            The forward output; required with a non-identity activation (as in BNNS). Its
            derivative is taken from ``output`` when that determines it (sigmoid, tanh, ReLU,
            …), otherwise from the pre-activation, recomputed from ``x``.
        input_gradient, weights_gradient, bias_gradient : ndarray, optional
            Buffers to write the gradients into (shapes of ``x``, the weights and the bias).
        accumulate : bool
            Add the gradients into the given buffers instead of overwriting them (BNNS
            backprop-accumulate). A gradient without a buffer is returned in a new array.

        Returns
        -------
        FullyConnectedGradients
            ``input``, ``weights`` (summed over samples and time) and ``bias`` (``None``
            without bias). Buffers passed in are the arrays returned. No input is modified.
        """
        self._check_open("apply_backward")
        where = "FullyConnectedLayer.apply_backward"
        x = self._data(f"{where}(x)", x)
        shape = x.shape[:-1] + (self._output_size,)
        dy = as_input(f"{where}(dy)", dy, self._dtype, shape)
        if x.ndim == 1:  # unbatched: a batch of one
            output = None if output is None else as_input(f"{where}(output)", output, self._dtype, shape)
            dx_buffer = as_output(f"{where}(input_gradient)", input_gradient, self._dtype, x.shape)
            grads = self.apply_backward(
                x[None], dy[None], None if output is None else output[None],
                input_gradient=None if dx_buffer is None else dx_buffer[None],
                weights_gradient=weights_gradient, bias_gradient=bias_gradient, accumulate=accumulate)
            return FullyConnectedGradients(input=dx_buffer if dx_buffer is not None else grads.input[0],
                                           weights=grads.weights, bias=grads.bias)
        if output is None:
            if not self._activation.is_identity:
                raise InvalidParameterError(must_be(
                    f"{where}(output)",
                    f"the forward output (the {self._activation.function.name} activation needs it)",
                    None,
                ))
        else:
            output = as_input(f"{where}(output)", output, self._dtype, shape)
        if not isinstance(accumulate, (bool, np.bool_)):
            raise InvalidParameterError(must_be(f"{where}(accumulate)", "True or False", accumulate))
        assert self._weights is not None
        input_gradient = as_output(f"{where}(input_gradient)", input_gradient, self._dtype, x.shape)
        weights_gradient = as_output(f"{where}(weights_gradient)", weights_gradient, self._dtype,
                                     self._weights.shape)
        if bias_gradient is not None and not self._has_bias:
            raise InvalidParameterError(must_be(f"{where}(bias_gradient)", "None for a layer without bias",
                                                describe(np.asarray(bias_gradient))))
        bias_gradient = as_output(f"{where}(bias_gradient)", bias_gradient, self._dtype, (self._output_size,))
        separate_outputs(where, {"input_gradient": input_gradient, "weights_gradient": weights_gradient,
                                 "bias_gradient": bias_gradient})

        with self._threads():
            x2d = x.reshape(-1, self._input_size)
            dy2d = dy.reshape(-1, self._output_size)
            if self._activation.is_identity:
                dz = dy2d
            elif self._activation.derivative_from_output:
                assert output is not None
                dz = self._activation.backward(dy2d, y=np.asarray(output).reshape(-1, self._output_size))
            else:
                dz = self._activation.backward(dy2d, x=self._affine(x2d, None))
            # Buffers that overlap an operand (dy passed as input_gradient, say) are written
            # only after every gradient is computed.
            operands = (x, dy, output, self._weights, self._bias, dz)
            deferred: list[tuple[np.ndarray, np.ndarray]] = []
            # dL/dx = dz @ W ;  dL/dW = dzᵀ @ x ;  dL/db = Σ dz
            dx = self._gemm_into(input_gradient, dz, self._weights, x.shape, operands, accumulate, deferred)
            dw = self._gemm_into(weights_gradient, dz, x2d, self._weights.shape, operands, accumulate,
                                 deferred, trans_a=True)
            db = None
            if self._has_bias:
                db = dz.sum(axis=0)
                if bias_gradient is not None:
                    deferred.append((bias_gradient, db))
                    db = bias_gradient
            for buffer, result in deferred:
                if accumulate:
                    buffer += result
                else:
                    np.copyto(buffer, result)
        return FullyConnectedGradients(input=dx, weights=dw, bias=db)

    def __call__(self, x: object, output: np.ndarray | None = None, *, training: bool = False) -> np.ndarray:
        """``layer(x)`` is :meth:`apply`: ``act(x @ Wᵀ + b)``."""
        return self.apply(x, output, training=training)

    # Helpers.
    def _data(self, where: str, value: object) -> np.ndarray:
        array = as_input(where, value, self._dtype)
        if array.ndim not in (1, 2, 3) or array.shape[-1] != self._input_size:
            n = self._input_size
            raise ShapeError(must_be(where, f"of shape (N, {n}), (T, N, {n}) or unbatched ({n},)",
                                     describe(array)))
        return array

    def _affine(self, x2d: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """``x2d @ Wᵀ + b`` into ``out`` (or a new array)."""
        assert self._weights is not None  # released by close() only, and callers check the layer is open
        y = self.backend.gemm(GemmRequest(a=x2d, b=self._weights, out=out, trans_b=True)).out
        if self._bias is not None:
            y += self._bias
        return y

    @staticmethod
    def _direct(buffer: np.ndarray | None, operands: tuple[object, ...]) -> np.ndarray | None:
        """``buffer`` when results can be written straight into it, else ``None``.

        That needs a C-contiguous buffer (so a 2-D reshape is a view) that overlaps none of
        the arrays being read.
        """
        if buffer is None or not buffer.flags.c_contiguous:
            return None
        for operand in operands:
            if isinstance(operand, np.ndarray) and np.may_share_memory(buffer, operand):
                return None
        return buffer

    def _gemm_into(
        self,
        buffer: np.ndarray | None,
        a: np.ndarray,
        b: np.ndarray,
        shape: tuple[int, ...],
        operands: tuple[object, ...],
        accumulate: bool,
        deferred: list[tuple[np.ndarray, np.ndarray]],
        *,
        trans_a: bool = False,
    ) -> np.ndarray:
        """``op(a) @ b`` written to (with ``accumulate``, added into) ``buffer``, or a new array.

        When ``buffer`` cannot take the product directly, the product and the buffer are
        appended to ``deferred`` for the caller to write once nothing reads the operands.
        """
        target = self._direct(buffer, operands)
        if target is not None:
            rows = target.reshape(-1, shape[-1])
            beta = 1.0 if accumulate else 0.0
            self.backend.gemm(GemmRequest(a=a, b=b, out=rows, trans_a=trans_a, beta=beta))
            return target
        result = self.backend.gemm(GemmRequest(a=a, b=b, trans_a=trans_a)).out.reshape(shape)
        if buffer is None:
            return result
        deferred.append((buffer, result))
        return buffer

    def _release(self) -> None:
        self._weights = None
        self._bias = None

    def _describe(self) -> str:
        return (f"input_size={self._input_size}, output_size={self._output_size}, "
                f"bias={self._has_bias}, activation={self._activation.function.name}, "
                f"dtype={self._dtype.name}")
