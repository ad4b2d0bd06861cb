"""Fusions: BatchNormalization and per-channel Mul/Add into a preceding Conv/ConvTranspose/Gemm, MatMul+Add
into Gemm, a zero Pad into the Conv after it; and the primitive forms of LayerNorm, GELU, RMSNorm and the
rotate-half rotary embedding into the standard ``LayerNormalization`` (opset 17), ``Gelu`` (20),
``RMSNormalization`` (23) and ``RotaryEmbedding`` (23), and scaled dot-product attention into
``Attention`` (23): see :mod:`~passes.simplify.fusions.normalization`,
:mod:`~passes.simplify.fusions.gelu`, :mod:`~passes.simplify.fusions.rotary` and
:mod:`~passes.simplify.fusions.attention`. Those are
written only where onnxruntime's CPU provider has the kernel for the opset and type (probed with a
one-node model once a pattern is found, cached for the process); a pattern that only a higher opset
would take is counted in ``stats["fusable_at_higher_opset"]`` (``{"Gelu@20": n}``).

* ``BatchNormalization(Conv(x, W, b))`` -> ``Conv(x, W', b')`` with, per output
  channel, ``s = scale / sqrt(var + epsilon)``, ``W' = W * s`` and
  ``b' = (b - mean) * s + B`` (``b`` is 0 when absent).
* The same into ``ConvTranspose`` (``group=1``: output channels are axis 1 of
  its weight) and into ``Gemm`` (a BatchNormalization of its [N, M] output
  scales the columns of ``B``; the bias becomes ``(beta * C - mean) * s + B``
  and ``beta`` 1; ``alpha`` stays).
* ``Mul(Conv(x, W, b), c)`` -> ``Conv(x, W * c, b * c)`` and
  ``Add(Conv(x, W, b), c)`` -> ``Conv(x, W, b + c)`` for a constant ``c`` that is
  a scalar or per output channel (shape [M, 1, ...] or [1, M, 1, ...], no
  broadcast beyond the Conv's output).
* ``Add(MatMul(A, B), C)`` or ``Add(C, MatMul(A, B))`` -> ``Gemm(A, B, C)``
  (alpha, beta 1, no transposes), as onnxruntime's basic level does: the
  scikit-learn MLPs' layers. No weight changes; see below for when it applies.

* ``Conv(Pad(x, pads), W, b)`` -> ``Conv(x, W, b)`` with the Pad's spatial
  pads added to the Conv's (onnxsim's ``fuse_pad_into_conv``; TorchScript
  exports of TensorFlow-style "same" padding write it). No weight changes; see
  below for when it applies.

Every fusion rule returns a :class:`~passes.simplify.fusions.accept.Fusion`, and the driver writes it
only after :func:`~passes.simplify.fusions.accept.vet`: the fused op's output has the pattern's shape, and
the pattern's result reaches no op that would amplify its change of rounding (a quantizer, a Cast to an
integer, a comparison, an ArgMax...: :mod:`passes.ir.amplification`).

These are the only simplifications that change float results: the new
weights are computed in float64 and rounded once to the weights' type, and the
fused op rounds differently from the two it replaces (an ulp or two of the
output in float32, more on ill-conditioned LayerNorm rows: docs/exactness.md;
a Gemm may add C in its own order, without rounding A @ B first; integers
would be exact, but are not fused, see below).
``SimplifyPass(fuse=False)`` (``--no-fuse``) turns them off; the pass counts
them as ``stats["fused"]``.

A fusion into Conv/ConvTranspose/Gemm applies only where it keeps the graph's
contract and its size:

* the weight, bias and every BatchNormalization parameter are constants
  (never an initializer that is a graph input: a caller may override it);
* the weight is used by this op alone (else it would be duplicated); a shared
  bias or parameter, one value per channel, is read and left to its other users;
* the op's output is used by the fused node alone and is not a graph output;
* the BatchNormalization is in inference mode, with no other output used;
* the weights are float16, float or double (bfloat16 is refused: rounded to
  its 8 significant bits, a fused weight moves the results by up to 0.4 %).
* the fusion keeps NaN, infinities and the sign of zero (:mod:`.exact`): no
  zero, NaN, infinite or subnormal scale, no negative scale without a nonzero
  shift after it (``Mul(Conv, -2)`` turns the Conv's +0 into -0), and every
  new weight, bias and intermediate of the original's arithmetic finite in the
  weights' type (a BatchNormalization with gamma 3e38 and var + epsilon 1e-45
  has an infinite scale: NaN where the Conv gives 0). Each refusal says why.

The new weights are new constants (initializers in the main graph, Constant
nodes in subgraphs and functions); the old ones become dead and are removed.
When the fused node's output is a graph output, the op's output takes its
place there with its name, type and shape. Ranks and channel counts are read
from the constants, not from shape inference, so these rules work in function
bodies (which have no types) too.

MatMul+Add becomes a Gemm only where that is a Gemm's meaning exactly, never
with Reshapes around it (onnxsim's N-D MatMul+Add):

* opset 11 or later (Gemm-11: C optional, unidirectionally broadcast);
* A and B have rank 2, proved (:meth:`Context.dims`: inference, or a graph
  input's declared shape), so in function bodies, which have no inferred
  shapes, it does not apply;
* the MatMul is in the Add's graph, and its output is used by the Add alone
  and is not a graph output;
* C (any value, not only a constant) has a static shape of rank <= 2 whose
  dims, right-aligned, are each 1 or the MatMul's [M, N] dim: the Add's
  output is the MatMul's shape (a C of [2, N] on a [1, N] product is refused);
* A, B and C have one element type that Gemm takes at the opset (read from
  its schema) and that is a float: onnxruntime has no integer Gemm kernel (it
  has integer MatMul and Add), so an integer Gemm would not run there.
  bfloat16 is taken (from Gemm-13): no weight is rounded, the Gemm at most
  skips the rounding of A @ B to bfloat16.

The Gemm is inserted before the Add and takes its output's name (the Add's
output keeps being a graph output under its name, type and shape); the
MatMul and Add become dead and are removed.

A Pad goes into the Conv after it where the Conv's own padding means the same:

* the Pad's mode is ``constant`` and its value +0 (absent, or a constant that
  is 0 and not -0: a window of -0 padding alone would sum to -0, where the
  Conv's implicit zeros give +0);
* its pads (and, from opset 18, its ``axes``) are constants, none negative (a
  negative pad crops), and none on the batch or channel axis;
* its output is used by the Conv alone (as X) and is not a graph output, in
  the same graph;
* the Conv's ``auto_pad`` is ``NOTSET`` (explicit pads), and the rank of its
  weight (a constant or a proved shape) is the Pad's rank.

In onnxruntime the fused Conv gives the same bits: its implicit padding is
the same zeros in the same sums. The rule is a fusion (``--no-fuse`` turns it
off) all the same, as a runtime may pick another Conv kernel for the smaller
input.
"""

# Registers the rules; this order is the order in which they are tried on a node.
from passes.simplify.fusions import weights  # noqa: F401  isort: skip
from passes.simplify.fusions import gemm  # noqa: F401  isort: skip
from passes.simplify.fusions import pad  # noqa: F401  isort: skip
from passes.simplify.fusions import normalization  # noqa: F401  isort: skip
from passes.simplify.fusions import gelu  # noqa: F401  isort: skip
from passes.simplify.fusions import rotary  # noqa: F401  isort: skip
from passes.simplify.fusions import attention  # noqa: F401  isort: skip

__all__: list[str] = []
