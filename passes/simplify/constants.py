"""``Constant`` nodes become main-graph initializers; equal initializers become one.

A ``Constant`` node and an initializer hold the same tensor; the other tools
store constants as initializers, and users compare node counts. Only in
models of IR >= 4 (below, every initializer must be a graph input).

* The main graph's Constant nodes become initializers under their names.
* Those of subgraphs (If branches, Loop and Scan bodies, at any depth) become
  main-graph initializers too: a subgraph sees the values of every enclosing
  graph. Two equal ones (same dtype, shape and bytes: ``-0.0`` is not
  ``0.0``) become one initializer, and one equal to an initializer already in
  the main graph (not a graph input: a caller may override those) uses it;
  only constants of up to 65,536 elements are compared, so a large one (an
  external weight in a branch) is moved, never read. A
  lifted constant keeps its name when no other value of the model has it,
  else gets a fresh one (:class:`passes.ir.names.Names`): a subgraph may
  shadow an outer name, and the initializer must not capture, or be captured
  by, another value of that name. Never subgraph initializers (see
  :mod:`passes.fold` for why). A function's Constant nodes stay: a function
  body does not see the main graph.

A Constant that produces a graph output (a subgraph output must be computed
in the subgraph: the ONNX checker and onnxruntime reject an outer value
there), that nothing uses, or whose value is an attribute reference or a
sparse tensor, stays a node.

Equal initializers of one graph (same dtype, shape and bytes: ``-0.0`` is not
``0.0``, NaN payloads count) become the first one (:func:`share_equal_initializers`):
its users read it, and CSE then merges the nodes that became the same (four equal
bool masks each feeding an ``And`` with the same other input: one mask, one And).
Never an initializer that is a graph input (overridable: a caller may feed it)
or a graph output, nor across graphs (a subgraph's initializer stays its own).
Only tensors of the same dtype and shape are compared: first by a key of a few
sampled bytes (:func:`_sample_key`: the first and last 256 bytes and 64 strided
ones, so random weights of one shape part there without being hashed whole), then
byte for byte with each earlier tensor of the same key. None over
:data:`SHARE_BYTES`, and never a weight left in its data file: the save copies those
with the kernel, unread (``tests/test_external_copy.py``), and this would read them.

onnx_ir's ``DeduplicateInitializersPass`` is not used: it compares only tensors of
up to 1,024 elements (a 64x64 mask stays twice) and holds every key's bytes.
onnx_ir's ``LiftConstantsToInitializersPass`` is not used: it also lifts the
Constants of subgraphs into subgraph initializers, and by default skips
small tensors and the ``value_*`` forms.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable

import numpy as np

import onnx_ir as ir

from passes.ir.names import Names
from passes.ir.tensors import constant_tensor, is_file_backed, read_tensor
from passes.ir.walk import graphs, iter_scopes

__all__ = ["SHARE_BYTES", "lift_main_graph_constants", "lift_subgraph_constants", "share_equal_initializers"]

#: Initializers over this many bytes are not compared (see :func:`share_equal_initializers`).
SHARE_BYTES = 64 << 20

#: Main-graph initializers up to this many elements are compared with lifted constants.
_SHARE_LIMIT = 1 << 16


def lift_main_graph_constants(model: ir.Model, applied: collections.Counter[str]) -> bool:
    """Turns the main graph's Constant nodes into initializers; whether any was."""
    if model.ir_version < 4:
        return False
    graph = model.graph
    lifted = []
    for node in graph:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or node.outputs[0].is_graph_output():
            continue
        if "sparse_value" in node.attributes:
            continue
        tensor = constant_tensor(node, dense_limit=0)
        if tensor is None:
            continue
        lifted.append((node, tensor))
    for node, tensor in lifted:
        old = node.outputs[0]
        value = ir.Value(name=old.name, type=ir.TensorType(tensor.dtype), shape=ir.Shape(tensor.shape),
                         doc_string=old.doc_string, metadata_props=dict(old.metadata_props) or None)  # fmt: skip
        value.const_value = tensor
        old.replace_all_uses_with(value)
        old.name = None
        graph.remove(node, safe=True)
        graph.register_initializer(value)
        applied["constants/constant_to_initializer"] += 1
    return bool(lifted)


def _key(tensor: ir.TensorProtocol) -> Hashable | None:
    """An exact key of a tensor's contents (dtype, shape, bytes); None for strings."""
    if tensor.dtype == ir.DataType.STRING:
        return None
    return (tensor.dtype, tuple(tensor.shape), tensor.tobytes())


class _MainInitializers:
    """The main graph's initializers by contents, read only for the dtypes and shapes asked for."""

    def __init__(self, graph: ir.Graph) -> None:
        self._graph = graph
        self._by_contents: dict[Hashable, ir.Value] = {}
        self._unread: dict[tuple[ir.DataType, tuple[int, ...]], list[ir.Value]] | None = None

    def find(self, key: Hashable) -> ir.Value | None:
        dtype, shape, _ = key  # type: ignore[misc]
        if self._unread is None:
            self._unread = collections.defaultdict(list)
            for value in self._graph.initializers.values():
                tensor = value.const_value
                if not value.is_graph_input() and tensor is not None and tensor.size <= _SHARE_LIMIT:
                    self._unread[(tensor.dtype, tuple(tensor.shape))].append(value)
        for value in self._unread.pop((dtype, shape), ()):
            try:
                contents = _key(value.const_value)  # type: ignore[arg-type]
            except (OSError, ValueError):  # an unreadable external tensor: not shared
                continue
            if contents is not None:
                self._by_contents.setdefault(contents, value)
        return self._by_contents.get(key)

    def add(self, key: Hashable, value: ir.Value) -> None:
        self._by_contents.setdefault(key, value)


def lift_subgraph_constants(model: ir.Model, applied: collections.Counter[str]) -> bool:
    """Turns the Constant nodes of subgraphs (not of functions) into main-graph initializers.

    Counted as ``constants/subgraph_constant_to_initializer`` (a new initializer)
    and ``constants/subgraph_constant_shared`` (an equal initializer used instead).

    Returns:
        Whether any Constant node was lifted.
    """
    if model.ir_version < 4:
        return False
    main = model.graph
    names: Names | None = None
    existing = _MainInitializers(main)
    lifted = False
    for scope in iter_scopes(model, functions=False):
        if scope.owner is None:
            continue
        body = scope.body
        for node in list(body):
            if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or "sparse_value" in node.attributes:
                continue
            old = node.outputs[0]
            if old.is_graph_output() or not old.uses():
                continue
            tensor = constant_tensor(node, dense_limit=0)
            if tensor is None:
                continue
            names = names or Names(model)
            key = _key(tensor) if tensor.size <= _SHARE_LIMIT else None  # a weight's bytes are never read
            value = existing.find(key) if key is not None else None
            if value is not None:
                old.replace_all_uses_with(value)
                names.release_value(old.name)
                applied["constants/subgraph_constant_shared"] += 1
            else:
                value = ir.Value(name=old.name, type=ir.TensorType(tensor.dtype), shape=ir.Shape(tensor.shape),
                                 doc_string=old.doc_string,
                                 metadata_props=dict(old.metadata_props) or None)  # fmt: skip
                value.const_value = tensor
                old.replace_all_uses_with(value)
                old.name = None
                if value.name:
                    names.dedupe_value(value)  # the old value's name leaves with it: a clash is another value's
                else:
                    value.name = names.value("constant")
                main.register_initializer(value)
                if key is not None:
                    existing.add(key, value)
                applied["constants/subgraph_constant_to_initializer"] += 1
            body.remove(node, safe=True)
            lifted = True
    return lifted


def _contents(value: ir.Value) -> np.ndarray | None:
    tensor = value.const_value
    if tensor is None or tensor.dtype == ir.DataType.STRING or tensor.dtype.bitwidth < 8:
        return None
    try:
        return np.ascontiguousarray(read_tensor(tensor, f"initializer {value.name!r}"))
    except Exception:  # noqa: BLE001  an unreadable tensor is left alone (the check reports it)
        return None


def share_equal_initializers(model: ir.Model, applied: collections.Counter[str],
                             digests: dict[int, tuple[ir.TensorProtocol, bytes | None]] | None = None) -> bool:  # fmt: skip
    """Replaces each initializer equal to an earlier one of its graph by that one; whether any was.

    Counted as ``constants/shared_initializer`` (one per initializer removed). ``digests`` keeps
    each tensor's sample key across calls (by the tensor object, held there), so that the rounds
    of a pass sample a weight once.
    """
    digests = {} if digests is None else digests
    changed = False
    for graph in graphs(model):  # ir.Model.graphs()'s order, one read of each node's attributes
        groups: dict[tuple[ir.DataType, tuple[int, ...]], list[ir.Value]] = collections.defaultdict(list)
        for value in graph.initializers.values():
            tensor = value.const_value
            if value.is_graph_input() or value.is_graph_output() or tensor is None:
                continue
            if int(tensor.nbytes) <= SHARE_BYTES and not is_file_backed(tensor):
                groups[(tensor.dtype, tuple(tensor.shape))].append(value)
        for members in groups.values():
            if len(members) < 2:
                continue
            kept: dict[bytes, list[ir.Value]] = collections.defaultdict(list)
            for value in members:
                key = _digest(value, digests)
                if key is None:
                    continue
                b = _contents(value) if kept[key] else None
                first = next((k for k in kept[key] if _same_bytes(_contents(k), b)), None)
                if first is None:  # the first of its key, or equal to none of them (the key is a sample)
                    kept[key].append(value)
                    continue
                value.replace_all_uses_with(first)
                assert value.name is not None
                graph.initializers.pop(value.name)
                applied["constants/shared_initializer"] += 1
                changed = True
    return changed


def _digest(value: ir.Value, digests: dict[int, tuple[ir.TensorProtocol, bytes | None]]) -> bytes | None:
    tensor = value.const_value
    assert tensor is not None
    found = digests.get(id(tensor))
    if found is not None and found[0] is tensor:
        return found[1]
    array = _contents(value)
    digest = None if array is None else _sample_key(array)
    digests[id(tensor)] = (tensor, digest)
    return digest


def _sample_key(array: np.ndarray) -> bytes:
    """A few of the array's bytes: its first and last 256 and 64 strided ones (equal arrays, equal keys)."""
    flat = array.reshape(-1).view(np.uint8)
    step = max(1, flat.size // 64)
    return b"".join((flat[:256].tobytes(), flat[-256:].tobytes(), flat[::step][:64].tobytes()))


def _same_bytes(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return a is not None and b is not None and np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
