"""Chains of two ops that are one op (or none).

* ``Reshape(Reshape(x, s1), s2) -> Reshape(x, s2)`` when ``s2`` is a constant
  that copies no dim (no ``0``, or ``allowzero=1``), or is computed and the
  inner result is 1-D (``x.view(-1).view(shape)``) with ``s2[0]`` proved
  positive or proved to be dim 0 of ``x`` (a ``0`` there then copies ``0``
  either way; a ``0`` further on fails the original).
* ``Unsqueeze(Unsqueeze(x, a1), a2) -> Unsqueeze(x, a)``, ``a`` the combined axes.
* ``Squeeze(Unsqueeze(x, a), a) -> x`` and ``Unsqueeze(Squeeze(x, a), a) -> x``.
* ``Transpose(Transpose(x, p1), p2) -> Transpose(x, p1[p2])`` (or ``x``).
* A Transpose that only moves axes of size 1 (the other axes keep their
  order: ``[4, 1, 4, 16]`` by ``(0, 2, 1, 3)``) keeps the elements in memory
  order, so it is a Reshape: ``Transpose(Reshape(x, s), p) -> Reshape(x, s[p])``
  and ``Reshape(Transpose(x, p), s) -> Reshape(x, s)`` when ``s`` is a constant
  that copies no dim (attention over one token or one head).
* ``Reshape(Transpose(Reshape(x, s1), p), s2) -> Transpose(x, q)`` (and
  ``Reshape(Transpose(x, p), s2) -> Transpose(x, q)``) when every shape in the
  chain is static, the Reshapes only add or remove dims of size 1 and the
  rank comes back (attention over batch 1: [1, 4, 32, 16] ->
  [4, 32, 16] -> perm (0, 2, 1) -> [1, 4, 16, 32] is perm (0, 1, 3, 2)); ``q``
  moves x's other axes as ``p`` moves them and puts x's size-1 axes where
  the result has its own.
* ``Slice(Slice(x, s1, e1, a1, p1), s2, e2, a2, p2) -> Slice(x, s1+s2, e1+e2, a1+a2, p1+p2)``
  when the two slice different axes (each axis is clamped against its own
  dim, which the other slice does not change), all constants; a shared inner
  Slice whose users are all Slices is taken in by each (Swin's patch merging:
  x[:, 0::2, 0::2] and friends, 6 Slices become 4).
* ``Cast(Cast(x, T1), T2) -> Cast(x, T2)`` when ``T1`` holds every value of
  x's type exactly (``x`` itself when ``T2`` is x's type).
* ``Concat(.., Concat(a, b, axis=k), .., axis=k) -> Concat(.., a, b, ..)``: the
  inner Concat's pieces join the outer's in place (it must be used only by Concats on its axis).
* ``Reshape(f(Reshape(x, s)), t) -> f(x)`` for elementwise ops ``f`` (dynamo's
  MLPs view a Gemm's matrix as [batch, seq, n] for the activation, then back)
  when every other input of ``f`` is a single element (so it broadcasts the
  same at either shape), the values between the Reshapes are used by ``f``
  alone, and ``t`` is proved to be x's shape
  (:func:`~passes.simplify.shape_values.reshape_restores`).
* ``Reshape(Softmax(Flatten(x, a), axis=-1), Shape(x)) -> Softmax(x, axis=a)``
  (LogSoftmax, Hardmax too), what the upgrade writes for the opset-12 ops'
  2-D coercion: from opset 13 when every dim of x after ``a`` is 1 (the
  pooled [n, c, 1, 1] of a CNN's head), before 13 always.
* ``Concat`` of the four ``x[..., a::2, b::2]`` (YOLOv5's Focus) -> ``SpaceToDepth(x, 2)`` and a
  channel ``Gather`` (:mod:`.space_to_depth`), as onnxruntime's basic level does.

The inner node must have no other user (else the chain would be computed
twice), except an ``Unsqueeze`` or ``Slice`` whose users are all of its own
op, or a ``Concat`` whose users are all Concats on its axis: each takes it in; it is removed when
it becomes dead.
"""

# Registers the rules; this order is the order in which they are tried on a node.
from passes.simplify.chains import pairs  # noqa: F401  isort: skip
from passes.simplify.chains import layout  # noqa: F401  isort: skip
from passes.simplify.chains import regions  # noqa: F401  isort: skip
from passes.simplify.chains import space_to_depth  # noqa: F401  isort: skip

__all__: list[str] = []
