"""The CPU backend: canonicalise operands once, run the plan, return the user's layout.

Canonical layouts are those of :mod:`numbaconv.kernels` (channels last, 3-D, XIO filters,
compute dtype contiguous), so each kernel compiles once per compute dtype. float16 and
bfloat16 operands are widened to float32 here and the result is rounded to the user's
dtype once at the end, except those a strategy converts itself (``half_operands`` for
float16, ``bf16_operands`` for bfloat16): they go in and come out as their bits
(``uint16`` arrays).

Thread safety: everything between the operands and the result that may run Numba parallel
code (float16 conversions included) runs through :func:`numbaconv.runtime.run_parallel`,
which serialises it where the threading layer needs it (``workqueue``).
"""
import math

import numpy as np

from .. import _ahead, _jit, config, memory, runtime
from ..problem import FLOAT32_COMPUTED, is_masked, numpy_dtype


def threading_layer():
    """Numba's threading layer once a parallel kernel has run, else ``None``."""
    return runtime.threading_layer()


#: The operands of each direction, as :func:`canonical_operands` names them.
_OPERANDS = {"fwd": ("x", "w"), "bwd_d": ("dy", "w"), "bwd_w": ("x", "dy")}


def _converted(dtype):
    """Whether operands of the user's ``dtype`` (a name) computed in float32 are widened
    and rounded by the convert kernels: float16 where the host has F16C, bfloat16 always
    (integer shifts). Otherwise NumPy's casts convert them."""
    if dtype == "bfloat16":
        return True
    return dtype == "float16" and _half_kernels() is not None


def _bits_operands(strategy, p, tiles):
    """What ``strategy`` takes and returns as float16 or bfloat16 bits for ``p``."""
    if p.dtype == "float16":
        return strategy.half_operands(p, tiles)
    return strategy.bf16_operands(p, tiles)


def _half_io(plan):
    """What the plan's strategy takes and returns as float16 or bfloat16 bits (see
    ``_Prepared``)."""
    p = plan.problem
    if p.dtype not in FLOAT32_COMPUTED or p.empty or not _converted(p.dtype):
        return frozenset()
    from ..planner import implementation
    return _bits_operands(implementation(plan), p, plan.tiles)


def _operand_copy_bytes(p, name, a, half_io):
    """Bytes of the canonical copy :func:`canonical_operands` makes of the caller's operand
    ``name`` (0 where it uses the array itself, reshaped); ``a=None``: the most it can."""
    n = math.prod(p.w_shape if name == "w" else p.x_shape if name == "x" else p.y_shape)
    native = contiguous = False
    if a is not None:
        if name == "w":
            v = np.moveaxis(a, (0, 1), (-1, -2)) if p.filter_format == "OIX" else a
        else:
            v = np.moveaxis(a, 1, -1) if p.data_format == "NCX" else a
        native, contiguous = a.dtype.isnative, v.flags.c_contiguous
        if p.dtype not in FLOAT32_COMPUTED:
            return 0 if contiguous and a.dtype == np.dtype(p.compute_dtype) else \
                n * np.dtype(p.compute_dtype).itemsize
    elif p.dtype not in FLOAT32_COMPUTED:
        return n * np.dtype(p.compute_dtype).itemsize
    if name in half_io:  # 16-bit bits: a 16-bit copy where not C-contiguous
        return 0 if contiguous and native else n * 2
    # widened to float32, by the convert kernels after a C-contiguous 16-bit copy
    staging = n * 2 if (a is None or native and not contiguous) and \
        _converted(p.dtype) else 0
    return n * 4 + staging


def _result_bytes(p, half_io, out):
    """``(result, copies)``: bytes of the canonical result and of the copies made of it on
    the way to the caller (rounded to float16, moved into the user's layout; none into
    ``out``)."""
    n = math.prod(p.result_shape)
    user = numpy_dtype(p.dtype).itemsize
    if p.empty:  # zeros in the user's dtype and layout
        return n * user, 0
    copies = 0
    if "result" in half_io:
        result = n * 2
    else:
        result = n * np.dtype(p.compute_dtype).itemsize
        if p.dtype in FLOAT32_COMPUTED and _converted(p.dtype):
            copies = n * 2
    if p.direction == "bwd_w":  # [*X, C/g, K] -> [K, C/g, *X]: a copy unless a view is one
        relayout = (p.filter_format == "OIX"
                    and sum(v > 1 for v in (math.prod(p.ksz), p.icg, p.oc)) > 1)
    else:
        sizes, ch = (p.isz, p.ic) if p.direction == "bwd_d" else (p.osz, p.oc)
        relayout = p.data_format == "NCX" and ch > 1 and math.prod(sizes) > 1
    if out is None and (relayout or p.dtype in FLOAT32_COMPUTED
                        and not _converted(p.dtype)):
        copies += n * user
    return result, copies


def check_memory(plan, operands=None, out=None):
    """MemoryError with the sizes, before any work, when what a call allocates cannot fit
    in ``config.MAX_MEMORY_FRACTION`` of physical memory: the result, the workspace and the
    copies really made (of the operands into the canonical layout and compute dtype, of
    the result into the user's), not the operands the caller already holds.

    ``operands`` (and ``out``): the call's; without them every operand counts as copied.
    Returns whether a call with other operands of this plan may still exceed the limit
    (then each call is checked with its own).
    """
    p = plan.problem
    phys = runtime.phys_memory()
    if phys is None:
        return False
    limit = config.MAX_MEMORY_FRACTION * phys
    half_io = _half_io(plan)
    names = () if p.empty else _OPERANDS[p.direction]
    copies = {n: _operand_copy_bytes(p, n, None if operands is None else operands.get(n),
                                     half_io) for n in names}
    result, result_copies = _result_bytes(p, half_io, out)
    need = result + plan.workspace_bytes + result_copies + sum(copies.values())
    if need > limit:
        each = ", ".join(f"{n} {b}" for n, b in copies.items() if b)
        raise MemoryError(
            f"numbaconv: {p.op or p.direction} {p.descriptor()} needs {need} bytes "
            f"({need / 2**30:.3g} GiB: result {result} bytes of shape {p.result_shape}, "
            f"workspace {plan.workspace_bytes} bytes, copies of the result {result_copies} "
            f"bytes, copies of the operands {sum(copies.values())} bytes"
            f"{' (' + each + ')' if each else ''}) but the limit is {int(limit)} bytes "
            f"(config.MAX_MEMORY_FRACTION={config.MAX_MEMORY_FRACTION} of this machine's "
            f"{phys} bytes)")
    worst = (sum(_operand_copy_bytes(p, n, None, half_io) for n in names)
             + sum(_result_bytes(p, half_io, None)) + plan.workspace_bytes)
    return worst > limit


_fast_half = []


def _half_kernels():
    """:mod:`numbaconv.kernels.cpu.convert` where the host converts float16 in hardware,
    else None (NumPy's casts, 20-40x slower)."""
    if not _fast_half:
        from ..kernels.cpu import convert
        _fast_half.append(convert if convert.available() else None)
    return _fast_half[0]


def to_float32(a, parallel=False):
    """A C-contiguous float32 copy (from the memory pool) of the float16 or bfloat16 array
    ``a`` (any layout), widened by the convert kernels (float16: hosts with F16C only)."""
    a = np.ascontiguousarray(a)
    out = memory.empty(a.shape, np.float32)
    if a.size:
        if a.dtype.name == "bfloat16":
            from ..kernels.cpu import convert as k
            (k.convert_bf16_parallel if parallel else k.convert_bf16)(
                a.reshape(-1).view(np.uint16), out.reshape(-1).view(np.uint32), True)
        else:
            k = _half_kernels()
            (k.convert_parallel if parallel else k.convert)(a.reshape(-1).view(np.uint16),
                                                            out.reshape(-1), True)
    return out


def to_bfloat16(a, parallel=False):
    """A C-contiguous bfloat16 copy (from the memory pool) of the float32 array ``a`` (any
    layout), rounded to nearest even by the convert kernels (NaN kept)."""
    from ..kernels.cpu import convert as k
    a = np.ascontiguousarray(a, dtype=np.float32)
    out = memory.empty(a.shape, numpy_dtype("bfloat16"))
    if a.size:
        (k.convert_bf16_parallel if parallel else k.convert_bf16)(
            a.reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint16), False)
    return out


def to_float16(a, parallel=False):
    """A C-contiguous float16 copy (from the memory pool) of the float32 array ``a`` (any
    layout), rounded by the convert kernels (hosts with F16C only)."""
    k = _half_kernels()
    a = np.ascontiguousarray(a, dtype=np.float32)
    out = memory.empty(a.shape, np.float16)
    if a.size:
        (k.convert_parallel if parallel else k.convert)(a.reshape(-1),
                                                        out.reshape(-1).view(np.uint16), False)
    return out


def _as_compute(a, p, parallel=False):
    """``a`` C-contiguous in the compute dtype (float16 and bfloat16 widened to float32
    once)."""
    if p.dtype in FLOAT32_COMPUTED and a.dtype.isnative and _converted(p.dtype):
        return to_float32(a, parallel)  # (byte-swapped float16: NumPy's cast swaps it)
    return memory.ascontiguous(a, p.compute_dtype)


def _as_half_bits(a, p):
    """``a`` C-contiguous in float16 or bfloat16 (the problem's dtype), as its ``uint16``
    bits (no copy where it already is)."""
    return memory.ascontiguous(a, numpy_dtype(p.dtype)).view(np.uint16)


def _data_to_canonical(a, p, channels, sizes, parallel=False, half=False):
    if p.data_format == "NCX":
        a = np.moveaxis(a, 1, -1)
    a = a.reshape((p.mb, *sizes, channels))
    return _as_half_bits(a, p) if half else _as_compute(a, p, parallel)


def _filter_to_canonical(w, p, parallel=False, half=False):
    if p.filter_format == "OIX":
        w = np.moveaxis(w, (0, 1), (-1, -2))  # [K, C/g, *X] -> [*X, C/g, K]
    w = w.reshape((*p.ksz, p.icg, p.oc))
    return _as_half_bits(w, p) if half else _as_compute(w, p, parallel)


def _to_user(r, p):
    """A canonical result in the user's layout (a view where possible)."""
    nd = p.ndim
    if p.direction == "bwd_w":
        ks = p.ksz[3 - nd:]
        if p.filter_format == "XIM":
            return r.reshape((*ks, p.ic, p.ocg))
        r = r.reshape((*ks, p.icg, p.oc))
        return np.moveaxis(r, (-1, -2), (0, 1)) if p.filter_format == "OIX" else r
    shape = p.x_shape if p.direction == "bwd_d" else p.y_shape
    ch = p.ic if p.direction == "bwd_d" else p.oc
    sizes = (p.isz if p.direction == "bwd_d" else p.osz)[3 - nd:]
    r = r.reshape((p.mb, *sizes, ch))
    if p.data_format == "NCX":
        r = np.moveaxis(r, -1, 1)
    assert r.shape == shape
    return r


def check_out(out, p):
    if out is None:
        return
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out: expected a NumPy array, got {type(out).__name__}")
    if is_masked(out):  # its mask would be left as it was
        raise TypeError("out: masked arrays are not supported; pass np.ma.filled(a, 0) or "
                        "a.data")
    # either byte order, as for the operands: the result is copied into ``out``, swapped
    if out.dtype.newbyteorder("=") != numpy_dtype(p.dtype):
        raise TypeError(f"out: expected dtype {p.dtype} (either byte order), got {out.dtype}")
    if out.shape != p.result_shape:
        raise ValueError(f"out: expected shape {p.result_shape}, got {out.shape}")
    if not out.flags.writeable:
        raise ValueError("out: the array is read-only")


def canonical_operands(p, operands, parallel=False, half=frozenset()):
    """The operands in canonical layout and compute dtype; ``parallel``: convert float16
    and bfloat16 on every thread (right next to Numba's parallel kernels, not BLAS calls:
    see :mod:`numbaconv.kernels.cpu.convert`); those named in ``half`` stay in the user's
    16-bit dtype, as ``uint16`` bits."""
    ops = {}
    if "x" in operands:
        ops["x"] = _data_to_canonical(operands["x"], p, p.ic, p.isz, parallel, "x" in half)
    if "dy" in operands:
        ops["dy"] = _data_to_canonical(operands["dy"], p, p.oc, p.osz, parallel, "dy" in half)
    if "w" in operands:
        ops["w"] = _filter_to_canonical(operands["w"], p, parallel, "w" in half)
    return ops


def _set_num_threads(n):
    import numba
    numba.set_num_threads(n)


class _Prepared:
    """What :func:`execute` derives from a plan alone, derived once per plan: its strategy
    object and its bound call (``Strategy.bind``), whether the float16 and bfloat16
    conversions run on every thread, which operands it takes as their bits, the user's
    dtype, that
    it fits in memory (checked again when ``config.MAX_MEMORY_FRACTION`` changes, and on
    every call where the call's own operands decide it: ``check``), and
    the canonical shapes of channels-last operands (``plain``: the user's arrays,
    reshaped; float16 and bfloat16 ones then taken as bits or widened, ``widen``) and the
    result's
    shape. Together 20-30 us of Python per call."""

    __slots__ = ("plan", "strategy", "call", "parallel", "half", "half_io", "dtype",
                 "fraction", "plain", "widen", "shape", "check", "first")

    def __init__(self, plan, operands=None, out=None):
        from ..planner import implementation

        p = plan.problem
        self.check = check_memory(plan, operands, out)
        self.plan = plan
        self.first = True  # its first call may compile (with a helper: numbaconv._ahead)
        self.fraction = config.MAX_MEMORY_FRACTION
        self.dtype = numpy_dtype(p.dtype)
        self.strategy = None if p.empty else implementation(plan)
        # conversions on every thread only next to Numba parallel regions alone
        self.parallel = (self.strategy is not None and plan.threads > 1
                         and self.strategy.numba_parallel(p, plan.tiles))
        # float16 or bfloat16: computed in float32, converted by the convert kernels (or,
        # for float16 on a host without F16C, by NumPy's casts)
        self.half = p.dtype in FLOAT32_COMPUTED
        converted = self.half and _converted(p.dtype)
        # strategies take bits only where the convert kernels would otherwise convert
        self.half_io = (_bits_operands(self.strategy, p, plan.tiles)
                        if converted and self.strategy is not None else frozenset())
        self.call = None if self.strategy is None else self.strategy.bind(p, plan.tiles)
        # channels-last data, XIO filters: the operands are the user's arrays reshaped
        # (where C-contiguous; float16 ones as bits where the kernels take them so, else
        # widened) and the canonical result is in the user's layout
        self.plain = None
        self.widen = ()
        self.shape = p.result_shape
        if (p.data_format == "NXC" and p.filter_format in ("XIO", "XIM")
                and self.strategy is not None
                and (not self.half or converted)):
            self.plain = (("x", (p.mb, *p.isz, p.ic)), ("dy", (p.mb, *p.osz, p.oc)),
                          ("w", (*p.ksz, p.icg, p.oc)))
            if self.half:
                self.widen = tuple(n for n, _ in self.plain if n not in self.half_io)


#: id(plan) -> _Prepared (which holds the plan, so that an id is not reused while cached)
_PREPARED = {}
PREPARED_SIZE = 512


def _prepared(plan, operands=None, out=None):
    prep = _PREPARED.get(id(plan))
    if prep is not None and prep.plan is plan and prep.fraction == config.MAX_MEMORY_FRACTION:
        if prep.check:
            check_memory(plan, operands, out)
        return prep
    prep = _Prepared(plan, operands, out)
    if len(_PREPARED) >= PREPARED_SIZE:
        _PREPARED.clear()
    _PREPARED[id(plan)] = prep
    return prep


def _plain_operands(prep, operands):
    """The canonical operands as views of the user's arrays, or None where one needs a
    copy (see ``_Prepared.plain``); float16 and bfloat16 ones as their ``uint16`` bits,
    except those in ``prep.widen``, widened once."""
    if prep.half and not _converted(prep.plan.problem.dtype):  # (where a test takes F16C away)
        return None
    ops = {}
    dtype = prep.dtype
    for name, shape in prep.plain:
        a = operands.get(name)
        if a is None:
            continue
        if a.dtype != dtype or not a.flags.c_contiguous:
            return None
        ops[name] = a.reshape(shape)
    if prep.half:
        for name, a in ops.items():
            ops[name] = (to_float32(a, prep.parallel) if name in prep.widen
                         else a.view(np.uint16))
    return ops


def _compute(prep, operands):
    """The canonical operands, the plan's bound call, the result in the user's layout."""
    p = prep.plan.problem
    if not all(a.flags.writeable for a in operands.values()):
        # (one set of compiled kernels for read-only and writable operands alike)
        operands = {k: memory.kernel_view(a) for k, a in operands.items()}
    ops = None if prep.plain is None else _plain_operands(prep, operands)
    plain = ops is not None
    if not plain:
        ops = canonical_operands(p, operands, prep.parallel, prep.half_io)
    r = prep.call(ops)
    if r.dtype == np.uint16:  # float16 or bfloat16 bits from a strategy's kernels
        r = r.view(prep.dtype)
    elif prep.half and _converted(p.dtype):
        # rounded once, before any layout change
        r = (to_bfloat16 if p.dtype == "bfloat16" else to_float16)(r, prep.parallel)
    # a canonical result of a plain call is in the user's layout already
    return r.reshape(prep.shape) if plain else _to_user(r, p)


def _compiles_slowly(plan):
    """Whether the plan's kernels take seconds to compile (a helper process compiling
    ahead is worth its start-up of half a second): a ``compile_heavy`` entry, or one on
    the Numba GEMM engine."""
    if plan.problem.empty:
        return False
    from ..planner import implementation
    s = implementation(plan)
    return s is not None and (s.compile_heavy or plan.tiles.get("engine") == "numba")


def _first(plan):
    """Whether this is ``plan``'s first call in this process (its kernels may compile,
    while it is prepared too: strategies take their drivers' address tables then)."""
    prep = _PREPARED.get(id(plan))
    return prep is None or prep.plan is not plan or prep.first


def execute(plan, operands, out=None, threads_current=False):
    """Run ``plan`` on the user's ``operands`` (NumPy arrays); returns the result.
    ``threads_current``: the calling thread's Numba threads are already ``plan.threads``
    (a memoised call planned for them), so they are not set again."""
    if _first(plan):
        with _ahead.session(plan, operands, _jit.cache_enabled() and _compiles_slowly(plan),
                            execute):
            return _execute(plan, operands, out, threads_current)
    return _execute(plan, operands, out, threads_current)


def _execute(plan, operands, out, threads_current):
    p = plan.problem
    check_out(out, p)
    prep = _prepared(plan, operands, out)
    if prep.strategy is None:
        result = np.zeros(p.result_shape, prep.dtype)
    else:
        if not threads_current:
            # thread-local in Numba: set for this calling thread, the conversions' too
            _set_num_threads(plan.threads)
        result = runtime.run_parallel(_compute, prep, operands)
    prep.first = False
    if out is not None:
        np.copyto(out, result, casting="unsafe")
        return out
    if result.dtype != prep.dtype:
        return memory.ascontiguous(result, prep.dtype)
    return memory.ascontiguous(result)
