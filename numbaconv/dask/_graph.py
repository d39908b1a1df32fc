"""From a parsed problem and Dask operands to a Dask graph of NumPy-API calls.

Each block of the result (forward output, input gradient, or one partial weight gradient)
is one task. The task reads, from every operand, exactly the index range the block needs
(its halo included), assembled from however many of the operand's chunks that range
touches, and calls the NumPy op on it with EXPLICIT pads chosen by :mod:`._geometry`, so
that the call computes that block and nothing else. Partial weight gradients are summed in
a fixed tree of this module's own tasks (:func:`sum_tree`: ``split_every`` partials per
node, added in key order), so the same graph gives the same bits on every run.
"""
import itertools

import numpy as np

from ..problem import numpy_dtype
from . import _geometry as geo

class _Take:
    """How a task assembles one operand's index range from the operand's chunks."""

    __slots__ = ("shape", "src", "dst", "view")

    def __init__(self, shape, src, dst, view):
        self.shape, self.src, self.dst, self.view = shape, src, dst, view

    def __call__(self, blocks):
        if self.view:  # the range lies in one chunk: a view of it
            return blocks[0][self.src[0]]
        out = np.empty(self.shape, blocks[0].dtype)
        for blk, src, dst in zip(blocks, self.src, self.dst):
            out[dst] = blk[src]
        return out


class _Piece:
    """A task that cuts a small piece (a halo) out of a chunk, where the chunk lies, so
    that only the piece travels to the task that needs it."""

    __slots__ = ("src",)

    def __init__(self, src):
        self.src = src

    def __call__(self, block):
        return np.array(block[self.src])


class _Operand:
    """A Dask operand and the boundaries of its chunks along every axis."""

    def __init__(self, arr, token):
        self.arr = arr
        self.name = arr.name
        self.piece_name = f"numbaconv-piece-{token}-{arr.name}"
        self.bnds = [geo.bounds(c) for c in arr.chunks]

    def take(self, ranges, dsk):
        """``(keys, _Take)`` for the index ranges ``[(lo, hi), ...]`` (one per axis).

        A piece of at least half a chunk is read from the chunk itself (the task then
        tends to run where the chunk is); a smaller piece, a halo, is cut out by its own
        task (added to ``dsk``), so that a task never fetches a whole neighbouring chunk
        for a few of its rows.
        """
        per_axis = []
        for (lo, hi), b in zip(ranges, self.bnds):
            parts = []
            for j in range(len(b) - 1):
                s0, s1 = max(lo, b[j]), min(hi, b[j + 1])
                if s1 > s0 or (lo == hi and j == 0):
                    parts.append((j, slice(s0 - b[j], s1 - b[j]), slice(s0 - lo, s1 - lo),
                                  s1 - s0, b[j + 1] - b[j]))
            per_axis.append(parts)
        keys, src, dst = [], [], []
        for combo in itertools.product(*per_axis):
            key = (self.name, *[p[0] for p in combo])
            cut = tuple(p[1] for p in combo)
            share = 1.0
            for p in combo:
                share *= p[3] / p[4] if p[4] else 1.0
            if share < 0.5:
                bounds = tuple((p[1].start, p[1].stop) for p in combo)
                piece = (self.piece_name, *key[1:], *[v for b in bounds for v in b])
                if piece not in dsk:
                    dsk[piece] = (_Piece(cut), key)
                key, cut = piece, tuple(slice(None) for _ in combo)
            keys.append(key)
            src.append(cut)
            dst.append(tuple(p[2] for p in combo))
        shape = tuple(hi - lo for lo, hi in ranges)
        return keys, _Take(shape, src, dst, len(keys) == 1)


class _Call:
    """One task: assemble the operands, call the NumPy op, place the result."""

    __slots__ = ("fn", "takes", "kwargs", "cast", "embed", "shape", "dtype", "out_dtype")

    def __init__(self, fn, takes, kwargs, cast=None, embed=None, shape=None, dtype=None,
                 out_dtype=None):
        self.fn, self.takes, self.kwargs, self.cast = fn, takes, kwargs, cast
        self.embed, self.shape, self.dtype, self.out_dtype = embed, shape, dtype, out_dtype

    def __call__(self, *block_lists):
        from ._worker import configure_worker
        configure_worker()
        arrays = [t(blocks) for t, blocks in zip(self.takes, block_lists)]
        if self.cast is not None:
            arrays = [a.astype(self.cast) for a in arrays]
        res = self.fn(*arrays, **self.kwargs)
        if self.embed is not None:  # rows of the block that no output row reaches are zero
            out = np.zeros(self.shape, self.dtype)
            out[self.embed] = res
            res = out
        if self.out_dtype is not None:  # a float16 weight gradient of a single partial
            res = res.astype(self.out_dtype)
        return res


class _Sum:
    """A node of the reduction tree: its operands added in the order given, in their own
    dtype (float32 partials of float16 operands), then cast to ``out_dtype`` if given."""

    __slots__ = ("out_dtype",)

    def __init__(self, out_dtype=None):
        self.out_dtype = out_dtype

    def __call__(self, *parts):
        total = np.add(parts[0], parts[1])
        for part in parts[2:]:
            np.add(total, part, out=total)
        if self.out_dtype is not None:
            total = total.astype(self.out_dtype)
        return total


def sum_tree(keys, out_key, name, dsk, split_every, out_dtype=None):
    """Tasks in ``dsk`` that add the results of ``keys`` (two or more) into ``out_key``:
    a tree whose nodes add ``split_every`` consecutive results in key order (the last node
    of a level fewer), level by level, the root named ``out_key``. Its shape depends only
    on ``len(keys)`` and ``split_every``: the same bits on every run, whichever worker ran
    what. Returns the tree's depth."""
    level = list(keys)
    depth = 0
    while len(level) > 1:
        depth += 1
        groups = [level[i:i + split_every] for i in range(0, len(level), split_every)]
        if len(groups) == 1:
            dsk[out_key] = (_Sum(out_dtype), *groups[0])
            return depth
        nxt = []
        for j, group in enumerate(groups):
            if len(group) == 1:  # a lone last result goes up a level as it is
                nxt.append(group[0])
                continue
            key = (name, depth, j, *out_key[1:])
            dsk[key] = (_Sum(), *group)
            nxt.append(key)
        level = nxt
    raise ValueError("sum_tree: expected two or more keys")


class _Zeros:
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype

    def __call__(self):
        return np.zeros(self.shape, self.dtype)


def _array(name, dsk, deps, chunks, dtype):
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=deps)
    meta = np.empty((0,) * len(chunks), dtype)
    return da.Array(graph, name, chunks=chunks, dtype=dtype, meta=meta)


def _task(call, pieces):
    """A task tuple: ``call`` with, per operand, the list of the chunk keys it reads."""
    return (call, *[list(keys) for keys in pieces])


class Layout:
    """Where batch, channels and spatial axes sit in the data and filter arrays."""

    def __init__(self, nd, data_format, filter_format):
        self.nd = nd
        if data_format == "NXC":
            self.c_axis, self.sp = nd + 1, tuple(range(1, nd + 1))
        else:
            self.c_axis, self.sp = 1, tuple(range(2, nd + 2))
        self.k_axis = nd + 1 if filter_format == "XIO" else 0

    def data(self, n, c, spatial):
        """A data-shaped tuple from its batch, channel and spatial entries."""
        out = [None] * (self.nd + 2)
        out[0], out[self.c_axis] = n, c
        for a, v in zip(self.sp, spatial):
            out[a] = v
        return tuple(out)

    def filt(self, full_shape, k_range):
        """Ranges over a filter of ``full_shape``: all of it but ``k_range`` of K."""
        r = [(0, n) for n in full_shape]
        r[self.k_axis] = k_range
        return r


def _group_bounds(bnds, per_group, groups, arg, axis, what):
    """Group boundaries from a channel axis' chunk boundaries (ValueError when a chunk
    does not hold whole groups)."""
    if len(bnds) <= 2:
        return [0, groups]
    if groups == 1 or any(b % per_group for b in bnds):
        if groups == 1:
            why = (f"every output channel reads every input channel (groups=1), so the "
                   f"channel axis cannot be split")
        else:
            why = (f"with groups={groups} each chunk must hold whole groups of {per_group} "
                   f"{what} channels, got chunks {geo.sizes(bnds)}")
        raise ValueError(f"{arg}: chunks along the channel axis (axis {axis}): {why}; "
                         f"rechunk it, e.g. {arg}.rechunk({{{axis}: -1}})")
    return [b // per_group for b in bnds]


class Geometry:
    """The problem's per-axis numbers, restricted to the user's spatial rank."""

    def __init__(self, p):
        nd = p.ndim
        self.nd = nd
        self.I = p.isz[3 - nd:]
        self.O = p.osz[3 - nd:]
        self.k = p.ksz[3 - nd:]
        self.s = p.stride[3 - nd:]
        self.d = p.dilation[3 - nd:]
        self.pb = p.pad_begin[3 - nd:]
        self.dk = tuple((k - 1) * d + 1 for k, d in zip(self.k, self.d))


def _common_kwargs(g, groups, filter_format, data_format, strategy, tune):
    kw = dict(strides=list(g.s), dilations=list(g.d), groups=groups,
              data_format=data_format, filter_format=filter_format)
    if strategy is not None:
        kw["strategy"] = strategy
    if tune:
        kw["tune"] = True
    return kw


def forward(p, x, w, names, token, strategy=None, tune=False):
    """The forward output of problem ``p`` as a Dask array; ``x``, ``w`` Dask arrays (``w``
    in XIO or OIX, depthwise filters already reshaped to XIO)."""
    import numbaconv
    g = Geometry(p)
    lay = Layout(p.ndim, p.data_format, p.filter_format)
    X, W = _Operand(x, token), _Operand(w, token)
    icg, ocg = p.icg, p.ocg
    nb = X.bnds[0]
    gb = _group_bounds(X.bnds[lay.c_axis], icg, p.g, names["x"], lay.c_axis, "input")
    ob = [geo.fwd_out_bounds(X.bnds[ax], g.O[a], g.s[a], g.pb[a])
          for a, ax in enumerate(lay.sp)]
    dtype = numpy_dtype(p.dtype)
    name = f"numbaconv-{p.op}-{token}"
    dsk = {}
    for ib in range(len(nb) - 1):
        for ia in itertools.product(*[range(len(b) - 1) for b in ob]):
            orng = [(ob[a][i], ob[a][i + 1]) for a, i in enumerate(ia)]
            wins = [geo.fwd_window(o0, o1, g.I[a], g.s[a], g.pb[a], g.dk[a])
                    for a, (o0, o1) in enumerate(orng)]
            for ig in range(len(gb) - 1):
                g0, g1 = gb[ig], gb[ig + 1]
                key = (name, *lay.data(ib, ig, ia))
                shape = lay.data(nb[ib + 1] - nb[ib], (g1 - g0) * ocg,
                                 [o1 - o0 for o0, o1 in orng])
                if any(wn is None for wn in wins):
                    dsk[key] = (_Zeros(shape, dtype),)
                    continue
                xk, xt = X.take(lay.data((nb[ib], nb[ib + 1]), (g0 * icg, g1 * icg),
                                         [(wn[0], wn[1]) for wn in wins]), dsk)
                wk, wt = W.take(lay.filt(w.shape, (g0 * ocg, g1 * ocg)), dsk)
                kw = _common_kwargs(g, g1 - g0, p.filter_format, p.data_format, strategy, tune)
                kw.update(pads_begin=[wn[2] for wn in wins], pads_end=[wn[3] for wn in wins])
                dsk[key] = _task(_Call(numbaconv.convolution, (xt, wt), kw), (xk, wk))
    chunks = lay.data(geo.sizes(nb), tuple(n * ocg for n in geo.sizes(gb)),
                      [geo.sizes(b) for b in ob])
    return _array(name, dsk, [x, w], chunks, dtype)


def backward_data(p, dy, w, names, token, strategy=None, tune=False):
    """The input gradient of problem ``p`` as a Dask array."""
    import numbaconv
    g = Geometry(p)
    lay = Layout(p.ndim, p.data_format, p.filter_format)
    D, W = _Operand(dy, token), _Operand(w, token)
    icg, ocg = p.icg, p.ocg
    nb = D.bnds[0]
    gb = _group_bounds(D.bnds[lay.c_axis], ocg, p.g, names["dy"], lay.c_axis, "output")
    ib_ = [geo.bwd_in_bounds(D.bnds[ax], g.I[a], g.s[a], g.pb[a])
           for a, ax in enumerate(lay.sp)]
    dtype = numpy_dtype(p.dtype)
    name = f"numbaconv-{p.op}-{token}"
    dsk = {}
    for ib in range(len(nb) - 1):
        for ia in itertools.product(*[range(len(b) - 1) for b in ib_]):
            irng = [(ib_[a][i], ib_[a][i + 1]) for a, i in enumerate(ia)]
            wins = [geo.bwd_data_window(i0, i1, g.O[a], g.s[a], g.pb[a], g.dk[a])
                    for a, (i0, i1) in enumerate(irng)]
            for ig in range(len(gb) - 1):
                g0, g1 = gb[ig], gb[ig + 1]
                key = (name, *lay.data(ib, ig, ia))
                shape = lay.data(nb[ib + 1] - nb[ib], (g1 - g0) * icg,
                                 [i1 - i0 for i0, i1 in irng])
                if any(wn is None for wn in wins):
                    dsk[key] = (_Zeros(shape, dtype),)
                    continue
                dk_, dt = D.take(lay.data((nb[ib], nb[ib + 1]), (g0 * ocg, g1 * ocg),
                                          [(wn[0], wn[1]) for wn in wins]), dsk)
                wk, wt = W.take(lay.filt(w.shape, (g0 * ocg, g1 * ocg)), dsk)
                kw = _common_kwargs(g, g1 - g0, p.filter_format, p.data_format, strategy, tune)
                kw.update(pads_begin=[wn[4] for wn in wins], pads_end=[wn[5] for wn in wins],
                          output_shape=[wn[3] - wn[2] for wn in wins])
                embed = None
                if any((wn[2], wn[3]) != r for wn, r in zip(wins, irng)):
                    embed = lay.data(slice(None), slice(None),
                                     [slice(wn[2] - r[0], wn[3] - r[0])
                                      for wn, r in zip(wins, irng)])
                call = _Call(numbaconv.convolution_backprop_data, (dt, wt), kw, embed=embed,
                             shape=shape, dtype=dtype)
                dsk[key] = _task(call, (dk_, wk))
    chunks = lay.data(geo.sizes(nb), tuple(n * icg for n in geo.sizes(gb)),
                      [geo.sizes(b) for b in ib_])
    return _array(name, dsk, [dy, w], chunks, dtype)


def backward_weights(p, x, dy, names, token, strategy=None, tune=False,
                     split_every=None):
    """The weight gradient of problem ``p`` (XIO or OIX) as a Dask array: one partial per
    block of the output grid, summed in a fixed tree (:func:`sum_tree`); float16 partials
    are float32, the root rounds once."""
    import dask.array as da
    import numbaconv
    g = Geometry(p)
    lay = Layout(p.ndim, p.data_format, p.filter_format)
    X, D = _Operand(x, token), _Operand(dy, token)
    icg, ocg = p.icg, p.ocg
    nb = geo.union(X.bnds[0], D.bnds[0])
    gb = geo.union(_group_bounds(X.bnds[lay.c_axis], icg, p.g, names["x"], lay.c_axis,
                                 "input"),
                   _group_bounds(D.bnds[lay.c_axis], ocg, p.g, names["dy"], lay.c_axis,
                                 "output"))
    ob = [geo.union(D.bnds[ax], geo.fwd_out_bounds(X.bnds[ax], g.O[a], g.s[a], g.pb[a]))
          for a, ax in enumerate(lay.sp)]
    dtype = numpy_dtype(p.dtype)
    acc = np.dtype(p.compute_dtype)  # float32 partials for float16 operands
    if p.filter_format == "XIO":
        w_shape = (*g.k, icg, p.oc)
        w_chunks = (*[(k,) for k in g.k], (icg,), tuple(n * ocg for n in geo.sizes(gb)))
    else:
        w_shape = (p.oc, icg, *g.k)
        w_chunks = (tuple(n * ocg for n in geo.sizes(gb)), (icg,), *[(k,) for k in g.k])
    name = f"numbaconv-{p.op}-{token}"
    pname = f"numbaconv-{p.op}-partials-{token}"
    tname = f"numbaconv-{p.op}-sum-{token}"
    dsk = {}
    parts = {ig: [] for ig in range(len(gb) - 1)}  # per channel group: (key, call), in order
    for ib in range(len(nb) - 1):
        for ia in itertools.product(*[range(len(b) - 1) for b in ob]):
            orng = [(ob[a][i], ob[a][i + 1]) for a, i in enumerate(ia)]
            wins = [geo.fwd_window(o0, o1, g.I[a], g.s[a], g.pb[a], g.dk[a])
                    for a, (o0, o1) in enumerate(orng)]
            if any(wn is None for wn in wins):  # these output rows read only padding
                continue
            for ig in range(len(gb) - 1):
                g0, g1 = gb[ig], gb[ig + 1]
                n_rng = (nb[ib], nb[ib + 1])
                xk, xt = X.take(lay.data(n_rng, (g0 * icg, g1 * icg),
                                         [(wn[0], wn[1]) for wn in wins]), dsk)
                dk_, dt = D.take(lay.data(n_rng, (g0 * ocg, g1 * ocg), orng), dsk)
                kw = _common_kwargs(g, g1 - g0, p.filter_format, p.data_format, strategy, tune)
                kw.update(pads_begin=[wn[2] for wn in wins], pads_end=[wn[3] for wn in wins])
                call = _Call(_bwd_w_call, (xt, dt), dict(ksz=list(g.k), kw=kw),
                             cast=acc if acc != dtype else None)
                parts[ig].append((call, xk, dk_))
    if not parts[0]:
        return da.zeros(w_shape, dtype=dtype, chunks=w_chunks)
    for ig, calls in parts.items():
        idx = [0] * (g.nd + 2)
        idx[lay.k_axis] = ig
        out_key = (name, *idx)
        if len(calls) == 1:  # the one partial is the block, rounded in its own task
            call, xk, dk_ = calls[0]
            call.out_dtype = dtype if acc != dtype else None
            dsk[out_key] = _task(call, (xk, dk_))
            continue
        keys = []
        for i, (call, xk, dk_) in enumerate(calls):
            keys.append((pname, i, *idx))
            dsk[keys[-1]] = _task(call, (xk, dk_))
        sum_tree(keys, out_key, tname, dsk, split_every or 8,
                 out_dtype=dtype if acc != dtype else None)
    return _array(name, dsk, [x, dy], w_chunks, dtype)


def _bwd_w_call(x, dy, ksz, kw):
    import numbaconv
    return numbaconv.convolution_backprop_filters(x, ksz, dy, **kw)


def single_chunk(arr):
    """``arr`` (NumPy or Dask) as a Dask array of one chunk."""
    import dask.array as da
    if isinstance(arr, da.Array):
        return arr
    return da.from_array(arr, chunks=tuple(max(n, 1) for n in arr.shape) if arr.size else -1)


def token_of(*parts):
    from dask.base import tokenize
    return tokenize(*parts)

