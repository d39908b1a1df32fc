"""Depthwise patch kernels: each thread a small 2-D patch of results, read straight from memory.

For depthwise proper (``icg == 1``; backward data also ``ocg == 1``), forward and backward
data. A thread owns one channel (lane ``cl`` of a warp: consecutive lanes on consecutive
channels, so each warp load is one coalesced run of the channels-last operand) and a patch
of ``ph x pw`` results along the last two spatial axes; the ``nseg`` threads of a channel
lane in a block own neighbouring patches along the last axis (their halos meet in L1).

The kernel's source is generated per geometry and patch (the loops over the patch, its
source window and the filter taps unrolled in Python), so that the compiled code is
straight-line: the filter in registers, each source value loaded once per thread and used
by every result it reaches (``(KW * pw) / ((pw-1)*sw + (kw-1)*dw + 1)`` multiply-adds per
load along a row), every index a per-thread base plus a compile-time offset, no division
and no shared memory. A thread whose window lies inside the operand takes code without
bounds tests; the others (the image's border patches) test each source row and column.

* forward: ``y[n, o, k] = sum_t x[n, o*s - p + t*d, k // ocg] * w[t, 0, k]``; the source
  window of a patch is ``((ph-1)*sh + (kh-1)*dh + 1) x ((pw-1)*sw + (kw-1)*dw + 1)``.
* backward data: ``dx[n, i, c] = sum_t dy[n, (i + p - t*d)/s, c] * w[t, 0, c]`` over the
  taps where the division is exact. The patch is aligned to the strides (``ph % sh == 0``,
  ``pw % sw == 0``, patches start at multiples of ``ph``, ``pw``), so which taps reach which
  result of a patch, and which ``dy`` value they read, are known at compile time.

The depth axis (3-D) runs as a loop over the depth taps (bounds tested once per tap).
"""
import functools

from numba import cuda, float32, float64, int64, uint64

_TYPES = {"float32": float32, "float64": float64}

#: channels per block (one warp's lanes)
CT = 32


def _cdiv(a, b):
    return -(-a // b)


def fwd_window(geo, ph, pw):
    """``(rows, columns)`` of the source window of a forward patch."""
    kh, kw, sh, sw, dh, dw = geo[8], geo[9], geo[14], geo[15], geo[17], geo[18]
    return (ph - 1) * sh + (kh - 1) * dh + 1, (pw - 1) * sw + (kw - 1) * dw + 1


def _bwd_d_axis(q_n, pad, s, d, k):
    """Backward data along one axis, for a patch of ``q_n`` results starting at a multiple of
    ``q_n`` (itself a multiple of ``s``): ``(pairs, lo, hi)`` with ``pairs`` the
    ``(result q, tap t, source offset o)`` triples where tap ``t`` reaches result ``q`` from
    source ``base + o`` (``base`` the patch start over ``s``), ``lo``/``hi`` the first and
    last offset."""
    pairs = []
    for q in range(q_n):
        for t in range(k):
            a = q + pad - t * d
            if a % s == 0:
                pairs.append((q, t, a // s))
    offs = [o for *_, o in pairs] or [0]
    return pairs, min(offs), max(offs)


def bwd_d_window(geo, ph, pw):
    """``(rows, columns)`` of the ``dy`` window of a backward-data patch."""
    kh, kw, sh, sw, dh, dw, pph, ppw = (geo[8], geo[9], geo[14], geo[15], geo[17], geo[18],
                                        geo[20], geo[21])
    _, lo_h, hi_h = _bwd_d_axis(ph, pph, sh, dh, kh)
    _, lo_w, hi_w = _bwd_d_axis(pw, ppw, sw, dw, kw)
    return hi_h - lo_h + 1, hi_w - lo_w + 1


def _prologue(e, args, chan, nchan, depth, depths, h0, w0, extra=()):
    """Emit a patch kernel's header and its thread's coordinates: lane ``cl``, patch
    ``p``, channel ``chan`` (a return past ``NP`` patches or ``nchan`` channels), the
    ``extra`` lines, then the image ``n``, ``depth`` (of ``depths``) and the patch's first
    row ``h0`` and column ``w0`` (patches row-major, ``NPH x NPW`` of ``RH x RW``)."""
    e(f"def kernel({args}):")
    e("    cl = cuda.threadIdx.x % CT")
    e("    p = cuda.blockIdx.x * NSEG + cuda.threadIdx.x // CT")
    e(f"    {chan} = cuda.blockIdx.y * CT + cl")
    e(f"    if p >= NP or {chan} >= {nchan}:")
    e("        return")
    for line in extra:
        e(f"    {line}")
    e("    pw_ = p % NPW")
    e("    r = p // NPW")
    e("    ph_ = r % NPH")
    e("    r = r // NPH")
    e(f"    {depth} = r % {depths}")
    e(f"    n = r // {depths}")
    e(f"    {h0} = ph_ * RH")
    e(f"    {w0} = pw_ * RW")


def _store(e, ph, pw, out, base, rows, cols, pitch):
    """Emit the stores of a patch's ``ph x pw`` sums ``a*`` into ``out`` from element
    ``base`` (row ``rows``, column ``cols`` bounds, ``pitch`` elements per row)."""
    for qh in range(ph):
        for qw in range(pw):
            e(f"    if {base[0]} + {qh} < {rows} and {base[1]} + {qw} < {cols}:")
            e(f"        {out}[uint64({base[2]} + {qh * pitch[0] + qw * pitch[1]})] = "
              f"a{qh * pw + qw}")


def _fwd_source(geo, ph, pw, nseg):
    MB, G, ICG, OCG, ID, IH, IW, KD, KH, KW, OD, OH, OW, SD, SH, SW, DD, DH, DW, PD, PH, PW = geo
    XR, XC = fwd_window(geo, ph, pw)
    consts = dict(IC=G * ICG, OC=G * OCG, OCG=OCG, ID=ID, IH=IH, IW=IW, KD=KD, OD=OD, OH=OH,
                  OW=OW, SD=SD, SH=SH, SW=SW, DD=DD, PD=PD, PH=PH, PW=PW, RH=ph, RW=pw,
                  XR=XR, XC=XC, NSEG=nseg, NPH=_cdiv(OH, ph), NPW=_cdiv(OW, pw),
                  NP=MB * OD * _cdiv(OH, ph) * _cdiv(OW, pw), KHW=KH * KW)
    L = []
    e = L.append
    _prologue(e, "x, w, y", "k", "OC", "o_d", "OD", "oh0", "ow0", ("kx = k // OCG",))
    e("    ih0 = oh0 * SH - PH")
    e("    iw0 = ow0 * SW - PW")
    for q in range(ph * pw):
        e(f"    a{q} = T(0)")
    e("    inside = ih0 >= 0 and ih0 + XR <= IH and iw0 >= 0 and iw0 + XC <= IW")
    e("    for td in range(KD):")
    e("        i_d = o_d * SD - PD + td * DD")
    e("        if i_d >= 0 and i_d < ID:")
    e("            wb = td * KHW * OC + k")
    for t in range(KH * KW):
        e(f"            w{t} = w[uint64(wb + {t * consts['OC']})]")
    e("            xb = (((n * ID + i_d) * IH + ih0) * IW + iw0) * IC + kx")
    for edge in (False, True):
        e(f"            {'else' if edge else 'if inside'}:")
        ind = " " * 16
        for r in range(XR):
            rind = ind
            if edge:
                e(f"{ind}if ih0 + {r} >= 0 and ih0 + {r} < IH:")
                rind = ind + "    "
            for c in range(XC):
                off = (r * IW + c) * consts["IC"]
                if edge:
                    e(f"{rind}v{c} = x[uint64(xb + {off})] "
                      f"if iw0 + {c} >= 0 and iw0 + {c} < IW else T(0)")
                else:
                    e(f"{rind}v{c} = x[uint64(xb + {off})]")
            # the results this source row reaches: rows qh with r - qh*sh = th*dh
            for qh in range(ph):
                a = r - qh * SH
                if a < 0 or a % DH or a // DH >= KH:
                    continue
                th = a // DH
                for qw in range(pw):
                    for tw in range(KW):  # (one statement each: a chain of FMAs)
                        e(f"{rind}a{qh * pw + qw} += v{qw * SW + tw * DW} * w{th * KW + tw}")
    e("    yb = (((n * OD + o_d) * OH + oh0) * OW + ow0) * OC + k")
    _store(e, ph, pw, "y", ("oh0", "ow0", "yb"), "OH", "OW",
           (OW * consts["OC"], consts["OC"]))
    return "\n".join(L), consts


def _bwd_d_source(geo, ph, pw, nseg):
    MB, G, ICG, OCG, ID, IH, IW, KD, KH, KW, OD, OH, OW, SD, SH, SW, DD, DH, DW, PD, PH, PW = geo
    if ICG != 1 or OCG != 1 or ph % SH or pw % SW:
        raise ValueError("bwd_d_depthwise_patch: icg == ocg == 1 and a patch aligned to the "
                         "strides only")
    C = G
    hp, lo_h, hi_h = _bwd_d_axis(ph, PH, SH, DH, KH)
    wp, lo_w, hi_w = _bwd_d_axis(pw, PW, SW, DW, KW)
    consts = dict(C=C, ID=ID, IH=IH, IW=IW, KD=KD, OD=OD, OH=OH, OW=OW, SD=SD, DD=DD, PD=PD,
                  RH=ph, RW=pw, SH=SH, SW=SW, NSEG=nseg, NPH=_cdiv(IH, ph),
                  NPW=_cdiv(IW, pw), NP=MB * ID * _cdiv(IH, ph) * _cdiv(IW, pw), KHW=KH * KW,
                  LOH=lo_h, LOW=lo_w, YR=hi_h - lo_h + 1, YC=hi_w - lo_w + 1)
    L = []
    e = L.append
    _prologue(e, "dy, w, dx", "c", "C", "i_d", "ID", "ih0", "iw0")
    # the dy window: rows oh0 + LOH ..., columns ow0 + LOW ...
    e("    oh0 = ih0 // SH + LOH")
    e("    ow0 = iw0 // SW + LOW")
    for q in range(ph * pw):
        e(f"    a{q} = T(0)")
    e("    inside = oh0 >= 0 and oh0 + YR <= OH and ow0 >= 0 and ow0 + YC <= OW")
    e("    for td in range(KD):")
    e("        ad = i_d + PD - td * DD")
    e("        o_d = ad // SD")
    e("        if ad >= 0 and o_d * SD == ad and o_d < OD:")
    e("            wb = td * KHW * C + c")
    for t in range(KH * KW):
        e(f"            w{t} = w[uint64(wb + {t * C})]")
    e("            yb = (((n * OD + o_d) * OH + oh0) * OW + ow0) * C + c")
    rows = {}
    for qh, th, o in hp:
        rows.setdefault(o - lo_h, []).append((qh, th))
    cols = {}
    for qw, tw, o in wp:
        cols.setdefault(o - lo_w, []).append((qw, tw))
    for edge in (False, True):
        e(f"            {'else' if edge else 'if inside'}:")
        ind = " " * 16
        for rr in sorted(rows):
            rind = ind
            if edge:
                e(f"{ind}if oh0 + {rr} >= 0 and oh0 + {rr} < OH:")
                rind = ind + "    "
            for cc in range(hi_w - lo_w + 1):
                off = (rr * OW + cc) * C
                if edge:
                    e(f"{rind}v{cc} = dy[uint64(yb + {off})] "
                      f"if ow0 + {cc} >= 0 and ow0 + {cc} < OW else T(0)")
                else:
                    e(f"{rind}v{cc} = dy[uint64(yb + {off})]")
            # per result of the patch: the taps of this dy row, then of each column
            acc = {}
            for qh, th in rows[rr]:
                for cc, lst in cols.items():
                    for qw, tw in lst:
                        acc.setdefault(qh * pw + qw, []).append(f"v{cc} * w{th * KW + tw}")
            for q in sorted(acc):
                for term in acc[q]:
                    e(f"{rind}a{q} += {term}")
    e("    xb = (((n * ID + i_d) * IH + ih0) * IW + iw0) * C + c")
    _store(e, ph, pw, "dx", ("ih0", "iw0", "xb"), "IH", "IW", (IW * C, C))
    return "\n".join(L), consts


def _build(src, consts, dtype, name):
    ns = dict(consts, cuda=cuda, uint64=uint64, int64=int64, T=_TYPES[dtype], CT=CT)
    code = compile(src, f"<numbaconv {name}>", "exec")
    exec(code, ns)
    fn = ns["kernel"]
    fn.__name__ = fn.__qualname__ = name
    return cuda.jit(fn)


@functools.lru_cache(maxsize=256)
def fwd_depthwise_patch(dtype, geo, ph, pw, nseg):
    """Forward, ``icg == 1`` (any multiplier). Flat ``x``, ``w``, ``y``; grid
    ``(ceil(patches / nseg), ceil(oc / CT))`` with ``patches = mb*od*ceil(oh/ph)*ceil(ow/pw)``,
    ``CT * nseg`` threads; ``y`` fully written."""
    src, consts = _fwd_source(geo, ph, pw, nseg)
    return _build(src, consts, dtype, "fwd_depthwise_patch")


@functools.lru_cache(maxsize=256)
def bwd_d_depthwise_patch(dtype, geo, ph, pw, nseg):
    """Backward data, ``icg == ocg == 1``, ``ph % sh == pw % sw == 0``. Flat ``dy``, ``w``,
    ``dx``; grid ``(ceil(patches / nseg), ceil(ic / CT))`` with
    ``patches = mb*id*ceil(ih/ph)*ceil(iw/pw)``, ``CT * nseg`` threads; ``dx`` fully
    written."""
    src, consts = _bwd_d_source(geo, ph, pw, nseg)
    return _build(src, consts, dtype, "bwd_d_depthwise_patch")
