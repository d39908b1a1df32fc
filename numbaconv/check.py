"""``numbaconv check``: every op on small problems against the float64 reference."""
import numpy as np

from . import reference as R


def _cl(a, fmt):
    """Data in channels-last order (from NCX / NCHW / NCDHW)."""
    return a if fmt in ("NXC", "NHWC", "NDHWC") else np.moveaxis(a, 1, -1)


def _cf(a, fmt):
    return a if fmt in ("NXC", "NHWC", "NDHWC") else np.moveaxis(a, -1, 1)


def _cases(rng):
    """(label, call(dtype) -> (got, ref, ref_abs)) for every public op."""
    import numbaconv as nc

    def r(*shape):
        return rng.standard_normal(shape)

    cases = []

    def tf_case(label, nd, fmt, depthwise, strides, dil, pads, fn_kind, fn):
        # pads: (pb, pe) spatial or "SAME"
        n, c, m_or_k = 2, 4, 2
        isz = (5, 6, 4)[:nd] if nd == 2 else (4, 5, 4)
        ksz = (3, 2, 2)[:nd]
        if depthwise:
            wt = r(*ksz, c, m_or_k)
            w_xio = wt.reshape(*ksz, 1, c * m_or_k)
            groups, k = c, c * m_or_k
        else:
            wt = r(*ksz, c, 6)
            w_xio, groups, k = wt, 1, 6
        if pads == "SAME":
            osz = tuple(-(-i // s) for i, s in zip(isz, strides))
            tot = [max((o - 1) * s + (kk - 1) * d + 1 - i, 0)
                   for o, s, kk, d, i in zip(osz, strides, ksz, dil, isz)]
            pb = tuple(t // 2 for t in tot)
            pe = tuple(t - t // 2 for t in tot)
            padding, extra = "SAME", {}
        else:
            pb, pe = pads
            full = [(0, 0)] + list(zip(pb, pe)) + [(0, 0)]
            if fmt.startswith("NC"):
                full = [full[0], full[-1]] + full[1:-1]
            padding = "EXPLICIT" if nd == 2 else full
            extra = {"explicit_paddings": [v for p in full for v in p]} if nd == 2 else {}
            osz = R.out_size(isz, ksz, strides, dil, pb, pe)
        x_cl = r(n, *isz, c)
        dy_cl = r(n, *osz, k)
        x, dy = _cf(x_cl, fmt), _cf(dy_cl, fmt)
        kw = dict(data_format=fmt, dilations=list(dil), **extra)

        def call(dt):
            cast = lambda a: a.astype(dt)  # noqa: E731
            xc, dyc, wc = cast(x), cast(dy), cast(wt)
            ref_args = (strides, dil, pb, pe, groups)
            x64, dy64, w64 = (_cl(xc.astype(np.float64), fmt), _cl(dyc.astype(np.float64), fmt),
                              wc.astype(np.float64).reshape(w_xio.shape))
            if fn_kind == "bwd_d":
                got = _cl(fn(list(x.shape), wc, dyc, list(strides), padding, **kw), fmt)
                ref = R.conv_bwd_data(dy64, w64, isz, *ref_args)
                ra = R.conv_bwd_data(abs(dy64), abs(w64), isz, *ref_args)
            elif fn_kind == "bwd_w":
                got = fn(xc, list(wt.shape), dyc, list(strides), padding, **kw)
                got = got.reshape(w_xio.shape)
                ref = R.conv_bwd_filter(x64, dy64, ksz, *ref_args)
                ra = R.conv_bwd_filter(abs(x64), abs(dy64), ksz, *ref_args)
            else:
                got = _cl(fn(xc, wc, list(strides), padding, **kw), fmt)
                ref = R.conv_fwd(x64, w64, *ref_args)
                ra = R.conv_fwd(abs(x64), abs(w64), *ref_args)
            return got, ref, ra
        cases.append((label, call))

    tf_case("conv2d_backprop_input NHWC SAME s2", 2, "NHWC", False, (2, 2), (1, 1), "SAME",
            "bwd_d", nc.conv2d_backprop_input)
    tf_case("conv2d_backprop_filter NCHW EXPLICIT d2", 2, "NCHW", False, (1, 2), (2, 1),
            ((1, 0), (2, 1)), "bwd_w", nc.conv2d_backprop_filter)
    tf_case("conv2d NHWC SAME s2 d2", 2, "NHWC", False, (2, 1), (1, 2), "SAME", "fwd",
            nc.conv2d)
    tf_case("depthwise_conv2d_native_backprop_input", 2, "NHWC", True, (2, 2), (1, 1), "SAME",
            "bwd_d", nc.depthwise_conv2d_native_backprop_input)
    tf_case("depthwise_conv2d_native_backprop_filter", 2, "NCHW", True, (1, 1), (2, 2), "SAME",
            "bwd_w", nc.depthwise_conv2d_native_backprop_filter)
    tf_case("depthwise_conv2d_native", 2, "NHWC", True, (1, 2), (1, 1), "SAME", "fwd",
            nc.depthwise_conv2d_native)
    tf_case("conv3d_backprop_input_v2 NDHWC SAME", 3, "NDHWC", False, (1, 2, 2), (1, 1, 1),
            "SAME", "bwd_d", nc.conv3d_backprop_input_v2)
    tf_case("conv3d_backprop_filter_v2 NCDHW pairs", 3, "NCDHW", False, (2, 1, 1), (1, 1, 2),
            ((1, 0, 0), (0, 1, 1)), "bwd_w", nc.conv3d_backprop_filter_v2)
    tf_case("conv3d NDHWC SAME", 3, "NDHWC", False, (1, 1, 2), (1, 1, 1), "SAME", "fwd",
            nc.conv3d)

    def generic(label, nd, g, fmt, ffmt, kind):
        n, c, k = 2, 4, 6
        isz = (9, 6, 5)[:nd]
        ksz = (3, 2, 2)[:nd]
        st, dil = (2, 1, 1)[:nd], (1, 2, 1)[:nd]
        pb, pe = (1, 0, 1)[:nd], (2, 1, 0)[:nd]
        osz = R.out_size(isz, ksz, st, dil, pb, pe)
        w_xio = r(*ksz, c // g, k)
        w = w_xio if ffmt == "XIO" else np.moveaxis(w_xio, (-1, -2), (0, 1))
        x_cl, dy_cl = r(n, *isz, c), r(n, *osz, k)
        x, dy = _cf(x_cl, fmt), _cf(dy_cl, fmt)
        attrs = dict(strides=st, dilations=dil, pads_begin=pb, pads_end=pe, groups=g,
                     data_format=fmt, filter_format=ffmt)
        ref_args = (st, dil, pb, pe, g)

        def call(dt):
            xc, dyc, wc = x.astype(dt), dy.astype(dt), w.astype(dt)
            x64, dy64 = _cl(xc.astype(np.float64), fmt), _cl(dyc.astype(np.float64), fmt)
            w64 = wc.astype(np.float64)
            if ffmt == "OIX":
                w64 = np.moveaxis(w64, (0, 1), (-1, -2))
            if kind == "fwd":
                got = _cl(nc.convolution(xc, wc, **attrs), fmt)
                return (got, R.conv_fwd(x64, w64, *ref_args),
                        R.conv_fwd(abs(x64), abs(w64), *ref_args))
            if kind == "bwd_d":
                got = _cl(nc.convolution_backprop_data(dyc, wc, isz, **attrs), fmt)
                return (got, R.conv_bwd_data(dy64, w64, isz, *ref_args),
                        R.conv_bwd_data(abs(dy64), abs(w64), isz, *ref_args))
            got = nc.convolution_backprop_filters(xc, ksz, dyc, **attrs)
            if ffmt == "OIX":
                got = np.moveaxis(got, (0, 1), (-1, -2))
            return (got, R.conv_bwd_filter(x64, dy64, ksz, *ref_args),
                    R.conv_bwd_filter(abs(x64), abs(dy64), ksz, *ref_args))
        cases.append((label, call))

    generic("convolution 1-D g2 NCX OIX", 1, 2, "NCX", "OIX", "fwd")
    generic("convolution_backprop_data 2-D g2 NXC XIO", 2, 2, "NXC", "XIO", "bwd_d")
    generic("convolution_backprop_data 3-D NCX OIX", 3, 1, "NCX", "OIX", "bwd_d")
    generic("convolution_backprop_filters 1-D g2 NXC", 1, 2, "NXC", "XIO", "bwd_w")
    generic("convolution_backprop_filters 3-D g2 NCX OIX", 3, 2, "NCX", "OIX", "bwd_w")
    generic("convolution 3-D NXC XIO", 3, 1, "NXC", "XIO", "fwd")
    return cases


def default_dtypes():
    """float16, float32, float64, and bfloat16 where ml_dtypes is installed."""
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return ("float16", "float32", "float64")
    return ("float16", "float32", "float64", "bfloat16")


def run_check(dtypes=None, verbose=True, seed=0):
    """Run every op against the reference; prints a table, returns 0 if all pass, else 1.
    ``dtypes``: default :func:`default_dtypes`; ``"bfloat16"`` needs ml_dtypes."""
    from .problem import numpy_dtype
    dtypes = default_dtypes() if dtypes is None else tuple(dtypes)
    if "bfloat16" in dtypes:
        try:
            import ml_dtypes  # noqa: F401  (registers the dtype the calls cast to)
        except ImportError:
            raise ValueError("dtypes: bfloat16 needs the ml_dtypes package "
                             "(pip install ml-dtypes)") from None
    rng = np.random.default_rng(seed)
    cases = _cases(rng)
    failures = 0
    if verbose:
        print(f"{'op':<46} {'dtype':<8} {'error':>10} {'tolerance':>10}  ok")
    for label, call in cases:
        for dt in dtypes:
            got, ref, ra = call(dt)
            err = R.normalized_error(got, ref, ra)
            tol = R.TOLERANCE[dt]
            ok = err <= tol and got.dtype == numpy_dtype(dt)
            failures += not ok
            if verbose:
                print(f"{label:<46} {dt:<8} {err:10.2e} {tol:10.0e}  {'yes' if ok else 'NO'}")
    if verbose:
        total = len(cases) * len(dtypes)
        print(f"{total - failures}/{total} passed")
    return 1 if failures else 0
