"""The scatter half of backward data as GEMM + col2im (few input channels, many taps).

When a convolution has few input channels per pixel (ResNet's 7x7 stem: 3), backward data
as stride-phase GEMMs has 3 columns per GEMM and runs far from peak. The other
factorisation multiplies first and scatters after (Caffe's and oneDNN's ``col2im`` for
backward data): ``col = dY[rows] @ W^T`` gives, per output pixel, every tap's contribution
to every input channel (``taps * C`` columns: 147 for the stem), and ``col2im`` adds each
of them into the input pixel that tap reads.

``col2im_add`` adds one block of ``col`` (whole images, or consecutive output rows of one
image and output depth) into the rows ``[ih0, ih1)`` of ``dx`` only, so that tasks that own disjoint
row bands of one image never write the same element. Along w, the taps' columns for one
output pixel (``kw * C`` values, tap-major then channel) land on consecutive input pixels
when the w dilation is 1: one contiguous run in both ``col`` and ``dx``, added as a
vectorisable block (21 values for the stem).
"""
import numpy as np

from numbaconv._jit import kernel


# Serial on purpose: each call is one task of the strategy's thread pool.
@kernel(parallel=False)
def col2im_add(col, dx, n0, nn, od0, nd, oh0, nr, ih0, ih1, ksz, stride, dilation, pad):
    """``dx[n, od*s - p + kd*d, oh*s - p + kh*d, ow*s - p + kw*d, c] += col[row,
    ((kd*KH + kh)*KW + kw)*C + c]`` for the block of images ``n0 <= n < n0 + nn``, output
    depths ``od0 <= od < od0 + nd`` and output rows ``oh0 <= oh < oh0 + nr`` (``col``'s rows
    in that C order, ``OW`` per output row), keeping only input rows in ``[ih0, ih1)``."""
    D, H, W, C = dx.shape[1], dx.shape[2], dx.shape[3], dx.shape[4]
    KD, KH, KW = ksz[0], ksz[1], ksz[2]
    OW = col.shape[0] // (nn * nd * nr)
    ncol = col.shape[1]
    dxf = dx.reshape(dx.size)
    cf = col.reshape(col.size)
    for bn in range(nn):
        n = n0 + bn
        for bd in range(nd):
            od = od0 + bd
            for r in range(nr):
                oh = oh0 + r
                crow = ((bn * nd + bd) * nr + r) * OW
                for kd in range(KD):
                    i_d = od * stride[0] - pad[0] + kd * dilation[0]
                    if i_d < 0 or i_d >= D:
                        continue
                    for kh in range(KH):
                        i_h = oh * stride[1] - pad[1] + kh * dilation[1]
                        if i_h < ih0 or i_h >= ih1 or i_h < 0 or i_h >= H:
                            continue
                        row = ((n * D + i_d) * H + i_h) * W
                        t0 = (kd * KH + kh) * KW
                        for ow in range(OW):
                            iw0 = ow * stride[2] - pad[2]
                            cbase = (crow + ow) * ncol + t0 * C
                            if dilation[2] == 1:
                                # taps kw0..kw1 hit input pixels iw0+kw0 .. iw0+kw1-1: a run
                                kw0 = max(0, -iw0)
                                kw1 = min(KW, W - iw0)
                                if kw1 <= kw0:
                                    continue
                                e = np.uint64((row + iw0 + kw0) * C)
                                o = np.uint64(cbase + kw0 * C)
                                for i in range(np.uint64((kw1 - kw0) * C)):
                                    dxf[e + i] += cf[o + i]
                            else:
                                for kw in range(KW):
                                    iw = iw0 + kw * dilation[2]
                                    if iw < 0 or iw >= W:
                                        continue
                                    e = np.uint64((row + iw) * C)
                                    o = np.uint64(cbase + kw * C)
                                    for c in range(np.uint64(C)):
                                        dxf[e + c] += cf[o + c]


@kernel(parallel=False)
def zero_rows(dx, n0, nn, ih0, ih1):
    """``dx[n0:n0+nn, :, ih0:ih1] = 0``."""
    for n in range(n0, n0 + nn):
        for i_d in range(dx.shape[1]):
            for i_h in range(ih0, ih1):
                for i_w in range(dx.shape[3]):
                    for c in range(dx.shape[4]):
                        dx[n, i_d, i_h, i_w, c] = 0
