"""Expected conformance failures of the shape, indexing and misc kernels (case name -> reason).

Dropout with ``training_mode`` true and a non-zero ratio draws a random mask:
its output is not a function of the inputs, so refimpl raises RefImplError
rather than produce a value (constant folding must never bake in one random
draw). The cases' expected outputs come from one numpy random draw.

Resize implements mode "nearest" only: the linear and cubic cases raise UnsupportedOpError
(not implemented, as for an op without a kernel), so a model's interpolating Resize is left
in place.
"""

from __future__ import annotations

_RANDOM_DROPOUT = (
    "random by the spec: Dropout in training mode with ratio > 0 has no deterministic "
    "output; refimpl raises RefImplError"
)

_INTERPOLATING_RESIZE = (
    "not implemented: Resize with mode linear or cubic (refimpl has nearest only); "
    "refimpl raises UnsupportedOpError"
)

EXPECTED_FAILURES: dict[str, str] = {
    name: _RANDOM_DROPOUT
    for name in (
        "test_training_dropout",
        "test_training_dropout_mask",
        "test_training_dropout_default",
        "test_training_dropout_default_mask",
    )
} | {
    name: _INTERPOLATING_RESIZE
    for name in (
        "test_resize_upsample_scales_linear",
        "test_resize_upsample_scales_linear_align_corners",
        "test_resize_downsample_scales_linear",
        "test_resize_downsample_scales_linear_align_corners",
        "test_resize_upsample_scales_cubic",
        "test_resize_upsample_scales_cubic_align_corners",
        "test_resize_downsample_scales_cubic",
        "test_resize_downsample_scales_cubic_align_corners",
        "test_resize_upsample_sizes_cubic",
        "test_resize_downsample_sizes_cubic",
        "test_resize_upsample_scales_cubic_A_n0p5_exclude_outside",
        "test_resize_downsample_scales_cubic_A_n0p5_exclude_outside",
        "test_resize_upsample_scales_cubic_asymmetric",
        "test_resize_tf_crop_and_resize",
        "test_resize_tf_crop_and_resize_extrapolation_value",
        "test_resize_downsample_sizes_linear_pytorch_half_pixel",
        "test_resize_downsample_scales_linear_antialias",
        "test_resize_downsample_sizes_linear_antialias",
        "test_resize_downsample_scales_cubic_antialias",
        "test_resize_downsample_sizes_cubic_antialias",
        "test_resize_tf_crop_and_resize_axes_2_3",
        "test_resize_tf_crop_and_resize_axes_3_2",
        "test_resize_downsample_scales_linear_half_pixel_symmetric",
        "test_resize_upsample_scales_linear_half_pixel_symmetric",
    )
}
