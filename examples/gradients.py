"""The gradients of one convolution layer, TF-style and oneDNN-style, checked numerically.

For y = conv(x, w) and a scalar loss L = sum(y * r) (r random), dL/dy = r, so

    dL/dx = conv2d_backprop_input(x.shape, w, r, ...)      = convolution_backprop_data(r, w, ...)
    dL/dw = conv2d_backprop_filter(x, w.shape, r, ...)     = convolution_backprop_filters(x, ...)

Both are compared with central finite differences of the forward op, in float64.

    python examples/gradients.py
"""
import numpy as np

import numbaconv

rng = np.random.default_rng(0)
x = rng.standard_normal((2, 6, 6, 2))       # NHWC
w = rng.standard_normal((3, 3, 2, 3))       # [fh, fw, in, out]
stride, padding = 2, "SAME"                 # 6x6 -> 3x3: one padded row/column, at the end

y = numbaconv.conv2d(x, w, stride, padding)
r = rng.standard_normal(y.shape)            # dL/dy


def loss(x, w):
    return float(np.sum(numbaconv.conv2d(x, w, stride, padding) * r))


def finite_difference(f, a, eps=1e-6):
    """Central differences of the scalar f(a) with respect to every element of a."""
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        old = a[i]
        a[i] = old + eps
        up = f()
        a[i] = old - eps
        down = f()
        a[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


dx_fd = finite_difference(lambda: loss(x, w), x)
dw_fd = finite_difference(lambda: loss(x, w), w)

# TensorFlow names (tf.raw_ops.Conv2DBackpropInput / Conv2DBackpropFilter)
dx_tf = numbaconv.conv2d_backprop_input(x.shape, w, r, stride, padding)
dw_tf = numbaconv.conv2d_backprop_filter(x, w.shape, r, stride, padding)

# oneDNN Graph names: the same layer as explicit pads (TF's SAME here: 0 before, 1 after)
onednn = dict(strides=stride, pads_begin=0, pads_end=1)          # or auto_pad="same_upper"
assert np.allclose(numbaconv.convolution(x, w, **onednn), y)
dx_dnnl = numbaconv.convolution_backprop_data(r, w, x.shape, **onednn)
dw_dnnl = numbaconv.convolution_backprop_filters(x, w.shape, r, **onednn)

for name, got, want in [("dx  conv2d_backprop_input       ", dx_tf, dx_fd),
                        ("dw  conv2d_backprop_filter      ", dw_tf, dw_fd),
                        ("dx  convolution_backprop_data   ", dx_dnnl, dx_fd),
                        ("dw  convolution_backprop_filters", dw_dnnl, dw_fd)]:
    err = np.abs(got - want).max() / np.abs(want).max()
    print(f"{name}  shape {got.shape}  max error vs finite differences {err:.1e}")
    assert err < 1e-6, name
