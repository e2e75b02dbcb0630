"""Tensors an ONNX model keeps in files beside it (ONNX "external data"), read from its folder only.

A large model may store a tensor's bytes in another file, naming it in the tensor's
``external_data`` entries (``location``, ``offset``, ``length``) relative to the model file.
:func:`load_external_data` reads every such tensor of a model loaded from a path, after
checking that its ``location`` is a file inside the model's folder (symbolic links resolved):
a model is untrusted input, and ``../`` or an absolute path would read any file the process
can. A model given as bytes or as an ``onnx.ModelProto`` has no folder: a tensor still
pointing at external data there is refused. Every refusal names the tensor and the location.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

from ..errors import InvalidParameterError, must_be
from ._nodes import _onnx

__all__ = ["load_external_data"]


def _graph_tensors(graph: Any) -> Iterator[Any]:
    """Every tensor a graph holds: initializers (sparse ones too) and node attributes, with
    the graphs nested in attributes (``If``, ``Loop``, ``Scan`` bodies)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: Any) -> Iterator[Any]:
    for attribute in node.attribute:
        if attribute.HasField("t"):
            yield attribute.t
        yield from attribute.tensors
        for sparse in [*([attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []),
                       *attribute.sparse_tensors]:
            yield from (sparse.values, sparse.indices)
        if attribute.HasField("g"):
            yield from _graph_tensors(attribute.g)
        for graph in attribute.graphs:
            yield from _graph_tensors(graph)


def _tensors(model: Any) -> Iterator[Any]:
    """Every tensor of ``model``: its graph's and its local functions' node attributes."""
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node)


def _location(tensor: Any) -> str:
    """The ``location`` entry of a tensor's external data (``""`` when it has none)."""
    for entry in tensor.external_data:
        if entry.key == "location":
            return str(entry.value)
    return ""


def _inside(folder: str, location: str) -> str | None:
    """The file ``location`` names, when it is a relative path to a file inside ``folder``
    (symbolic links resolved on both sides); else ``None``."""
    if not location or os.path.isabs(location) or os.path.splitdrive(location)[0]:
        return None
    try:
        root = os.path.realpath(folder)
        target = os.path.realpath(os.path.join(root, location))
        inside = target != root and os.path.commonpath([root, target]) == root
    except ValueError:  # a NUL byte, or paths on two drives
        return None
    return target if inside else None


def load_external_data(where: str, model: Any, folder: str | None) -> None:
    """Read the external data of every tensor of ``model`` (in place) from ``folder``.

    Parameters
    ----------
    where : str
        The call, for messages (``"bnnsfw.onnx.load('model.onnx')"``).
    model : onnx.ModelProto
        Loaded without its external data (``onnx.load(path, load_external_data=False)``).
    folder : str or None
        The folder of the model file; ``None`` for a model given as bytes or a ``ModelProto``,
        whose tensors must then hold their data.

    Raises
    ------
    InvalidParameterError
        For a tensor whose location is not a file inside ``folder`` (or for which there is no
        folder), or whose data cannot be read from there; the message names the tensor and
        the location.
    """
    onnx = _onnx()
    helper = onnx.external_data_helper
    for tensor in _tensors(model):
        if not helper.uses_external_data(tensor):
            continue
        what = f"{where}: ONNX tensor {tensor.name!r} external data"
        location = _location(tensor)
        if folder is None:
            rule = ("held in the model (a model given as bytes or an onnx.ModelProto has no folder to read "
                    "a file from: load the model from its path)")
            raise InvalidParameterError(must_be(what, rule, location))
        target = _inside(folder, location)
        if target is None:
            rule = f"a file inside the model's folder {os.path.realpath(folder)!r}"
            raise InvalidParameterError(must_be(what, rule, location))
        try:
            helper.load_external_data_for_tensor(tensor, folder)
        except (onnx.checker.ValidationError, ValueError, OSError) as error:
            rule = f"readable from {target!r} (offset and length within the file)"
            raise InvalidParameterError(must_be(what, rule, f"{type(error).__name__}: {error}")) from None
