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
import ctypes
import threading
import types
import warnings

import numba
import numpy as np
from numba.core import types as nbtypes
from numba.core.caching import FunctionCache
from numba.core.registry import CPUDispatcher

from . import _ahead, config

_cache_ok = None
_cache_lock = threading.Lock()


def _options(parallel, reassociate=True, inline=False):
    fastmath = set(config.FASTMATH) - (set() if reassociate else {"reassoc"})
    opts = dict(nopython=True, parallel=parallel, fastmath=fastmath, error_model="numpy",
                nogil=True)
    if inline:
        opts["inline"] = "always"
    return opts


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


class _Cache(FunctionCache):
    """Numba's on-disk cache of one function, loading without the full context refresh.

    Numba refreshes its target context before every load from the cache: the first one in
    a process imports every implementation Numba has (``numba.np.linalg`` imports
    ``scipy.linalg`` where SciPy is installed), 0.3-0.5 s of a warm-cache first call
    although a cached kernel is machine code that needs none of it. A load here only
    starts Numba's runtime (the allocation functions the code calls) and falls back to
    Numba's own path (refresh, then load) where that fails; compiling still refreshes
    everything first, as it always did."""

    def load_overload(self, sig, target_context):
        try:
            from numba.core.runtime import rtsys
            rtsys.initialize(target_context)
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
        except Exception:  # a symbol only a registry defines, a Numba without these
            return super().load_overload(sig, target_context)


def _njit(fn, parallel, cache, reassociate=True, inline=False):
    if numba.config.DISABLE_JIT:
        return fn
    disp = _Dispatcher(py_func=fn, locals={},
                       targetoptions=_options(parallel, reassociate, inline))
    if cache:
        disp.enable_caching()
        disp._cache = _Cache(fn)
    return disp


def _compile(fn, parallel, reassociate=True, inline=False):
    global _cache_ok
    with _cache_lock:
        want_cache = config.CACHE and _cache_ok is not False
        if want_cache:
            try:
                return _njit(fn, parallel, not inline, reassociate, inline)
            except Exception as exc:  # numba: "cannot cache function ...: no locator available"
                if _cache_ok is None:
                    warnings.warn(
                        f"numbaconv: no writable cache directory for compiled kernels ({exc}); "
                        "kernels are compiled in memory on first use in each process. Set "
                        "NUMBA_CACHE_DIR to a writable directory to keep them.",
                        RuntimeWarning, stacklevel=3)
                _cache_ok = False
        return _njit(fn, parallel, False, reassociate, inline)


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


def helper(fn=None, *, reassociate=True, inline=False):
    """Decorate a serial helper inlined into kernels of the same module (``reassociate``:
    as for :func:`kernel`).

    ``inline=True``: Numba inlines the helper's code into each caller before typing
    (``inline="always"``) instead of compiling it as a function of its own, which it then
    links into the caller and optimises again there. A small helper compiled on its own
    costs 0.1-0.8 s of the first call (its typing, an LLVM module, machine code, a Python
    wrapper); inlined it costs only its own lines in the caller's compile. For table and
    set-up code with one or two callers; not for a hot loop nest that LLVM keeps as a
    function of its own, where inlining changed the caller's generated code. Such a helper
    is never cached on its own (nothing runs it alone)."""
    if fn is None:
        return lambda f: _compile(f, False, reassociate, inline)
    return _compile(fn, False, reassociate, inline)


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


_DTYPE_NAMES = {}


def dtype_name(dt):
    """``dt.name`` from a table: NumPy's property costs about 2 us a call, and the kernel
    wrappers name a variant on every call."""
    try:
        return _DTYPE_NAMES[dt]
    except KeyError:
        name = _DTYPE_NAMES[dt] = dt.name
        return name


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

    def __init__(self, fn, variants, noalias=False, parallel=False):
        from numba.core import sigutils
        self.__name__ = fn.__name__
        self.dispatcher = _compile(fn, parallel)
        self.dispatcher.is_kernel = True  # called for its effect, from Python too
        if noalias and not numba.config.DISABLE_JIT:
            _no_alias(self.dispatcher)
        self.names = tuple(variants)
        self.signatures = tuple(sigutils._parse_signature_string(s)
                                if isinstance(s, str) else s for s in variants.values())
        # the variants' addresses, then the shared launcher's (for ``prange``)
        self._table = np.zeros(len(self.names) + 1, np.int64)
        self.call = _separate_call(self)
        # variant name -> (index, how its arguments are packed, trampoline, address)
        self._runs = {}

    def address(self, i):
        """Variant ``i``'s address, compiling it (or loading it from the disk cache) first;
        0 during a helper process's walk, which only notes it (compiled later)."""
        sig = self.signatures[i]
        if _ahead.walking():
            _ahead.record(self.dispatcher, sig)
            return 0
        self.dispatcher.compile(sig)
        cres = self.dispatcher.overloads[tuple(sig.args)]
        return cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)

    def table(self, *names):
        """The address table with the variants ``names`` compiled (each compiled once),
        and the shared parallel launcher that :meth:`prange` calls."""
        t = self._table
        for name in names:
            if name not in self.names:
                raise ValueError(f"{self.__name__}: no variant {name!r}; its variants are "
                                 f"{list(self.names)}")
            i = self.names.index(name)
            if t[i] == 0:
                t[i] = self.address(i)
        if t[-1] == 0 and self is not _launch.separate:
            t[-1] = _launch.separate.address(0)
        return t

    def c_address(self, i):
        """Variant ``i``'s C-callable wrapper (Numba's ``cfunc`` wrapper: plain arguments,
        no status; for a variant that raises nothing), compiling it first."""
        sig = self.signatures[i]
        self.dispatcher.compile(sig)
        cres = self.dispatcher.overloads[tuple(sig.args)]
        return cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name)

    def run(self, name, n, *args):
        """``helper(table, *args, i)`` for every ``i`` in ``range(n)``, in parallel, called
        from Python: :data:`par_for` without a kernel of its own to compile. The arguments
        must fit variant ``name``'s declared types (arrays: dtype, rank, and C order where
        declared; integers and booleans; floats); they are packed into 64-bit words (an
        array as the address of its NumPy object) that a trampoline (:func:`_trampoline`,
        one per signature) unpacks for each iteration."""
        try:
            k, kinds, tramp, addr = self._runs[name]
        except KeyError:
            k, kinds, tramp, addr = self._prepare(name)
        if len(args) != len(kinds):
            raise TypeError(f"{self.__name__}.run({name!r}): {len(kinds)} arguments besides "
                            f"the index, got {len(args)}")
        if _ahead.walking():  # the helper's walk: noted, nothing runs
            self.table(name)
            return
        if addr == 0:  # compiled (or loaded) once, with the launcher
            addr = int(self.table(name)[k])
            self._runs[name] = (k, kinds, tramp, addr)
        try:
            words = [addr, 0, *map(_pack_arg, args, kinds)]
        except _ArgError:
            raise TypeError(f"{self.__name__}: {_pack_error(args, kinds)}") from None
        keep = None if _array_layout() else _records(args, kinds, words)
        ctx = (_c_int64 * len(words))(*words)
        _launcher()(tramp, int(n), _addressof(ctx))
        del keep
        if ctx[1]:
            raise RuntimeError(f"{self.__name__}: a parallel iteration raised an exception")

    def _prepare(self, name):
        if name not in self.names:
            raise ValueError(f"{self.__name__}: no variant {name!r}; its variants are "
                             f"{list(self.names)}")
        k = self.names.index(name)
        sig = self.signatures[k]
        kinds = _arg_kinds(sig, self.__name__)
        entry = self._runs[name] = (k, kinds, _trampoline(sig), 0)
        return entry


_c_int64 = ctypes.c_int64
_addressof = ctypes.addressof

#: Where NumPy keeps an array's data pointer, dimensions and strides in its object
#: (``PyArrayObject_fields``: after the object header, ``data``, ``nd``, ``dimensions``,
#: ``strides``), as the trampolines read them; checked once against a live array
#: (:func:`_array_layout`), else arrays are passed as records of their own.
_DATA, _DIMS, _STRIDES = 16, 32, 40
_layout = []


def _array_layout():
    """Whether NumPy's array objects have the field offsets the trampolines read."""
    if not _layout:
        probe = np.zeros((3, 5), np.float32)[:, ::2]
        base = id(probe)
        rd = ctypes.c_int64.from_address
        ok = (rd(base + _DATA).value == probe.ctypes.data
              and ctypes.c_int32.from_address(base + 24).value == probe.ndim
              and [rd(rd(base + _DIMS).value + 8 * i).value for i in range(2)]
              == list(probe.shape)
              and [rd(rd(base + _STRIDES).value + 8 * i).value for i in range(2)]
              == list(probe.strides))
        _layout.append(ok)
    return _layout[0]


def _records(args, kinds, words):
    """Where NumPy's array objects have another layout: each array argument's word
    replaced by a block of ours with its data pointer, dimensions and strides at the
    offsets the trampolines read; the blocks, to keep alive until the call returns."""
    keep = []
    for j, (a, kind) in enumerate(zip(args, kinds)):
        if kind[0] == "array":
            rec = np.zeros(6 + 2 * a.ndim, np.int64)
            base = rec.ctypes.data
            rec[_DATA // 8] = a.ctypes.data
            rec[_DIMS // 8] = base + 48
            rec[_STRIDES // 8] = base + 48 + 8 * a.ndim
            rec[6:6 + a.ndim] = a.shape
            rec[6 + a.ndim:] = a.strides
            words[2 + j] = base
            keep.append(rec)
    return keep


def _arg_kinds(sig, what):
    """How :meth:`Separate.run` packs each declared argument (all but the index):
    ``("array", dtype, ndim, contiguous)``, ``("int",)``, ``("bool",)`` or ``("float",)``."""
    if not isinstance(sig.args[-1], nbtypes.Integer):
        raise TypeError(f"{what}: the last argument is not an integer index")
    kinds = []
    for d in sig.args[:-1]:
        if isinstance(d, nbtypes.Array):
            kinds.append(("array", np.dtype(str(d.dtype)), d.ndim, d.layout == "C"))
        elif isinstance(d, nbtypes.Boolean):
            kinds.append(("bool",))
        elif isinstance(d, nbtypes.Integer):
            kinds.append(("int",))
        elif isinstance(d, nbtypes.Float):
            kinds.append(("float",))
        else:
            raise TypeError(f"{what}: Separate.run cannot pass an argument of type {d}")
    return tuple(kinds)


def _pack_arg(a, kind):
    """Argument ``a`` (declared as ``kind``) as one word: an array as the address of its
    NumPy object (the object stays alive: the caller holds it), a float as its float64
    bits, an integer or boolean as it is."""
    tag = kind[0]
    if tag == "array":
        if (isinstance(a, np.ndarray) and (a.dtype is kind[1] or a.dtype == kind[1])
                and a.ndim == kind[2] and (not kind[3] or a.flags.c_contiguous)):
            return id(a)
    elif tag == "float":
        if isinstance(a, (float, int, np.floating, np.integer)):
            return int(np.float64(a).view(np.int64))
    elif isinstance(a, (int, np.integer, np.bool_)):
        return int(a)
    raise _ArgError()


class _ArgError(TypeError):
    """An argument that does not fit its declared type (:func:`_pack_error` says how)."""


def _pack_error(args, kinds):
    """What is wrong with the first argument that does not fit."""
    for j, (a, kind) in enumerate(zip(args, kinds)):
        try:
            _pack_arg(a, kind)
        except _ArgError:
            if kind[0] == "array":
                return (f"argument {j} must be a {'C-contiguous ' if kind[3] else ''}"
                        f"{kind[2]}-d {kind[1]} array, got {type(a).__name__} "
                        f"{getattr(a, 'dtype', '')} {getattr(a, 'shape', '')}")
            return (f"argument {j} must be {'a float' if kind[0] == 'float' else 'an integer'}"
                    f", got {type(a).__name__}")
    return "arguments do not fit"


_tramps = {}
_tramp_lock = threading.Lock()
_launch_c = []


def _launcher():
    """The shared launcher :func:`_launch` as a ctypes function ``(trampoline, n, ctx)``
    (its C wrapper; ctypes releases the GIL for the call)."""
    if not _launch_c:
        addr = _launch.separate.c_address(0)
        fnty = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)
        _launch_c.append(fnty(addr))
    return _launch_c[0]


def _trampoline(sig):
    """The address of ``void tramp(int64 i, int64 ctx)``, which calls the function at
    ``ctx[0]`` (a :class:`Separate` variant of signature ``sig``, in Numba's calling
    convention) with the arguments :func:`_pack_arg` packed from ``ctx[2]`` on (an array
    read from its NumPy object) and ``i`` last, and sets ``ctx[1]`` where it returns an
    error. One per signature in a process, emitted by :class:`_Engine` (5-8 ms; not
    cached on disk)."""
    key = tuple(sig.args)
    with _tramp_lock:
        if key not in _tramps:
            _tramps[key] = _build_trampoline(sig, len(_tramps))
        return _tramps[key]


def _build_trampoline(sig, serial):
    from numba.core.compiler_lock import global_compiler_lock
    with global_compiler_lock:  # Numba's code generator is used under its lock only
        return _emit_trampoline(sig, serial)


def _emit_trampoline(sig, serial):
    from llvmlite import ir
    from numba.core import cgutils
    from numba.core.registry import cpu_target
    # no ``context.refresh()``: nothing below needs Numba's registries (0.3-0.5 s to
    # load where no kernel had to be compiled); the casts are written out by hand
    context = cpu_target.target_context
    name = f"numbaconv_run_trampoline_{serial}"
    mod = context.codegen()._create_empty_module(name)
    i64 = ir.IntType(64)
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i64, i64]), name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    index, cp = fn.args
    p = b.inttoptr(cp, i64.as_pointer())

    def at(ptr, j):
        return b.load(b.gep(ptr, [ir.Constant(i64, j)]))

    fnty = context.call_conv.get_function_type(sig.return_type, sig.args)
    callee = b.inttoptr(at(p, 0), fnty.as_pointer())
    packer = context.call_conv._get_arg_packer
    # Numba's calling convention: a pointer for the return value, one for exception
    # information, then every argument flattened (an array as its struct's members:
    # meminfo, parent, nitems, itemsize, data, shape..., strides...)
    flat = []
    for j, d in enumerate(sig.args[:-1]):
        w = at(p, 2 + j)
        want = list(packer([d]).argument_types)
        if isinstance(d, nbtypes.Array):
            nd = d.ndim
            assert len(want) == 5 + 2 * nd, want
            obj = b.inttoptr(w, i64.as_pointer())
            dims = b.inttoptr(at(obj, _DIMS // 8), i64.as_pointer())
            strides = b.inttoptr(at(obj, _STRIDES // 8), i64.as_pointer())
            shape = [at(dims, i) for i in range(nd)]
            nitems = ir.Constant(i64, 1)
            for s in shape:
                nitems = b.mul(nitems, s)
            item = context.get_abi_sizeof(context.get_data_type(d.dtype))
            flat += [ir.Constant(want[0], None), ir.Constant(want[1], None), nitems,
                     ir.Constant(i64, item), b.inttoptr(at(obj, _DATA // 8), want[4]),
                     *shape, *[at(strides, i) for i in range(nd)]]
        elif isinstance(d, nbtypes.Boolean):
            flat.append(b.icmp_signed("!=", w, ir.Constant(i64, 0)))
        else:
            flat.append(_from_word(b, w, d))
        if not isinstance(d, nbtypes.Array):  # the value in Numba's argument type
            flat[-1] = context.data_model_manager[d].as_argument(b, flat[-1])
    flat.append(context.data_model_manager[sig.args[-1]].as_argument(
        b, _from_word(b, index, sig.args[-1])))
    ret = cgutils.alloca_once(b, fnty.args[0].pointee)
    exc = cgutils.alloca_once(b, fnty.args[1].pointee)
    code = b.call(callee, [ret, exc, *flat])
    ok = b.or_(b.icmp_signed("==", code, ir.Constant(code.type, 0)),     # RETCODE_OK
               b.icmp_signed("==", code, ir.Constant(code.type, -2)))    # RETCODE_NONE
    with cgutils.if_unlikely(b, b.not_(ok)):
        b.store(ir.Constant(i64, 1), b.gep(p, [ir.Constant(i64, 1)]))
    b.ret_void()
    return _jit_engine().add(str(mod), name)


def _from_word(b, w, d):
    """The 64-bit word ``w`` as a value of Numba type ``d`` (a float: its float64 bits,
    rounded to float32 where declared; an integer: its low ``d.bitwidth`` bits), as
    Numba's own casts from int64 and float64 would give it."""
    from llvmlite import ir
    if isinstance(d, nbtypes.Float):
        v = b.bitcast(w, ir.DoubleType())
        if d.bitwidth == 64:
            return v
        return b.fptrunc(v, ir.FloatType() if d.bitwidth == 32 else ir.HalfType())
    return w if d.bitwidth == 64 else b.trunc(w, ir.IntType(d.bitwidth))


_engine = []


class _Engine:
    """A machine-code engine of this process for the trampolines: LLVM's MCJIT at its
    lowest optimisation level, without Numba's per-library passes (a trampoline is a few
    loads and a call: 5-8 ms to emit where a Numba code library took 30-70 ms)."""

    def __init__(self):
        import llvmlite.binding as llvm
        self.llvm = llvm
        target = llvm.Target.from_triple(llvm.get_process_triple())
        self.tm = target.create_target_machine(opt=0, jit=True)
        self.ee = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self.tm)
        self.modules = []  # kept alive with the engine

    def add(self, ir_text, name):
        mod = self.llvm.parse_assembly(ir_text)
        mod.verify()
        self.ee.add_module(mod)
        self.ee.finalize_object()
        self.modules.append(mod)
        return self.ee.get_function_address(name)


def _jit_engine():
    if not _engine:
        _engine.append(_Engine())
    return _engine[0]


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


def separate(template=None, *, noalias=False, parallel=False, **variants):
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
        sep = Separate(fn, variants, noalias, parallel)
        call = sep.call
        call.table = sep.table
        call.dispatcher = sep.dispatcher
        call.separate = sep
        call.run = sep.run
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


def _variant(sep, args, what, index=False):
    """``(k, signature, name)`` of ``sep``'s first variant whose declared types ``args``
    fit (followed by an integer index where ``index``); else a typing error."""
    from numba.core import types
    from numba.core.errors import TypingError
    extra = 1 if index else 0
    for k, sig in enumerate(sep.signatures):
        if (len(sig.args) == len(args) + extra and all(map(_fits, args, sig.args))
                and (not index or isinstance(sig.args[-1], types.Integer))):
            return k, sig, sep.names[k]
    raise TypingError(f"{what}: no variant of {list(sep.names)} takes "
                      f"({', '.join(map(str, args))}{', index' if index else ''})")


def _cast_args(context, builder, star, args, target):
    """The values of the star-args tuple ``star`` cast to ``target``'s declared types."""
    from numba.core import cgutils, types
    vals = cgutils.unpack_tuple(builder, star, len(args))
    return [v if isinstance(d, types.Array) else context.cast(builder, v, a, d)
            for v, a, d in zip(vals, args, target.args)]


def _table_entry(context, builder, arr, j, message):
    """Entry ``j`` of the address table ``arr``; ``RuntimeError(message)`` where it is 0."""
    from llvmlite import ir
    from numba.core import cgutils
    addr = builder.load(builder.gep(arr.data, [ir.Constant(ir.IntType(64), j)]))
    with cgutils.if_unlikely(builder, builder.icmp_signed(
            "==", addr, ir.Constant(addr.type, 0))):
        context.call_conv.return_user_exc(builder, RuntimeError, (message,))
    return addr


def _not_compiled(sep, what, name):
    return (f"{sep.__name__}: {what} is not compiled; call {sep.__name__}.table({name!r}) "
            "before the kernel")


def _separate_call(sep):
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def call(typingctx, table, *args):
        k, target, name = _variant(sep, args, sep.__name__)

        def codegen(context, builder, signature, llargs):
            tab, star = llargs
            cast = _cast_args(context, builder, star, args, target)
            arr = context.make_array(signature.args[0])(context, builder, tab)
            addr = _table_entry(context, builder, arr, k,
                                _not_compiled(sep, f"variant {name!r}", name))
            fnty = context.call_conv.get_function_type(target.return_type, target.args)
            fn = builder.inttoptr(addr, fnty.as_pointer())
            status, _ = context.call_conv.call_function(builder, fn, target.return_type,
                                                        target.args, cast)
            with cgutils.if_unlikely(builder, status.is_error):
                context.call_conv.return_status_propagate(builder, status)
            return context.get_dummy_value()

        return types.none(table, types.StarArgTuple(args)), codegen

    return call


def _trampoline_call():
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def jump(typingctx, fn, i, ctx):
        """``fn(i, ctx)``: a trampoline of :data:`par_for` at address ``fn``."""
        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            fnty = ir.FunctionType(ir.VoidType(), [i64, i64])
            builder.call(builder.inttoptr(args[0], fnty.as_pointer()), list(args[1:]))
            return context.get_dummy_value()

        return types.void(types.int64, types.int64, types.int64), codegen

    return jump


_jump = _trampoline_call()


def _par_for():
    """``par_for(helper, table, n, *args)``: ``helper(table, *args, i)`` for every ``i`` in
    ``range(n)``, in parallel, from a serial kernel (``helper`` a :func:`separate` one).

    Numba compiles every function with a ``prange`` loop into a parfor: the loop body
    outlined into a function of its own, a gufunc wrapper and a threading-layer wrapper,
    each a code library that runs LLVM's passes over everything linked into it; about
    half a second of compile time per kernel, however small the body. Here one parallel
    loop (:func:`_launch`) serves every kernel: the call stores its arguments in a block on
    the caller's stack and passes the launcher the address of a trampoline, emitted in the
    caller's module, that loads them and calls the variant with the iteration's index
    (its last argument). Iterations are split over the threads as a ``prange`` in the
    kernel would split them. An iteration that raises sets a flag the call checks once
    the loop is over, and raises ``RuntimeError``."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.core.errors import TypingError
    from numba.extending import intrinsic

    @intrinsic
    def par_for(typingctx, row, table, n, *args):
        try:
            sep = row.templates[0].key.separate
        except (AttributeError, IndexError):
            raise TypingError(f"par_for: {row} is not a separate helper") from None
        k, target, name = _variant(sep, args, f"par_for({sep.__name__})", index=True)
        nvar = len(sep.names)

        def codegen(context, builder, signature, llargs):
            _, tab, count, star = llargs
            i64 = ir.IntType(64)
            cast = _cast_args(context, builder, star, args, target)
            count = context.cast(builder, count, signature.args[2], types.int64)
            arr = context.make_array(signature.args[1])(context, builder, tab)
            body = _table_entry(context, builder, arr, k,
                                _not_compiled(sep, f"variant {name!r}", name))
            launcher = _table_entry(context, builder, arr, nvar,
                                    _not_compiled(sep, "the parallel launcher", name))
            argtys = [context.get_value_type(t) for t in target.args[:-1]]
            ctxty = ir.LiteralStructType([i64, i64] + argtys)
            ctx = cgutils.alloca_once(builder, ctxty)
            zero32 = ir.Constant(ir.IntType(32), 0)

            def slot(b, p, j):
                return b.gep(p, [zero32, ir.Constant(ir.IntType(32), j)])

            builder.store(body, slot(builder, ctx, 0))
            builder.store(ir.Constant(i64, 0), slot(builder, ctx, 1))
            for j, v in enumerate(cast):
                builder.store(v, slot(builder, ctx, 2 + j))
            fnty = context.call_conv.get_function_type(target.return_type, target.args)
            tname = f"numbaconv_prange_{sep.dispatcher.py_func.__qualname__}_{name}"
            tramp = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [i64, i64]), tname)
            if tramp.is_declaration:
                tramp.linkage = "internal"
                tb = ir.IRBuilder(tramp.append_basic_block("entry"))
                index, cp = tramp.args
                p = tb.inttoptr(cp, ctxty.as_pointer())
                fn = tb.inttoptr(tb.load(slot(tb, p, 0)), fnty.as_pointer())
                vals = [tb.load(slot(tb, p, 2 + j)) for j in range(len(argtys))]
                vals.append(context.cast(tb, index, types.int64, target.args[-1]))
                status, _ = context.call_conv.call_function(tb, fn, target.return_type,
                                                            target.args, vals)
                with cgutils.if_unlikely(tb, status.is_error):
                    tb.store(ir.Constant(i64, 1), slot(tb, p, 1))
                tb.ret_void()
            lsig = _launch.separate.signatures[0]
            lty = context.call_conv.get_function_type(lsig.return_type, lsig.args)
            status, _ = context.call_conv.call_function(
                builder, builder.inttoptr(launcher, lty.as_pointer()), lsig.return_type,
                lsig.args, [builder.ptrtoint(tramp, i64), count, builder.ptrtoint(ctx, i64)])
            with cgutils.if_unlikely(builder, status.is_error):
                context.call_conv.return_status_propagate(builder, status)
            failed = builder.icmp_signed("!=", builder.load(slot(builder, ctx, 1)),
                                         ir.Constant(i64, 0))
            with cgutils.if_unlikely(builder, failed):
                context.call_conv.return_user_exc(
                    builder, RuntimeError,
                    (f"{sep.__name__}: a parallel iteration raised an exception",))
            return context.get_dummy_value()

        return types.none(row, table, n, types.StarArgTuple(args)), codegen

    return par_for


par_for = _par_for()


@separate("void(int64, int64, int64)", parallel=True, run="run")
def _launch(fn, n, ctx):
    """The one parallel loop every kernel runs its iterations through: ``fn(i, ctx)`` for
    ``i`` in ``prange(n)`` (see :data:`par_for`)."""
    for i in numba.prange(n):
        _jump(fn, i, ctx)
