"""Layout and dtype conversion on the device: user arrays <-> canonical contiguous arrays.

Every user layout is a relabelling of the canonical one: with the canonical coordinates
``(c0, c1, c2, c3, c4)`` of a 5-D C-contiguous array (``[mb, d, h, w, C]`` or
``[kd, kh, kw, icg, oc]``) extended by ``c4 // div`` and ``c4 % div`` (the channel and
multiplier of TF's depthwise ``[*X, C, multiplier]`` filters), the user's index along its
axis ``a`` is coordinate ``sel[a]``. The map is a bijection, so :func:`gather` (user ->
canonical) and :func:`scatter` (canonical -> user) each write every element once, for any
strides of the user's array (views, Fortran order, negative strides). The assignment
converts the dtype: float16 is widened to float32 on the way in and rounded once on the
way out. One kernel per user rank (3, 4, 5); the canonical side is a flat 1-D view.
"""
import functools

from numba import cuda


_COORDS = """
        c4 = e % cdims[4]
        r = e // cdims[4]
        c3 = r % cdims[3]
        r = r // cdims[3]
        c2 = r % cdims[2]
        r = r // cdims[2]
        c1 = r % cdims[1]
        co = (r // cdims[1], c1, c2, c3, c4, c4 // div, c4 % div)"""

# Kernels are generated from one template per rank (numba needs a literal index tuple) and
# call no device function (whose compilation would need a GPU, see kernels.cuda.gemm).
_TEMPLATE = """
def {name}({args}, cdims, sel, div):
    e = cuda.grid(1)
    step = cuda.gridsize(1)
    while e < canon.shape[0]:{coords}
        {stmt}
        e += step
"""


def _build(name, args, stmt):
    src = _TEMPLATE.format(name=name, args=args, coords=_COORDS, stmt=stmt)
    ns = {"cuda": cuda}
    exec(compile(src, f"<numbaconv.kernels.cuda.layout.{name}>", "exec"), ns)
    return cuda.jit(ns[name])


def _user_index(ndim):
    return "user[" + ", ".join(f"co[sel[{a}]]" for a in range(ndim)) + "]"


@functools.lru_cache(maxsize=None)
def gather(ndim):
    """``canon[e] = user[co[sel[0]], ...]`` for a user array of rank ``ndim`` (any strides)."""
    return _build(f"gather{ndim}", "user, canon", f"canon[e] = {_user_index(ndim)}")


@functools.lru_cache(maxsize=None)
def scatter(ndim):
    """``user[co[sel[0]], ...] = canon[e]`` for a user array of rank ``ndim`` (any strides)."""
    return _build(f"scatter{ndim}", "canon, user", f"{_user_index(ndim)} = canon[e]")


@functools.lru_cache(maxsize=None)
def fill_zero():
    """Zero a 1-D (flat, contiguous) array: the canonical result of an empty problem."""
    def fill_zero(a):
        e = cuda.grid(1)
        step = cuda.gridsize(1)
        while e < a.shape[0]:
            a[e] = 0
            e += step

    return cuda.jit(fill_zero)
