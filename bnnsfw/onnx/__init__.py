"""Run ONNX graphs on bnnsfw layers, and write bnnsfw layers as ONNX graphs.

:func:`load` takes a path, bytes or an ``onnx.ModelProto`` and returns a :class:`Session`
whose :meth:`Session.run` has ONNX Runtime's signature (``run(output_names, input_feed)``,
a list of arrays back). Its ``LSTM``, ``BatchNormalization``, ``InstanceNormalization``,
``LayerNormalization``, ``GroupNormalization`` and ``RMSNormalization`` nodes run as bnnsfw
layers — the session builds one per node whose weights are constants, and
:meth:`Session.layer` hands it out to run backward and fine-tune — and the glue that
exporters put around them (``MatMul``, ``Gemm``, element-wise arithmetic and activations,
``Transpose``, ``Reshape``, ``Squeeze``/``Unsqueeze``, ``Slice``, ``Gather``, ``Concat``,
``Shape``, reductions, ``Softmax`` …) runs in NumPy. An operator, attribute or attribute
value outside that set is refused at load with :class:`~bnnsfw.UnsupportedError` naming the
node, the operator and the attribute; nothing is approximated silently.

:func:`export` writes bnnsfw LSTM, normalization and fully connected layers, applied one
after the other, as an ONNX graph that passes ``onnx.checker.check_model(full_check=True)``.

Only the ``onnx`` package is needed (``pip install 'bnnsfw[onnx]'``); ONNX Runtime is not.

The package's modules: ``_session.py`` loads a model and runs its graph, with the NumPy
operators of ``_operators.py`` and the LSTM and normalization nodes of ``_layer_nodes.py``,
reading tensors kept in files beside the model with ``_external_data.py``;
``_export.py`` writes layers as a graph; ``_nodes.py`` holds what they share (a node as
bnnsfw reads it, and the import of the optional ``onnx`` package). Every public name is
importable from here.
"""

from __future__ import annotations

from . import _export
from ._export import export
from ._layer_nodes import _LAYER_OPS
from ._operators import _OPS
from ._session import NodeArg, Session, load

__all__ = ["load", "Session", "NodeArg", "export", "SUPPORTED_OPS", "DEFAULT_OPSET"]

#: The opset :func:`export` writes unless told otherwise.
DEFAULT_OPSET = _export.DEFAULT_OPSET

#: Every operator a session runs (see the module docstring).
SUPPORTED_OPS: frozenset[str] = frozenset(_OPS) | frozenset(_LAYER_OPS)
