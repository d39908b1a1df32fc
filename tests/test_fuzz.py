"""Hypothesis fuzzing of valid generic configurations (1-3 spatial dims, groups, strides,
dilations, asymmetric pads, auto_pad, layouts, dtypes) against the NumPy reference."""
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import numbaconv as nc
from reference import (assert_matches, conv_bwd_data_ref, conv_bwd_filter_ref, conv_fwd_ref,
                       oix_to_xio, onednn_pads, out_shape, to_channels_first, to_channels_last,
                       xio_to_oix)

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def configs(draw):
    nd = draw(st.integers(1, 3))
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    cg = draw(st.integers(1, 2))
    kg = draw(st.integers(1, 2))
    maxx = {1: 7, 2: 6, 3: 4}[nd]
    xs = tuple(draw(st.lists(st.integers(1, maxx), min_size=nd, max_size=nd)))
    ks = tuple(draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd)))
    s = tuple(draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd)))
    d = tuple(draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd)))
    pb = tuple(draw(st.lists(st.integers(0, 2), min_size=nd, max_size=nd)))
    pe = tuple(draw(st.lists(st.integers(0, 2), min_size=nd, max_size=nd)))
    auto_pad = draw(st.sampled_from([None, None, "none", "same_upper", "same_lower", "valid"]))
    epb, epe = onednn_pads(auto_pad, xs, ks, s, d, pb, pe)
    # the dilated filter must fit in the padded input
    for a in range(nd):
        if xs[a] + epb[a] + epe[a] < (ks[a] - 1) * d[a] + 1:
            xs = xs[:a] + ((ks[a] - 1) * d[a] + 1,) + xs[a + 1:]
            epb, epe = onednn_pads(auto_pad, xs, ks, s, d, pb, pe)
    return dict(
        n=draw(st.integers(1, 2)), x=xs, c=cg * groups, f=ks, k=kg * groups, s=s, d=d, pb=pb,
        pe=pe, epb=epb, epe=epe, auto_pad=auto_pad, groups=groups,
        dfmt=draw(st.sampled_from(["NXC", "NCX"])), ffmt=draw(st.sampled_from(["XIO", "OIX"])),
        dtype=draw(st.sampled_from([np.float32, np.float32, np.float64])),
        seed=draw(st.integers(0, 2 ** 32 - 1)))


def _setup(cfg):
    r = np.random.default_rng(cfg["seed"])
    o = out_shape(cfg["x"], cfg["f"], cfg["s"], cfg["d"], cfg["epb"], cfg["epe"])
    x = r.standard_normal((cfg["n"],) + cfg["x"] + (cfg["c"],)).astype(cfg["dtype"])
    w = r.standard_normal(cfg["f"] + (cfg["c"] // cfg["groups"], cfg["k"])).astype(cfg["dtype"])
    dy = r.standard_normal((cfg["n"],) + o + (cfg["k"],)).astype(cfg["dtype"])
    ncx, oix = cfg["dfmt"] == "NCX", cfg["ffmt"] == "OIX"
    lib = dict(
        x=np.ascontiguousarray(to_channels_first(x)) if ncx else x,
        dy=np.ascontiguousarray(to_channels_first(dy)) if ncx else dy,
        w=np.ascontiguousarray(xio_to_oix(w)) if oix else w)
    kw = dict(strides=list(cfg["s"]), dilations=list(cfg["d"]), pads_begin=list(cfg["pb"]),
              pads_end=list(cfg["pe"]), groups=cfg["groups"], data_format=cfg["dfmt"],
              filter_format=cfg["ffmt"])
    if cfg["auto_pad"] is not None:
        kw["auto_pad"] = cfg["auto_pad"]
    geo = (cfg["s"], cfg["d"], cfg["epb"], cfg["epe"], cfg["groups"])
    data_back = to_channels_last if ncx else (lambda a: a)
    filt_back = oix_to_xio if oix else (lambda a: a)
    return x, w, dy, lib, kw, geo, data_back, filt_back


@SETTINGS
@given(configs())
def test_fuzz_convolution(cfg):
    x, w, dy, lib, kw, geo, data_back, _ = _setup(cfg)
    got = nc.convolution(lib["x"], lib["w"], **kw)
    assert got.shape == lib["dy"].shape
    assert_matches(data_back(got), cfg["dtype"], lambda a, b: conv_fwd_ref(a, b, *geo), x, w,
                   plan=lambda: nc.plan("convolution", lib["x"], lib["w"], **kw))


@SETTINGS
@given(configs())
def test_fuzz_convolution_backprop_data(cfg):
    x, w, dy, lib, kw, geo, data_back, _ = _setup(cfg)
    got = nc.convolution_backprop_data(lib["dy"], lib["w"], list(lib["x"].shape), **kw)
    assert got.shape == lib["x"].shape
    assert_matches(data_back(got), cfg["dtype"],
                   lambda a, b: conv_bwd_data_ref(a, b, cfg["x"], *geo), dy, w,
                   plan=lambda: nc.plan("convolution_backprop_data", lib["dy"], lib["w"],
                                        list(lib["x"].shape), **kw))


@SETTINGS
@given(configs())
def test_fuzz_convolution_backprop_filters(cfg):
    x, w, dy, lib, kw, geo, _, filt_back = _setup(cfg)
    got = nc.convolution_backprop_filters(lib["x"], list(lib["w"].shape), lib["dy"], **kw)
    assert got.shape == lib["w"].shape
    assert_matches(filt_back(got), cfg["dtype"],
                   lambda a, b: conv_bwd_filter_ref(a, b, cfg["f"], *geo), x, dy,
                   plan=lambda: nc.plan("convolution_backprop_filters", lib["x"],
                                        list(lib["w"].shape), lib["dy"], **kw))


@st.composite
def wide_configs(draw):
    """Configurations with 8 channels per group, so that the GEMM strategy accepts them."""
    cfg = draw(configs())
    groups = draw(st.sampled_from([1, 1, 2]))
    cfg.update(groups=groups, c=8 * groups, k=8 * groups,
               dtype=draw(st.sampled_from([np.float32, np.float64, np.float16])),
               direction=draw(st.sampled_from(["fwd", "bwd_data", "bwd_filters"])))
    return cfg


@SETTINGS
@given(wide_configs())
def test_fuzz_forced_gemm_runs_or_declines(cfg):
    """strategy="gemm" either declines with a ValueError naming it, or meets docs/contract.md section 10."""
    x, w, dy, lib, kw, geo, data_back, filt_back = _setup(cfg)
    kw["strategy"] = "gemm"
    direction = cfg["direction"]
    try:
        if direction == "fwd":
            got = data_back(nc.convolution(lib["x"], lib["w"], **kw))
            ref, ops = (lambda a, b: conv_fwd_ref(a, b, *geo)), (x, w)
        elif direction == "bwd_data":
            got = data_back(nc.convolution_backprop_data(lib["dy"], lib["w"],
                                                         list(lib["x"].shape), **kw))
            ref, ops = (lambda a, b: conv_bwd_data_ref(a, b, cfg["x"], *geo)), (dy, w)
        else:
            got = filt_back(nc.convolution_backprop_filters(lib["x"], list(lib["w"].shape),
                                                            lib["dy"], **kw))
            ref, ops = (lambda a, b: conv_bwd_filter_ref(a, b, cfg["f"], *geo)), (x, dy)
    except ValueError as e:
        assert "gemm" in str(e)
        return
    assert_matches(got, cfg["dtype"], ref, *ops, strategy="gemm")
