"""TF32 tensor-core implicit GEMMs fed by ``cp.async``: the ``gemm[tf32-async]`` entry,
for problems whose channels (the axes its 16-byte copies run along) are multiples of 4.

The GEMMs are those of :mod:`numbaconv.kernels.cuda.gemm` (same grids, same split-K
partials, same results); what differs is how the operands reach the tensor cores:

* **No register staging.** Each K slice (16 deep: two ``m16n8k8`` steps) is copied from
  global to shared memory by ``cp.async`` in 16-byte chunks (``LDGSTS.128``): four
  consecutive elements of the operand's contiguous axis, zero-filled outside the image or
  the matrix (``src-size`` 0). Three slices are in flight where three stages fit in 48 KiB
  of static shared memory, else two (:func:`stages`); one barrier per slice.
* **Each operand keeps its memory layout.** An operand whose contiguous axis is K
  (forward's ``x``; backward data's ``dy`` and filter) is stored ``[rows][16]``, each
  row's four chunks XOR-swizzled by ``(row >> 1) & 3``, and its fragments are read by
  ``ldmatrix.x4`` (an ``m8n8`` matrix of 16-bit elements is 8 rows of four 32-bit words:
  lane ``(g, t)`` receives word ``t`` of row ``g``, exactly a TF32 fragment), one
  instruction per m16 tile (A) or pair of n8 tiles (B) and k8 step, straight into the
  ``mma.sync`` operand registers; the swizzle puts the 8 rows of each matrix on distinct
  banks. An operand whose contiguous axis is M or N (forward's filter, the weight
  gradient's ``x`` and ``dy``) is stored ``[16][rows + 8]`` and read one fragment element
  per ``LDS`` (K rows 8 words apart modulo 32: the 32 lanes hit 32 banks).
* **TF32 rounding in shared memory.** A thread rounds the chunks it copied in place (its
  own ``cp.async`` writes are visible to it after ``cp.async.wait_group``), before the
  slice's barrier: half a TF32 unit is added to the bits of every finite value, and the
  tensor cores read the top 19 bits of a TF32 operand, so the product sees the value
  rounded to nearest with ties away from zero -- ``cvt.rna.tf32.f32``, as the
  register-staged kernels round (checked on a GPU in ``tests/test_cuda_tf32.py``'s
  device test and the bench's rows); Inf and NaN pass unchanged.
* Each thread's shared-memory offsets (its chunks, its fragments) are worked out once;
  the stage counters step round; the slice's source offsets advance by counters, with
  divisions by compile-time constants only where a new tap (or, for the weight gradient,
  each chunk's pixel) is decoded.

A copy of 16 bytes needs 16-byte aligned addresses: the chunk offsets are multiples of 4
elements when the channel counts are (:func:`reason`), and the kernel tests its operands'
base addresses once: where one is not 16-byte aligned (a view into a larger array) the
block takes a branch that copies every chunk as four 4-byte ``cp.async``.

Under the CUDA simulator the copies are plain assignments, ``commit``/``wait`` do nothing,
rounding is :func:`..gemm.tf32_round_py`, and a thread's multiply reads its own rows and
columns of the slice from shared memory through the same layout functions (a lane
cannot see another's registers there).
"""
import functools

from numba import cuda, float32, int32, int64, uint32, uint64

from . import _ptx
from ._ptx import ALIGN, LAUNCH_BOUNDS, index_type

#: K per slice (two m16n8k8 steps).
BK = 16

SIM = _ptx.SIM

# The intrinsics (inline PTX; :mod:`._ptx` generates their code): ``cp_async16(dst, di, src,
# si, n)`` copies ``src[si:si+4]`` to the shared ``dst[di:di+4]`` asynchronously (the first
# ``n`` bytes, 16 or 0; zeros after them), ``cp_async4`` one element (``n`` 4 or 0);
# ``cp_commit()`` closes a group of copies; ``_wait_group(n)()`` waits until at most ``n``
# of this thread's groups are pending; ``low_bits(a)``: the low 4 bits of ``a``'s address;
# ``ldsm4(a, i)``: ``ldmatrix.x4`` with this lane's row at ``a[i]``; ``load16``/``store16``
# 16-byte shared loads and stores; ``mma_tf32`` one ``m16n8k8`` TF32 product;
# ``tf32_round_hi`` rounds for the tensor cores (:func:`._ptx.tf32_round_hi`).
if SIM:
    load16, store16 = _ptx.load16_py, _ptx.store16_py
    tf32_round = _ptx.tf32_round_py
    mma_tf32 = ldsm4 = tf32_round_hi = None

    def cp_async16(dst, di, src, si, n):
        for q in range(4):
            dst[di + q] = src[si + q] if n else float32(0)

    def cp_async4(dst, di, src, si, n):
        dst[di] = src[si] if n else float32(0)

    def cp_commit():
        pass

    def _wait_group(n):
        def wait():
            pass
        return wait

    def low_bits(a):
        # the simulated array's NumPy data: a view into a larger array may be misaligned
        return int(a.ctypes.data) & 15
else:
    from numba.cuda.extending import intrinsic

    @intrinsic
    def load16(typingctx, a, i):
        return _ptx.vector_load(16, a, i)

    @intrinsic
    def store16(typingctx, a, i, v):
        return _ptx.store16(a, i, v)

    @intrinsic
    def mma_tf32(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        return _ptx.mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)

    @intrinsic
    def tf32_round_hi(typingctx, v):
        return _ptx.tf32_round_hi(v)

    @intrinsic
    def cp_async16(typingctx, dst, di, src, si, n):
        return _ptx.cp_async(16, dst, di, src, si, n)

    @intrinsic
    def cp_async4(typingctx, dst, di, src, si, n):
        return _ptx.cp_async(4, dst, di, src, si, n)

    @intrinsic
    def cp_commit(typingctx):
        return _ptx.statement("cp.async.commit_group;")

    def _wait_group(n):
        @intrinsic
        def wait(typingctx):
            return _ptx.statement(f"cp.async.wait_group {n};")
        return wait

    @intrinsic
    def low_bits(typingctx, a):
        return _ptx.low_bits(a)

    @intrinsic
    def ldsm4(typingctx, a, i):
        return _ptx.ldmatrix_x4(a, i)


#: Which operands are K-contiguous in global memory (and so in shared memory), per
#: direction: (A, B).
K_CONTIGUOUS = {"fwd": (True, False), "bwd_d": (True, True), "bwd_w": (False, False)}
#: Words an MN-contiguous tile's rows are padded by (16-byte aligned; the 4 K rows that a
#: warp's fragment loads touch then start 8 banks apart).
MN_PAD = 8


def tile_words(r, kc):
    """Words of one stage of an operand tile of ``r`` rows (M or N)."""
    return r * BK if kc else BK * (r + MN_PAD)


def stages(direction, bm, bn):
    """Slices in flight: 3 where three stages fit in 48 KiB of static shared memory, else
    2."""
    a_kc, b_kc = K_CONTIGUOUS[direction]
    words = tile_words(bm, a_kc) + tile_words(bn, b_kc)
    return 3 if 3 * words * 4 <= 48 * 1024 else 2


def shared_bytes(direction, bm, bn, nstages=None):
    a_kc, b_kc = K_CONTIGUOUS[direction]
    s = nstages or stages(direction, bm, bn)
    return s * (tile_words(bm, a_kc) + tile_words(bn, b_kc)) * 4


def reason(direction, geo, bm, bn, tm, tn):
    """None where these kernels take the problem ``geo`` (the 22-int geometry) with tile
    ``(bm, bn, tm, tn)``, else why not: the channels that the 16-byte chunks run along
    must be multiples of 4, the tile whole m16n8k8 warp tiles (pairs of n8 tiles where B
    is K-contiguous), its chunks a whole number per thread."""
    if not _ptx.VECTOR:
        return ("numba's own CUDA target declares no aligned shared arrays: these kernels "
                "need numba-cuda (the cuda12/cuda13 extras)")
    mb, g, icg, ocg = geo[:4]
    need = {"fwd": (("input", icg), ("output", ocg)), "bwd_d": (("output", ocg),),
            "bwd_w": (("input", icg), ("output", ocg))}[direction]
    for name, c in need:
        if c % 4:
            return f"{name} channels per group ({c}) are no multiple of 4 (16-byte chunks)"
    nt = (bm // tm) * (bn // tn)
    if (tm % 2 or tn % 4 or bm % (8 * tm) or bn % (4 * tn) or nt % 32
            or (bm * 4) % nt or (bn * 4) % nt):
        return (f"tile {bm}x{bn} {tm}x{tn} is no whole number of m16n8k8 warp tiles whose "
                f"16-byte chunks are a whole number per thread ({nt} threads)")
    if shared_bytes(direction, bm, bn) > 48 * 1024:
        return f"two stages of a {bm}x{bn} tile exceed 48 KiB of shared memory"
    return None


@functools.lru_cache(maxsize=None)
def core(bm, bn, tm, tn, a_kc, b_kc):
    """The tile's layout and multiply: a dict of constants and inline device functions.

    ``a_kc``/``b_kc``: whether A (B) is K-contiguous (``[rows][16]``, each row's four
    16-byte chunks XOR-swizzled by ``(row >> 1) & 3``, read by ``ldmatrix``) or
    MN-contiguous (``[16][rows + MN_PAD]``, read one fragment element at a time). Keys:
    ``nt`` threads; ``asz``/``bsz`` words per stage; ``anp``/``bnp`` chunks per thread per
    slice; ``a_chunk(e)``/``b_chunk(e)`` -> (row or K row, chunk) of chunk ``e`` of a
    slice; ``a_put(r, c)``/``b_put(r, c)`` its word offset in a stage;
    ``lane_offsets(tid, lo)``; ``mma(As, Bs, sa, sb, acc, lo)`` the slice's multiply
    (``sa``/``sb`` the stage's offsets); ``row_of(a, tid)``, ``col_of(b, tid)``: the
    block-tile row (column) of accumulator row ``a`` (column ``b``) of thread ``tid``.
    """
    nt = (bm // tm) * (bn // tn)
    MI, NI = tm // 2, tn // 2
    WM, WN = 8 * tm, 4 * tn
    WXN = bn // WN
    TN = tn
    ASZ, BSZ = tile_words(bm, a_kc), tile_words(bn, b_kc)
    FA, FB = 4 * MI, 2 * NI
    RPA, RPB = bm + MN_PAD, bn + MN_PAD
    ANP, BNP = bm * 4 // nt, bn * 4 // nt
    ACH, BCH = bm // 4, bn // 4  # chunks per K row of an MN-contiguous tile
    dj = functools.partial(cuda.jit, device=True, inline="always")

    def kc_chunk(e):
        return e // 4, e % 4

    def a_mn_chunk(e):
        return e // ACH, e % ACH

    def b_mn_chunk(e):
        return e // BCH, e % BCH

    def kc_put(r, c):
        return r * BK + 4 * (c ^ ((r >> 1) & 3))

    def a_mn_put(k, c):
        return k * RPA + 4 * c

    def b_mn_put(k, c):
        return k * RPB + 4 * c

    def a_word(k, r):
        # the word of A's element (k, row r) in a stage
        if a_kc:
            return r * BK + 4 * ((k // 4) ^ ((r >> 1) & 3)) + k % 4
        return k * RPA + r

    def b_word(k, c):
        if b_kc:
            return c * BK + 4 * ((k // 4) ^ ((c >> 1) & 3)) + k % 4
        return k * RPB + c

    def row_of(a, tid):
        w = tid // 32
        return (w // WXN) * WM + 16 * (a // 2) + 8 * (a % 2) + (tid % 32) // 4

    def col_of(b, tid):
        w = tid // 32
        return (w % WXN) * WN + 8 * (b // 2) + 2 * (tid % 4) + b % 2

    def lane_offsets(tid, lo):
        """The thread's fragment offsets within a stage, per k8 step s: lo[s] (A),
        lo[2 + s] (B)."""
        w = tid // 32
        lane = tid % 32
        wm0, wn0, g, t = (w // WXN) * WM, (w % WXN) * WN, lane // 4, lane % 4
        for s in range(2):
            if a_kc:
                rin = 8 * ((lane // 8) % 2) + lane % 8
                lo[s] = (wm0 + rin) * BK + 4 * ((2 * s + lane // 16) ^ ((rin >> 1) & 3))
            else:
                lo[s] = (8 * s + t) * RPA + wm0 + g
            if b_kc:
                rin = 8 * (lane // 16) + lane % 8
                lo[2 + s] = (wn0 + rin) * BK + 4 * ((2 * s + (lane // 8) % 2)
                                                     ^ ((rin >> 1) & 3))
            else:
                lo[2 + s] = (8 * s + t) * RPB + wn0 + g

    if SIM:
        # (the simulator runs this in Python: the word functions are called as plain
        # Python functions, not as simulated device functions, one call per product)
        def mma(As, Bs, sa, sb, acc, lo):
            tid = cuda.threadIdx.x
            w = tid // 32
            wm0, wn0, g, t = (w // WXN) * WM, (w % WXN) * WN, (tid % 32) // 4, tid % 4
            for a in range(tm):
                r = wm0 + 16 * (a // 2) + 8 * (a % 2) + g
                for b in range(tn):
                    c = wn0 + 8 * (b // 2) + 2 * t + b % 2
                    v = acc[a * TN + b]
                    for k in range(BK):
                        v += As[sa + a_word(k, r)] * Bs[sb + b_word(k, c)]
                    acc[a * TN + b] = v
    else:
        def mma(As, Bs, sa, sb, acc, lo):
            fa = cuda.local.array(FA, float32)   # [i][r]: a_r of m16 tile i
            fb = cuda.local.array(FB, float32)   # [j][r]: b_r of n8 tile j
            for s in range(2):
                if a_kc:
                    for i in range(MI):
                        v = ldsm4(As, sa + lo[s] + 256 * i)
                        for r in range(4):
                            fa[i * 4 + r] = v[r]
                else:
                    for i in range(MI):
                        for r in range(4):
                            fa[i * 4 + r] = As[uint64(sa + lo[s] + 4 * (r // 2) * RPA
                                                      + 16 * i + 8 * (r % 2))]
                if b_kc:
                    for jp in range(NI // 2):
                        v = ldsm4(Bs, sb + lo[2 + s] + 256 * jp)
                        fb[(2 * jp) * 2] = v[0]
                        fb[(2 * jp) * 2 + 1] = v[1]
                        fb[(2 * jp + 1) * 2] = v[2]
                        fb[(2 * jp + 1) * 2 + 1] = v[3]
                else:
                    for j in range(NI):
                        for r in range(2):
                            fb[j * 2 + r] = Bs[uint64(sb + lo[2 + s] + 4 * r * RPB + 8 * j)]
                for i in range(MI):
                    for j in range(NI):
                        c0 = (2 * i) * TN + 2 * j
                        c2 = c0 + TN
                        d = mma_tf32(fa[i * 4], fa[i * 4 + 1], fa[i * 4 + 2], fa[i * 4 + 3],
                                     fb[j * 2], fb[j * 2 + 1],
                                     acc[c0], acc[c0 + 1], acc[c2], acc[c2 + 1])
                        acc[c0] = d[0]
                        acc[c0 + 1] = d[1]
                        acc[c2] = d[2]
                        acc[c2 + 1] = d[3]

    if SIM:
        def rnd_chunk(buf, i):
            # round the 4 words at buf[i] to TF32 in place
            for q in range(4):
                buf[i + q] = tf32_round(buf[i + q])
    else:
        def rnd_chunk(buf, i):
            v = load16(buf, i)
            store16(buf, i, (tf32_round_hi(v[0]), tf32_round_hi(v[1]), tf32_round_hi(v[2]),
                             tf32_round_hi(v[3])))

    return dict(nt=nt, asz=ASZ, bsz=BSZ, anp=ANP, bnp=BNP,
                a_chunk=dj(kc_chunk if a_kc else a_mn_chunk),
                b_chunk=dj(kc_chunk if b_kc else b_mn_chunk),
                a_put=dj(kc_put if a_kc else a_mn_put),
                b_put=dj(kc_put if b_kc else b_mn_put),
                mma=dj(mma), row_of=dj(row_of), col_of=dj(col_of),
                lane_offsets=dj(lane_offsets), rnd_chunk=dj(rnd_chunk))


def launch_bounds(threads):
    """Two blocks per SM for 256 threads (128 registers per thread), as the FFMA GEMMs."""
    return threads, max(1, 65536 // (128 * threads))


def _kernel(fn, threads):
    if not LAUNCH_BOUNDS:
        return cuda.jit(fn)
    return cuda.jit(fn, launch_bounds=launch_bounds(threads))


def _issue():
    """``issue(As, Bs, a, b, sa, sb, adst, bdst, asrc, bsrc, al)``: this thread's chunks of
    a slice, ``a[asrc[p]:asrc[p]+4]`` to ``As[sa + adst[p]:...]`` (zeros where ``asrc[p]``
    is negative), B's likewise; one 16-byte ``cp.async`` per chunk where the operands are
    16-byte aligned (``al``, the same for the whole block: a branch, not predicated
    copies), else four 4-byte ones."""
    def issue(As, Bs, a, b, sa, sb, adst, bdst, asrc, bsrc, al):
        if al:
            for p in range(adst.shape[0]):
                v = asrc[p]
                cp_async16(As, sa + adst[p], a, v if v >= 0 else 0, 16 if v >= 0 else 0)
            for p in range(bdst.shape[0]):
                v = bsrc[p]
                cp_async16(Bs, sb + bdst[p], b, v if v >= 0 else 0, 16 if v >= 0 else 0)
        else:
            for p in range(adst.shape[0]):
                v = asrc[p]
                for q in range(4):
                    cp_async4(As, sa + adst[p] + q, a, v + q if v >= 0 else 0,
                              4 if v >= 0 else 0)
            for p in range(bdst.shape[0]):
                v = bsrc[p]
                for q in range(4):
                    cp_async4(Bs, sb + bdst[p] + q, b, v + q if v >= 0 else 0,
                              4 if v >= 0 else 0)
    return cuda.jit(device=True, inline="always")(issue)


_ISSUE = _issue()
#: per stage count S: wait until slice it + 1 has landed (at most S - 2 younger groups
#: pending)
_WAITS = {2: _wait_group(0), 3: _wait_group(1)}


@functools.lru_cache(maxsize=None)
def _advance(bm, bn, tm, tn, a_kc, b_kc, nstages):
    """``sm, sr = advance(As, Bs, acc, lo, adst, bdst, it, qb, sm, sr)``: the rest of
    iteration ``it`` after its copies were issued (see the pipeline above): commit them,
    multiply slice ``it`` out of stage ``sm`` (``it >= qb``), wait for slice ``it + 1`` and
    round this thread's chunks of it in stage ``sr`` (``adst``/``bdst``: their offsets),
    barrier; the stage counters stepped on."""
    C = core(bm, bn, tm, tn, a_kc, b_kc)
    ASZ, BSZ, ANP, BNP = C["asz"], C["bsz"], C["anp"], C["bnp"]
    mma, rnd_chunk = C["mma"], C["rnd_chunk"]
    S = nstages
    cp_wait = _WAITS[S]

    def advance(As, Bs, acc, lo, adst, bdst, it, qb, sm, sr):
        cp_commit()
        if it >= qb:
            mma(As, Bs, sm * ASZ, sm * BSZ, acc, lo)
            sm = sm + 1 if sm < S - 1 else 0
        if it + 1 >= qb:
            cp_wait()
            for p in range(ANP):
                rnd_chunk(As, sr * ASZ + adst[p])
            for p in range(BNP):
                rnd_chunk(Bs, sr * BSZ + bdst[p])
            sr = sr + 1 if sr < S - 1 else 0
            cuda.syncthreads()
        return sm, sr

    return cuda.jit(device=True, inline="always")(advance)
ALIGNED = ALIGN is not None

# The three kernels share one pipeline (written out in each):
#
#   prologue: slices qb .. qb+S-2 issued (one commit group each, empty past qe)
#   iteration it (qb-S+1 <= it < qe):
#       issue slice it+S-1 into stage sl (the stage slice it-1 used); commit
#       multiply slice it (it >= qb) out of stage sm
#       wait until at most S-2 groups are pending (slice it+1 has landed for this thread),
#       round this thread's chunks of slice it+1 (stage sr) to TF32, barrier
#
# so one barrier per slice separates a stage's multiply from the copies that refill it and
# the rounding of a slice from its multiply. The stage counters step round modulo S; a
# thread's shared-memory offsets (its chunks, its fragments) are worked out once.


@functools.lru_cache(maxsize=512)
def fwd_tf32(bm, bn, tm, tn, geo, nsplit=1, nstages=None):
    """Forward, as :func:`..gemm.fwd_gemm` (same grid, result and split-K partials): ``A``
    is ``x`` (rows: output pixels, K-contiguous: channels), ``B`` the filter (``[K][N]``,
    N-contiguous)."""
    MB, G, ICG, OCG, ID, IH, IW, KD, KH, KW, OD, OH, OW, SD, SH, SW, DD, DH, DW, PD, PH, PW = geo
    IC, OC = G * ICG, G * OCG
    M = MB * OD * OH * OW
    NSL = -(-ICG // BK)
    Q = KD * KH * KW * NSL
    YS = M * OC
    C = core(bm, bn, tm, tn, True, False)
    nt, ASZ, BSZ, ANP, BNP = C["nt"], C["asz"], C["bsz"], C["anp"], C["bnp"]
    a_chunk, b_chunk, a_put, b_put = C["a_chunk"], C["b_chunk"], C["a_put"], C["b_put"]
    row_of, col_of = C["row_of"], C["col_of"]
    lane_offsets = C["lane_offsets"]
    UM = uint32 if M + bm < 2 ** 32 else uint64
    IX = index_type(MB * ID * IH * IW * IC, KD * KH * KW * ICG * OC, nsplit * YS)
    TMN = tm * tn
    S = nstages or stages("fwd", bm, bn)
    SAZ, SBZ = S * ASZ, S * BSZ
    advance = _advance(bm, bn, tm, tn, True, False, S)
    issue = _ISSUE

    def fwd_tf32(x, w, y):
        if ALIGNED:
            As = cuda.shared.array(SAZ, float32, alignment=16)
            Bs = cuda.shared.array(SBZ, float32, alignment=16)
        else:
            As = cuda.shared.array(SAZ, float32)
            Bs = cuda.shared.array(SBZ, float32)
        acc = cuda.local.array(TMN, float32)
        lo = cuda.local.array(4, int32)
        aoff = cuda.local.array(ANP, IX)     # per A chunk: its pixel's offset (-1: none)
        adst = cuda.local.array(ANP, int32)  # ... and its place in a stage
        asrc = cuda.local.array(ANP, IX)     # this slice's chunk sources (-1: zeros)
        bnow = cuda.local.array(BNP, IX)
        bsrc = cuda.local.array(BNP, IX)     # per B chunk: k * OC + column (-1: past N)
        bk_ = cuda.local.array(BNP, int32)
        bdst = cuda.local.array(BNP, int32)
        tid = cuda.threadIdx.x
        m0 = cuda.blockIdx.x * bm
        n0 = cuda.blockIdx.y * bn
        gi = cuda.blockIdx.z // nsplit
        sp = cuda.blockIdx.z % nsplit
        qb = Q * sp // nsplit
        qe = Q * (sp + 1) // nsplit
        xc = gi * ICG
        wc = gi * OCG + n0
        al = (low_bits(x) | low_bits(w)) == 0
        lane_offsets(tid, lo)
        akc = 4 * (tid % 4)
        for p in range(ANP):
            row, kc = a_chunk(tid + p * nt)
            adst[p] = a_put(row, kc)
        for p in range(BNP):
            k, c = b_chunk(tid + p * nt)
            bdst[p] = b_put(k, c)
            bk_[p] = k
            bsrc[p] = k * OC + wc + 4 * c if n0 + 4 * c < OCG else -1
        for i in range(TMN):
            acc[i] = float32(0)
        lt = qb // NSL          # the next slice to issue: tap lt, channels lc...
        lc = (qb - lt * NSL) * BK
        fresh = True
        wt = 0
        sl = 0
        sm = 0
        sr = 0
        for it in range(qb - S + 1, qe):
            if it + S - 1 < qe:
                if fresh or lc == 0:
                    tq = lt // KW
                    t_w = lt - tq * KW
                    t_h = tq % KH
                    t_d = tq // KH
                    for p in range(ANP):
                        row, kc = a_chunk(tid + p * nt)
                        m = m0 + row
                        aoff[p] = -1
                        if m < M:
                            um = UM(m)
                            o_w = int64(um % UM(OW))
                            ur = um // UM(OW)
                            o_h = int64(ur % UM(OH))
                            ur = ur // UM(OH)
                            i_d = int64(ur % UM(OD)) * SD - PD + t_d * DD
                            i_h = o_h * SH - PH + t_h * DH
                            i_w = o_w * SW - PW + t_w * DW
                            if (i_d >= 0 and i_d < ID and i_h >= 0 and i_h < IH
                                    and i_w >= 0 and i_w < IW):
                                aoff[p] = (((int64(ur // UM(OD)) * ID + i_d) * IH + i_h)
                                           * IW + i_w) * IC + xc + akc
                    wt = lt * ICG * OC
                    fresh = False
                for p in range(ANP):
                    ok = aoff[p] >= 0 and lc + akc < ICG
                    asrc[p] = IX(aoff[p] + lc) if ok else -1
                for p in range(BNP):
                    ok = bsrc[p] >= 0 and lc + bk_[p] < ICG
                    bnow[p] = IX(wt + lc * OC + bsrc[p]) if ok else -1
                issue(As, Bs, x, w, sl * ASZ, sl * BSZ, adst, bdst, asrc, bnow, al)
                lc += BK
                if lc >= ICG:
                    lc = 0
                    lt += 1
            sl = sl + 1 if sl < S - 1 else 0
            sm, sr = advance(As, Bs, acc, lo, adst, bdst, it, qb, sm, sr)
        for a in range(tm):
            m = m0 + row_of(a, tid)
            if m < M:
                for b in range(tn):
                    col = col_of(b, tid)
                    if n0 + col < OCG:
                        y[uint64(sp * YS + m * OC + wc + col)] = acc[a * tn + b]

    return _kernel(fwd_tf32, nt)


@functools.lru_cache(maxsize=512)
def bwd_d_tf32(bm, bn, tm, tn, geo, nsplit=1, nstages=None):
    """Backward data by stride phase, as :func:`..gemm.bwd_d_gemm`: ``A`` is ``dy`` (rows:
    the phase's input pixels, K-contiguous: output channels), ``B`` the filter read as
    ``[N = input channel][K = output channel]`` (K-contiguous)."""
    MB, G, ICG, OCG, ID, IH, IW, KD, KH, KW, OD, OH, OW, SD, SH, SW, DD, DH, DW, PD, PH, PW = geo
    IC, OC = G * ICG, G * OCG
    NPH = SD * SH * SW
    NSL = -(-OCG // BK)
    XS = MB * ID * IH * IW * IC
    C = core(bm, bn, tm, tn, True, True)
    nt, ASZ, BSZ, ANP, BNP = C["nt"], C["asz"], C["bsz"], C["anp"], C["bnp"]
    a_chunk, b_chunk, a_put, b_put = C["a_chunk"], C["b_chunk"], C["a_put"], C["b_put"]
    row_of, col_of = C["row_of"], C["col_of"]
    lane_offsets = C["lane_offsets"]
    IX = index_type(MB * OD * OH * OW * OC, KD * KH * KW * ICG * OC, nsplit * XS)
    TMN = tm * tn
    S = nstages or stages("bwd_d", bm, bn)
    SAZ, SBZ = S * ASZ, S * BSZ
    advance = _advance(bm, bn, tm, tn, True, True, S)
    issue = _ISSUE
    PHASES = _ptx.phase_table(geo)

    def bwd_d_tf32(dy, w, dx):
        if ALIGNED:
            As = cuda.shared.array(SAZ, float32, alignment=16)
            Bs = cuda.shared.array(SBZ, float32, alignment=16)
        else:
            As = cuda.shared.array(SAZ, float32)
            Bs = cuda.shared.array(SBZ, float32)
        acc = cuda.local.array(TMN, float32)
        lo = cuda.local.array(4, int32)
        apix = cuda.local.array(ANP, IX)
        abd = cuda.local.array(ANP, IX)
        abh = cuda.local.array(ANP, IX)
        abw = cuda.local.array(ANP, IX)
        aoff = cuda.local.array(ANP, IX)
        adst = cuda.local.array(ANP, int32)
        bsrc = cuda.local.array(BNP, IX)
        bdst = cuda.local.array(BNP, int32)
        asrc = cuda.local.array(ANP, IX)
        bnow = cuda.local.array(BNP, IX)
        tid = cuda.threadIdx.x
        m0 = cuda.blockIdx.x * bm
        n0 = cuda.blockIdx.y * bn
        sp = cuda.blockIdx.z % nsplit
        zz = cuda.blockIdx.z // nsplit
        gi = zz // NPH
        q = zz % NPH
        q_w = q % SW
        q_h = (q // SW) % SH
        q_d = q // (SW * SH)
        # the phase's taps and pixels per axis (_ptx.phase_table, worked out on the host)
        phs = cuda.local.array((3, 7), int64)
        for a in range(3):
            for f in range(7):
                phs[a, f] = PHASES[q][a * 7 + f]
        t0d, tsd, ntd, c0d, osd, j0d, njd = phs[0, 0], phs[0, 1], phs[0, 2], phs[0, 3], phs[0, 4], phs[0, 5], phs[0, 6]
        t0h, tsh, nth, c0h, osh, j0h, njh = phs[1, 0], phs[1, 1], phs[1, 2], phs[1, 3], phs[1, 4], phs[1, 5], phs[1, 6]
        t0w, tsw, ntw, c0w, osw, j0w, njw = phs[2, 0], phs[2, 1], phs[2, 2], phs[2, 3], phs[2, 4], phs[2, 5], phs[2, 6]
        M = MB * njd * njh * njw
        if m0 >= M:  # uniform over the block: phases differ in size
            return
        Q = ntd * nth * ntw * NSL
        qb = Q * sp // nsplit
        qe = Q * (sp + 1) // nsplit
        yc = gi * OCG
        al = (low_bits(dy) | low_bits(w)) == 0
        lane_offsets(tid, lo)
        akc = 4 * (tid % 4)
        for i in range(TMN):
            acc[i] = float32(0)
        for p in range(ANP):
            row, kc = a_chunk(tid + p * nt)
            adst[p] = a_put(row, kc)
            m = m0 + row
            apix[p] = -1
            if m < M:
                j_w = m % njw
                r = m // njw
                j_h = r % njh
                r = r // njh
                apix[p] = (r // njd) * OD
                abd[p] = j0d + r % njd - c0d
                abh[p] = j0h + j_h - c0h
                abw[p] = j0w + j_w - c0w
        for p in range(BNP):
            nn, kc = b_chunk(tid + p * nt)
            bdst[p] = b_put(nn, kc)
            bsrc[p] = (n0 + nn) * OC + yc + akc if n0 + nn < ICG else -1
        u = qb // NSL
        k0 = (qb % NSL) * BK
        u_w = 0
        u_h = 0
        u_d = 0
        if ntw > 0 and nth > 0:
            u_w = u % ntw
            u_h = (u // ntw) % nth
            u_d = u // (ntw * nth)
        newtap = True
        wt = 0
        sl = 0
        sm = 0
        sr = 0
        for it in range(qb - S + 1, qe):
            if it + S - 1 < qe:
                if newtap:
                    for p in range(ANP):
                        aoff[p] = -1
                        if apix[p] >= 0:
                            o_d = abd[p] - u_d * osd
                            o_h = abh[p] - u_h * osh
                            o_w = abw[p] - u_w * osw
                            if (o_d >= 0 and o_d < OD and o_h >= 0 and o_h < OH
                                    and o_w >= 0 and o_w < OW):
                                aoff[p] = ((((apix[p] + o_d) * OH + o_h) * OW + o_w) * OC
                                           + yc + akc)
                    wt = (((t0d + u_d * tsd) * KH + t0h + u_h * tsh) * KW + t0w
                          + u_w * tsw) * ICG * OC
                    newtap = False
                okk = k0 + akc < OCG
                for p in range(ANP):
                    ok = okk and aoff[p] >= 0
                    asrc[p] = IX(aoff[p] + k0) if ok else -1
                for p in range(BNP):
                    ok = okk and bsrc[p] >= 0
                    bnow[p] = IX(wt + k0 + bsrc[p]) if ok else -1
                issue(As, Bs, dy, w, sl * ASZ, sl * BSZ, adst, bdst, asrc, bnow, al)
                k0 += BK
                if k0 >= OCG:
                    k0 = 0
                    newtap = True
                    u_w += 1
                    if u_w == ntw:
                        u_w = 0
                        u_h += 1
                        if u_h == nth:
                            u_h = 0
                            u_d += 1
            sl = sl + 1 if sl < S - 1 else 0
            sm, sr = advance(As, Bs, acc, lo, adst, bdst, it, qb, sm, sr)
        for a in range(tm):
            m = m0 + row_of(a, tid)
            if m < M:
                j_w = m % njw
                r = m // njw
                j_h = r % njh
                r = r // njh
                i_d = (j0d + r % njd) * SD + q_d - PD
                n = r // njd
                i_h = (j0h + j_h) * SH + q_h - PH
                i_w = (j0w + j_w) * SW + q_w - PW
                base = sp * XS + (((n * ID + i_d) * IH + i_h) * IW + i_w) * IC + gi * ICG + n0
                for b in range(tn):
                    col = col_of(b, tid)
                    if n0 + col < ICG:
                        dx[uint64(base + col)] = acc[a * tn + b]

    return _kernel(bwd_d_tf32, nt)


@functools.lru_cache(maxsize=512)
def bwd_w_tf32(bm, bn, tm, tn, geo, nsplit=1, nstages=None):
    """Weight gradient, as :func:`..gemm.bwd_w_gemm` (same grid and partials): ``A`` is
    ``x`` read as ``[M = (tap, input channel)][K = output pixel]`` (M-contiguous), ``B``
    is ``dy`` (``[K = output pixel][N = output channel]``, N-contiguous). K runs over the
    flat output pixels in slices of 16 (split ``j`` of ``nsplit`` takes slices
    ``[Q*j // nsplit, Q*(j+1) // nsplit)``); each A chunk's pixel is decoded by divisions
    by constants."""
    MB, G, ICG, OCG, ID, IH, IW, KD, KH, KW, OD, OH, OW, SD, SH, SW, DD, DH, DW, PD, PH, PW = geo
    IC, OC = G * ICG, G * OCG
    M = KD * KH * KW * ICG
    NPIX = MB * OD * OH * OW
    Q = -(-NPIX // BK)
    WS = M * OC
    C = core(bm, bn, tm, tn, False, False)
    nt, ASZ, BSZ, ANP, BNP = C["nt"], C["asz"], C["bsz"], C["anp"], C["bnp"]
    a_chunk, b_chunk, a_put, b_put = C["a_chunk"], C["b_chunk"], C["a_put"], C["b_put"]
    row_of, col_of = C["row_of"], C["col_of"]
    lane_offsets = C["lane_offsets"]
    UP = uint32 if NPIX + BK < 2 ** 32 else uint64
    IX = index_type(MB * ID * IH * IW * IC, NPIX * OC, nsplit * WS)
    TMN = tm * tn
    S = nstages or stages("bwd_w", bm, bn)
    SAZ, SBZ = S * ASZ, S * BSZ
    advance = _advance(bm, bn, tm, tn, False, False, S)
    issue = _ISSUE

    def bwd_w_tf32(x, dy, part):
        if ALIGNED:
            As = cuda.shared.array(SAZ, float32, alignment=16)
            Bs = cuda.shared.array(SBZ, float32, alignment=16)
        else:
            As = cuda.shared.array(SAZ, float32)
            Bs = cuda.shared.array(SBZ, float32)
        acc = cuda.local.array(TMN, float32)
        lo = cuda.local.array(4, int32)
        # per A chunk: its channel in x (-1: past M), tap offsets t*d - p, K row, place
        lc = cuda.local.array(ANP, IX)
        ltd = cuda.local.array(ANP, IX)
        lth = cuda.local.array(ANP, IX)
        ltw = cuda.local.array(ANP, IX)
        ak = cuda.local.array(ANP, int32)
        adst = cuda.local.array(ANP, int32)
        asrc = cuda.local.array(ANP, IX)
        bnow = cuda.local.array(BNP, IX)
        # per B chunk: K row * OC + column (-1: past N), K row, place
        bsrc = cuda.local.array(BNP, IX)
        bk_ = cuda.local.array(BNP, int32)
        bdst = cuda.local.array(BNP, int32)
        tid = cuda.threadIdx.x
        m0 = cuda.blockIdx.x * bm
        n0 = cuda.blockIdx.y * bn
        gi = cuda.blockIdx.z // nsplit
        sp = cuda.blockIdx.z % nsplit
        qb = Q * sp // nsplit
        qe = Q * (sp + 1) // nsplit
        yc = gi * OCG + n0
        al = (low_bits(x) | low_bits(dy)) == 0
        lane_offsets(tid, lo)
        for i in range(TMN):
            acc[i] = float32(0)
        for p in range(ANP):
            k, c = a_chunk(tid + p * nt)
            ak[p] = k
            adst[p] = a_put(k, c)
            m = m0 + 4 * c
            lc[p] = -1
            if m < M:
                lc[p] = gi * ICG + m % ICG
                t = m // ICG
                ltw[p] = (t % KW) * DW - PW
                lth[p] = ((t // KW) % KH) * DH - PH
                ltd[p] = (t // (KW * KH)) * DD - PD
        for p in range(BNP):
            k, c = b_chunk(tid + p * nt)
            bk_[p] = k
            bdst[p] = b_put(k, c)
            bsrc[p] = k * OC + yc + 4 * c if n0 + 4 * c < OCG else -1
        sl = 0
        sm = 0
        sr = 0
        for it in range(qb - S + 1, qe):
            ld = it + S - 1
            if ld < qe:
                for p in range(ANP):
                    pix = ld * BK + ak[p]
                    src = IX(-1)
                    if lc[p] >= 0 and pix < NPIX:
                        upx = UP(pix)
                        o_w = int64(upx % UP(OW))
                        ur = upx // UP(OW)
                        o_h = int64(ur % UP(OH))
                        ur = ur // UP(OH)
                        o_d = int64(ur % UP(OD))
                        n = int64(ur // UP(OD))
                        i_d = o_d * SD + ltd[p]
                        i_h = o_h * SH + lth[p]
                        i_w = o_w * SW + ltw[p]
                        if (i_d >= 0 and i_d < ID and i_h >= 0 and i_h < IH
                                and i_w >= 0 and i_w < IW):
                            src = IX((((n * ID + i_d) * IH + i_h) * IW + i_w) * IC + lc[p])
                    asrc[p] = src
                for p in range(BNP):
                    ok = bsrc[p] >= 0 and ld * BK + bk_[p] < NPIX
                    bnow[p] = IX(ld * (BK * OC) + bsrc[p]) if ok else -1
                issue(As, Bs, x, dy, sl * ASZ, sl * BSZ, adst, bdst, asrc, bnow, al)
            sl = sl + 1 if sl < S - 1 else 0
            sm, sr = advance(As, Bs, acc, lo, adst, bdst, it, qb, sm, sr)
        for a in range(tm):
            m = m0 + row_of(a, tid)
            if m < M:
                for b in range(tn):
                    col = col_of(b, tid)
                    if n0 + col < OCG:
                        part[uint64(sp * WS + m * OC + yc + col)] = acc[a * tn + b]

    return _kernel(bwd_w_tf32, nt)
