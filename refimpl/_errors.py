"""The exceptions of refimpl: what a caller can tell apart.

* :class:`UnsupportedOpError`: no kernel implements the (domain, op_type, opset), or the kernel
  does not implement the attribute value asked for (Resize's linear and cubic modes).
* :class:`RefImplError`: a kernel rejected its inputs or attributes (invalid for the op, or a
  conversion refimpl declines because it cannot match the runtimes exactly).
* :class:`UndefinedResultError`, a :class:`RefImplError`: the inputs are valid but the spec
  leaves the result undefined (integer division by zero, float -> int out of range, duplicate
  scatter indices, integer overflow in a reduction, the mean of an empty set...).
* :class:`RuntimeChoiceError`, an :class:`UndefinedResultError`: the value is defined up to a
  choice the implementation makes (the order of a float sum, where its accumulator starts, which
  zero a tie of +0 and -0 gives): the runtime's own evaluation of the node decides it.
* :class:`KernelBugError`, *not* a :class:`RefImplError`: anything else that escaped a kernel.
  It is a bug in refimpl, never a verdict on the inputs, so callers count it apart.

Kernels raise only the first two kinds of :class:`RefImplError`; ``refimpl.run`` wraps every other
exception into :class:`KernelBugError` (MemoryError and KeyboardInterrupt propagate).
"""

from __future__ import annotations

__all__ = ["KernelBugError", "RefImplError", "RuntimeChoiceError", "UndefinedResultError", "UnsupportedOpError"]


class UnsupportedOpError(LookupError):
    """refimpl has no kernel for this (domain, op_type, opset)."""


class RefImplError(ValueError):
    """A kernel rejected its inputs or attributes; the message names the op.

    Kernels may leave the op out of the message: ``refimpl.run`` records the op and its schema
    version (:meth:`locate`), and the message then starts with ``"Op-version: "``.

    Attributes:
        op_type: The operator that raised, once ``run`` has recorded it (else None).
        version: Its schema version, once recorded (else None).
    """

    op_type: str | None = None
    version: int | None = None

    def locate(self, op_type: str, version: int) -> None:
        """Records the op that raised, unless an inner call already did."""
        if self.op_type is None:
            self.op_type, self.version = op_type, version

    def __str__(self) -> str:
        message = super().__str__()
        if self.op_type is None or message.startswith(self.op_type):
            return message
        return f"{self.op_type}-{self.version}: {message}"


class UndefinedResultError(RefImplError):
    """The inputs are valid, but the spec leaves the result undefined: there is no value."""


class RuntimeChoiceError(UndefinedResultError):
    """The value is fixed only up to the runtime's choice of order, accumulator start or tie-break.

    Float results only: the sign of a zero whose terms are all -0, a sum that cancels within the
    rounding of another order, terms that may overflow or underflow in the runtime's order, the
    zero a Max/Min/Where gives on a tie of +0 and -0. A caller that can ask the runtime (fold's
    confirmation) takes the runtime's value; others treat it as undefined.
    """


class KernelBugError(RuntimeError):
    """A kernel failed with an exception that is not a verdict on its inputs: a refimpl bug.

    The original exception is chained as ``__cause__``.

    Attributes:
        op_type: The operator whose kernel failed.
        version: The schema version the kernel ran for.
        domain: The operator's domain (``""`` for the default one).
    """

    def __init__(self, op_type: str, version: int, domain: str, error: BaseException) -> None:
        where = f"{op_type}-{version}" + (f" (domain {domain!r})" if domain else "")
        super().__init__(f"{where}: kernel bug: {type(error).__name__}: {error}")
        self.op_type, self.version, self.domain = op_type, version, domain
