"""The one wrapper every kernel is compiled through.

Caching, fastmath and the threading policy live here so that no kernel module sets them
itself: a kernel module only says ``@kernel(parallel=True)`` or ``@helper``.

* ``cache=True`` by default; Numba raises at decoration time when no cache directory is
  writable (read-only site-packages and no usable HOME): we then warn once and compile in
  memory instead of failing the import.
* ``fastmath`` is :data:`numbaconv.config.FASTMATH` (no ``nnan``/``ninf``).
* ``error_model="numpy"`` drops the division-by-zero checks from index arithmetic.
* ``nogil=True`` so that Python threads can call kernels concurrently.
"""
import threading
import types
import warnings

import numba
import numpy as np
from numba.core import types as nbtypes
from numba.core.registry import CPUDispatcher

from . import _ahead, config

_cache_ok = None
_cache_lock = threading.Lock()


def _options(parallel, reassociate=True):
    fastmath = set(config.FASTMATH) - (set() if reassociate else {"reassoc"})
    return dict(nopython=True, parallel=parallel, fastmath=fastmath, error_model="numpy",
                nogil=True)


_depth = threading.local()


def _noop(*args, **kwargs):
    return None


class _Dispatcher(CPUDispatcher):
    """Numba's CPU dispatcher, except that a call from jitted code compiles the callee for
    the arguments' plain types: an argument that type inference sees first as a literal
    (a counter set to ``0`` before a loop, a constant flag) would otherwise compile a
    second copy of the callee, and of everything it calls, specialised to that value.

    It also takes part in compiling ahead (:mod:`numbaconv._ahead`): a compile started
    from Python (not from another compile) first asks the plan's session, which may wait
    for a helper process compiling the same kernel; in that helper's walk, a call from
    Python records the kernel and its argument types and returns without running it."""

    def compile(self, sig):
        s = _ahead.current()
        depth = getattr(_depth, "n", 0)
        if s is not None and depth == 0:
            s.before_compile(self, sig)
        _depth.n = depth + 1
        try:
            return super().compile(sig)
        finally:
            _depth.n = depth

    #: A kernel (returns nothing) rather than a helper (whose value Python code may use).
    is_kernel = False

    def _compile_for_args(self, *args, **kws):
        if self.is_kernel and _ahead.walking() and not kws:
            _ahead.record(self, tuple(self.typeof_pyval(a) for a in args))
            return _noop
        return super()._compile_for_args(*args, **kws)

    def get_call_template(self, args, kws):
        return super().get_call_template(
            tuple(nbtypes.unliteral(a) for a in args),
            {k: nbtypes.unliteral(v) for k, v in kws.items()})


def _njit(fn, parallel, cache, reassociate=True):
    if numba.config.DISABLE_JIT:
        return fn
    disp = _Dispatcher(py_func=fn, locals={},
                       targetoptions=_options(parallel, reassociate))
    if cache:
        disp.enable_caching()
    return disp


def _compile(fn, parallel, reassociate=True):
    global _cache_ok
    with _cache_lock:
        want_cache = config.CACHE and _cache_ok is not False
        if want_cache:
            try:
                return _njit(fn, parallel, True, reassociate)
            except Exception as exc:  # numba: "cannot cache function ...: no locator available"
                if _cache_ok is None:
                    warnings.warn(
                        f"numbaconv: no writable cache directory for compiled kernels ({exc}); "
                        "kernels are compiled in memory on first use in each process. Set "
                        "NUMBA_CACHE_DIR to a writable directory to keep them.",
                        RuntimeWarning, stacklevel=3)
                _cache_ok = False
        return _njit(fn, parallel, False, reassociate)


def _as_kernel(disp):
    disp.is_kernel = True
    return disp


def kernel(fn=None, *, parallel=True, reassociate=True):
    """Decorate a kernel entry point (a parallel loop nest by default).

    ``reassociate=False`` drops ``reassoc`` from the fastmath flags: for loop nests that
    reduce nothing (elementwise transforms), where it buys no vectorisation and where a
    copy compiled in this process and one loaded from the disk cache were seen to round
    differently (the Winograd input transform)."""
    if fn is None:
        return lambda f: _as_kernel(_compile(f, parallel, reassociate))
    return _as_kernel(_compile(fn, parallel, reassociate))


def helper(fn=None, *, reassociate=True):
    """Decorate a serial helper inlined into kernels of the same module (``reassociate``:
    as for :func:`kernel`)."""
    if fn is None:
        return lambda f: _compile(f, False, reassociate)
    return _compile(fn, False, reassociate)


def specialise(fn, suffix, **constants):
    """A copy of the plain function ``fn`` named ``<name>_<suffix>``, its module globals
    ``constants`` bound to the given values. Numba reads globals as compile-time constants
    and prunes the branches they decide, so each copy compiles only its own code; the
    unique name gives each its own entry in the disk cache. Copy after everything ``fn``
    calls is defined (the copy sees the module's globals as they are then)."""
    g = dict(fn.__globals__)
    g.update(constants)
    f = types.FunctionType(fn.__code__, g, f"{fn.__name__}_{suffix}", fn.__defaults__,
                           fn.__closure__)
    f.__qualname__ = f"{fn.__qualname__}_{suffix}"
    f.__doc__ = fn.__doc__
    f.__module__ = fn.__module__
    return f


def cache_enabled():
    """Whether kernels are being cached on disk (None: not decided yet)."""
    return config.CACHE and _cache_ok is not False


class Separate:
    """A serial helper compiled on its own and called from kernels through its address.

    A helper called directly from a ``@kernel`` is linked into the kernel's module and
    optimised and emitted again there, once for each parallel region (Numba outlines a
    ``prange`` body into a function of its own): a large helper costs its compile time two
    or three times over. A separate helper is compiled once, for one of its declared
    ``variants`` (name -> signature), and kernels call it through a table of addresses
    that they take as an argument: ``helper(table, *args)`` in the kernel,
    ``helper.table(name)`` (which compiles that variant, or loads it from the disk cache)
    on the Python side.

    The call site picks the variant whose signature its arguments fit (arrays by dtype and
    rank, any layout or writability: Numba lays them out alike; scalars cast to the
    declared type), at compile time; a variant not compiled yet raises ``RuntimeError``
    instead of calling a null address. The helper must not return a value.
    """

    def __init__(self, fn, variants, noalias=False):
        from numba.core import sigutils
        self.__name__ = fn.__name__
        self.dispatcher = _compile(fn, False)
        self.dispatcher.is_kernel = True  # called for its effect, from Python too
        if noalias and not numba.config.DISABLE_JIT:
            _no_alias(self.dispatcher)
        self.names = tuple(variants)
        self.signatures = tuple(sigutils._parse_signature_string(s)
                                if isinstance(s, str) else s for s in variants.values())
        self._table = np.zeros(len(self.names), np.int64)
        self.call = _separate_call(self)

    def table(self, *names):
        """The address table with the variants ``names`` compiled (each compiled once)."""
        t = self._table
        for name in names:
            i = self.names.index(name)
            if t[i] == 0:
                sig = self.signatures[i]
                if _ahead.walking():  # a helper process's walk: noted, compiled later
                    _ahead.record(self.dispatcher, sig)
                    continue
                self.dispatcher.compile(sig)
                cres = self.dispatcher.overloads[tuple(sig.args)]
                t[i] = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
        return t


def _no_alias(disp):
    """Compile ``disp`` with Numba's ``noalias`` flag (array arguments' data marked as not
    aliasing one another: the flag Numba sets for a ``prange`` body whose arrays do not
    alias), so that LLVM vectorises its loops without run-time overlap checks."""
    comp = disp._compiler
    customize = comp._customize_flags

    def with_noalias(flags):
        flags = customize(flags)
        flags.noalias = True
        return flags
    comp._customize_flags = with_noalias


def separate(template=None, *, noalias=False, **variants):
    """Decorate a serial helper that kernels call through its address (:class:`Separate`).

    ``variants``: name -> signature; with a ``template``, name -> what to put in it
    (a dtype name for ``{T}``, or a dict of placeholders), e.g.
    ``@separate("void({T}[:, ::1], int64)", float32="float32", float64="float64")``.
    The decorated name is the call for jitted code, ``helper(table, *args)``, with the
    :class:`Separate` methods on it: ``helper.table(name)``, ``helper.dispatcher``.

    ``noalias=True``: the helper's array arguments never overlap where one of them is
    written (as in a loop nest outlined from a ``prange`` body, which Numba compiles so);
    the row drivers that replace such bodies declare it to keep their vectorised loops.
    """
    if template is not None:
        variants = {name: template.format(**(v if isinstance(v, dict) else {"T": v}))
                    for name, v in variants.items()}

    def wrap(fn):
        sep = Separate(fn, variants, noalias)
        call = sep.call
        call.table = sep.table
        call.dispatcher = sep.dispatcher
        call.separate = sep
        return call
    return wrap


def _fits(actual, declared):
    if isinstance(declared, nbtypes.Array):
        # one data model for every layout and writability; a contiguous declaration
        # takes only contiguous arrays, since the helper indexes them as such
        return (isinstance(actual, nbtypes.Array) and actual.dtype == declared.dtype
                and actual.ndim == declared.ndim
                and declared.layout in ("A", actual.layout))
    if isinstance(declared, (nbtypes.Integer, nbtypes.Boolean)):
        return isinstance(actual, (nbtypes.Integer, nbtypes.Boolean))
    if isinstance(declared, nbtypes.Float):
        return isinstance(actual, (nbtypes.Integer, nbtypes.Float))
    return actual == declared


def _separate_call(sep):
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.core.errors import TypingError
    from numba.extending import intrinsic

    @intrinsic
    def call(typingctx, table, *args):
        for k, sig in enumerate(sep.signatures):
            if len(sig.args) == len(args) and all(map(_fits, args, sig.args)):
                break
        else:
            raise TypingError(f"{sep.__name__}: no variant of {list(sep.names)} takes "
                              f"({', '.join(map(str, args))})")
        target = sep.signatures[k]
        name = sep.names[k]

        def codegen(context, builder, signature, llargs):
            tab, star = llargs
            vals = cgutils.unpack_tuple(builder, star, len(args))
            cast = []
            for v, a, d in zip(vals, args, target.args):
                cast.append(v if isinstance(d, types.Array) else
                            context.cast(builder, v, a, d))
            arr = context.make_array(signature.args[0])(context, builder, tab)
            addr = builder.load(builder.gep(arr.data, [ir.Constant(ir.IntType(64), k)]))
            with cgutils.if_unlikely(builder, builder.icmp_signed(
                    "==", addr, ir.Constant(addr.type, 0))):
                context.call_conv.return_user_exc(
                    builder, RuntimeError,
                    (f"{sep.__name__}: variant {name!r} is not compiled; call "
                     f"{sep.__name__}.table({name!r}) before the kernel",))
            fnty = context.call_conv.get_function_type(target.return_type, target.args)
            fn = builder.inttoptr(addr, fnty.as_pointer())
            status, _ = context.call_conv.call_function(builder, fn, target.return_type,
                                                        target.args, cast)
            with cgutils.if_unlikely(builder, status.is_error):
                context.call_conv.return_status_propagate(builder, status)
            return context.get_dummy_value()

        return types.none(table, types.StarArgTuple(args)), codegen

    return call
