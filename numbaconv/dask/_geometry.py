"""Integer geometry of chunked convolutions: which rows of each operand a chunk of the result
needs, and the explicit pads that make a NumPy call on those rows compute exactly that chunk.

One spatial axis is described by the problem's input size ``I``, output size ``O``, stride
``s``, begin pad ``pb`` and dilated kernel size ``dk = (k - 1) * d + 1``: output row ``o``
reads input rows ``o*s - pb + t*d`` (``t = 0..k-1``) that lie in ``0..I-1``; rows outside
are the zero padding. Every padding mode (SAME, VALID, EXPLICIT, auto_pad, output_padding)
has become ``pb`` and the two sizes, so these rules hold for all of them.
"""


def bounds(chunks):
    """Chunk sizes ``(3, 4, 3)`` -> boundaries ``[0, 3, 7, 10]``."""
    out = [0]
    for c in chunks:
        out.append(out[-1] + int(c))
    return out


def sizes(bnds):
    """Boundaries -> chunk sizes (the inverse of :func:`bounds`)."""
    return tuple(b - a for a, b in zip(bnds[:-1], bnds[1:]))


def union(*bnd_lists):
    """The common refinement of several boundary lists of one axis."""
    return sorted(set().union(*map(set, bnd_lists)))


def fwd_out_bounds(in_bnds, O, s, pb):
    """Output-row boundaries that follow input chunks: output row ``o`` goes with the input
    chunk that holds the first row of its window, ``o*s - pb`` (clipped to the ends).
    Empty chunks are dropped."""
    out = {0, O}
    for x in in_bnds[1:-1]:
        out.add(min(max(-(-(x + pb) // s), 0), O))
    return sorted(out)


def bwd_in_bounds(out_bnds, I, s, pb):
    """Input-row boundaries that follow output chunks: output chunk ``[o0, o1)`` owns the
    input rows ``[o0*s - pb, o1*s - pb)`` (clipped). Empty chunks are dropped."""
    out = {0, I}
    for o in out_bnds[1:-1]:
        out.add(min(max(o * s - pb, 0), I))
    return sorted(out)


def fwd_window(o0, o1, I, s, pb, dk):
    """The input rows output rows ``[o0, o1)`` read (forward, and backward weights).

    Returns ``(c0, c1, pad_begin, pad_end)``: the rows ``[c0, c1)`` that exist, and the
    zero rows before and after them; a VALID-style call on those rows with these pads gives
    exactly ``o1 - o0`` output rows. ``None`` when the window lies wholly in the padding
    (the chunk's forward output and its weight-gradient share are zero).
    """
    lo = o0 * s - pb
    hi = (o1 - 1) * s - pb + dk
    c0 = min(max(lo, 0), I)
    c1 = min(max(hi, 0), I)
    if c1 <= c0:
        return None
    return c0, c1, c0 - lo, hi - c1


def bwd_data_window(i0, i1, O, s, pb, dk):
    """The output-gradient rows that reach input rows ``[i0, i1)`` (backward data).

    Returns ``(c0, c1, a, b, pad_begin, pad_end)``: the output-gradient rows ``[c0, c1)``
    that contribute; the input rows ``[a, b)`` inside ``[i0, i1)`` they reach (rows of the
    chunk outside it receive nothing and are zero); and the pads of a call whose input is
    rows ``[a, b)``: input row ``a + j`` of it is ``o*s - pb + t*d`` for ``o = c0 + o'``
    exactly when ``j = o'*s - pad_begin + t*d``. ``None`` when no row contributes.
    """
    olo = -(-(i0 + pb - dk + 1) // s)
    ohi = (i1 - 1 + pb) // s + 1
    c0 = max(olo, 0)
    c1 = min(ohi, O)
    if c1 <= c0:
        return None
    a = max(i0, c0 * s - pb)
    b = min(i1, c1 * s - pb + dk - 1)
    m = c1 - c0
    pad_begin = pb + a - c0 * s
    pad_end = max(0, (m - 1) * s + dk - (b - a) - pad_begin)
    return c0, c1, a, b, pad_begin, pad_end


def explicit_out(size, s, dk, pad_begin, pad_end):
    """Output rows of an EXPLICIT window (docs/contract.md section 4)."""
    return (size + pad_begin + pad_end - dk) // s + 1
