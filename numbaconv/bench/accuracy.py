"""The error of numbaconv's result against the float64 reference."""
from dataclasses import replace

import numpy as np

from .. import reference as R
from .. import suites


def _reference(layer, direction, arrays):
    """Float64 reference and its on-absolute-values companion (the scale of docs/contract.md section 10)."""
    x, w, dy = (np.asarray(a, np.float64) for a in arrays)
    geo = (layer.stride, layer.dilation, layer.pad_begin, layer.pad_end, layer.g)
    if direction == "fwd":
        return R.conv_fwd(x, w, *geo), R.conv_fwd(abs(x), abs(w), *geo)
    if direction == "bwd_d":
        return (R.conv_bwd_data(dy, w, layer.isz, *geo),
                R.conv_bwd_data(abs(dy), abs(w), layer.isz, *geo))
    return (R.conv_bwd_filter(x, dy, layer.ksz, *geo),
            R.conv_bwd_filter(abs(x), abs(dy), layer.ksz, *geo))


def numbaconv_fn(c, strategy):
    """A call of the numbaconv op of the suite call ``c``, with ``strategy`` forced."""
    import numbaconv
    fn = getattr(numbaconv, c.op)
    return lambda: fn(*c.args, strategy=strategy, **c.kwargs)


def check_error(layer, direction, arrays, strategy, full_result=None):
    """Normalised error of numbaconv against the float64 reference on the batch-1 slice.

    The float64 reference of a whole layer is slow, so only batch entry 0 is checked. Batch
    entries are independent in ``fwd`` and ``bwd_d``, so there the first entry of the timed
    call's own result is compared; ``bwd_w`` sums over the batch, so it is called again on the
    slice with the same strategy forced.

    Returns
    -------
    (float, str)
        The error and a note (empty unless the slice had to use another strategy).
    """
    x, w, dy = arrays
    one = replace(layer, mb=1)
    sliced = (x[:1], w, dy[:1])
    note = ""
    if direction in ("fwd", "bwd_d") and full_result is not None:
        got = np.asarray(full_result)[:1]
    else:
        c = suites.call(one, direction, arrays=sliced)
        try:
            got = numbaconv_fn(c, strategy)()
        except ValueError as exc:  # the forced strategy declines the batch-1 problem
            got = numbaconv_fn(c, None)()
            note = f"checked with the default strategy ({exc})"
    ref, ref_abs = _reference(one, direction, sliced)
    return R.normalized_error(got, ref, ref_abs), note
