"""Neural-network layers that fold: Softmax, LogSoftmax and Dropout in inference mode.

Softmax and LogSoftmax compute every float type below float64 in float64 and round once, so
their results are (nearly always) correctly rounded.
"""

from __future__ import annotations

import math

import numpy as np

from refimpl._common import Attrs, Inputs, as_array, normalize_axis, scalar
from refimpl._dtypes import DTypes, checked, wide_type
from refimpl._errors import RefImplError
from refimpl._registry import Kernel, Typed, register

# --- Softmax, LogSoftmax ------------------------------------------------------------------------


def _softmax(log: bool, coerce_2d: bool, allow_negative: bool) -> Typed:
    """Softmax or LogSoftmax.

    Before version 13 the input is coerced to 2-D at ``axis`` (dims before it
    form the rows) and normalised over each row, i.e. over *all* dims from
    ``axis`` on; from version 13 it is normalised over the single ``axis``.
    """
    op = "LogSoftmax" if log else "Softmax"

    def make(types: DTypes) -> Kernel:
        allowed = types["T"]

        def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
            x = checked(inputs[0], allowed)
            axis = normalize_axis(op, attrs["axis"], x.ndim, allow_negative=allow_negative)
            if x.size == 0:
                return (x.copy(),)
            y = x.astype(wide_type(x.dtype), copy=False)
            if coerce_2d:
                y = y.reshape(math.prod(x.shape[:axis]), -1)
                axis = 1
            shifted = y - y.max(axis=axis, keepdims=True)
            exp = np.exp(shifted)
            total = exp.sum(axis=axis, keepdims=True)
            y = shifted - np.log(total) if log else exp / total
            return (y.reshape(x.shape).astype(x.dtype, copy=False),)

        return kernel

    return Typed(make)


for _log, _op in ((False, "Softmax"), (True, "LogSoftmax")):
    register(_op, 1, 1)(_softmax(_log, coerce_2d=True, allow_negative=False))
    register(_op, 11, 11)(_softmax(_log, coerce_2d=True, allow_negative=True))
    register(_op, 13)(_softmax(_log, coerce_2d=False, allow_negative=True))


# --- Dropout -----------------------------------------------------------------------------------


def _dropout(mask_like_input: bool, mode_inputs: bool) -> Kernel:
    """Dropout in inference mode: the input unchanged and an all-true mask.

    Versions 7 and 10 are inference-only (version 7's mask has the input
    type). From version 12 the ``training_mode`` input may ask for random
    dropout, which has no deterministic result unless the ratio is 0.
    """

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray, np.ndarray]:
        x = as_array(inputs[0])
        training = len(inputs) > 2 and inputs[2] is not None
        if mode_inputs and training and scalar("Dropout", "training_mode", inputs[2]):
            given = len(inputs) > 1 and inputs[1] is not None
            ratio = float(scalar("Dropout", "ratio", inputs[1])) if given else 0.5
            if ratio != 0.0:
                raise RefImplError(f"Dropout: training mode with ratio {ratio} is random")
        mask = np.ones(x.shape, dtype=x.dtype if mask_like_input else np.bool_)
        return x, mask

    return kernel


register("Dropout", 7, 7)(_dropout(mask_like_input=True, mode_inputs=False))
register("Dropout", 10, 10)(_dropout(mask_like_input=False, mode_inputs=False))
register("Dropout", 12)(_dropout(mask_like_input=False, mode_inputs=True))
