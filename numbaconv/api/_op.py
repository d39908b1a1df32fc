"""How a public function becomes an op: parse -> plan -> execute.

A front-end function is written as a parser with the public signature that returns
``(problem, operands)``; :func:`op` wraps it into the public function, which plans the
problem and runs the plan, and registers it for :func:`numbaconv.plan`.
"""
import dataclasses
import functools
import inspect

import numpy as np

from .. import config, planner, runtime
from ..backends import cpu, cuda

REGISTRY = {}

#: Parsed calls kept per process: (op, argument key) -> (problem, where each operand sits
#: among the arguments, the plan or the prepared GPU launches). Parsing a call is 30-40 us
#: of Python (70-100 us right after a kernel has evicted it from the caches), a tenth of a
#: small layer; a device call's whole host time is to stay under 50 us.
PARSE_MEMO_SIZE = 512
_MEMO = {}
_NO_KEY = object()


#: numba's device array types (the simulator's too) seen so far: keyed by shape, dtype and
#: strides, which numba keeps as a tuple, a NumPy dtype and a tuple.
_DEVICE_TYPES = set()


def _value_key(v, depth=0):
    """A hashable stand-in for one argument that decides everything parsing sees of it, or
    ``_NO_KEY``: float arrays by type, shape, dtype and strides (their values are never
    read), small integer arrays and scalars by value (with their type: ``True`` is not
    ``1``), lists and tuples item by item; anything else is not memoised."""
    t = type(v)
    if t in _DEVICE_TYPES:  # (a numba device array type seen before: the common device call)
        return ("d", t, v.shape, v.dtype, v.strides)
    if t is np.ndarray:
        dt = v.dtype
        kind = dt.kind
        if kind == "f" or kind == "V" and dt.name == "bfloat16":  # (ml_dtypes' kind is V)
            return ("f", v.shape, dt, v.strides)
        if (kind == "i" or kind == "u") and v.size <= 16:
            return ("i", v.shape, dt, v.tobytes())
        return _NO_KEY
    if t is int or t is str or v is None or t is bool or t is float:
        return (t, v)
    if t is tuple or t is list:
        if depth >= 2 or len(v) > 16:
            return _NO_KEY
        for x in v:
            if type(x) is not int:
                break
        else:  # all plain ints: the common shape, stride and pad lists
            return (t, tuple(v))
        items = tuple([_value_key(x, depth + 1) for x in v])
        return _NO_KEY if _NO_KEY in items else (t, "items", items)
    if isinstance(v, np.integer):
        return (t, int(v))
    if getattr(v, "__cuda_ndarray__", False) is True:  # numba's device arrays (simulated too)
        strides = getattr(v, "strides", None)
        if (type(strides) is not tuple or type(v.shape) is not tuple
                or not isinstance(v.dtype, np.dtype)):
            return _NO_KEY
        _DEVICE_TYPES.add(t)
        return ("d", t, v.shape, v.dtype, strides)
    try:  # (PyTorch refuses the interface of a tensor that requires grad: parsing says so)
        cai = getattr(v, "__cuda_array_interface__", None)
        if type(cai) is dict:  # CuPy, PyTorch: the fields numba's wrapper depends on, not
            if cai.get("mask") is not None:  # the data pointer or the stream
                return _NO_KEY
            strides = cai.get("strides")
            return ("c", t, tuple(cai["shape"]), cai["typestr"],
                    None if strides is None else tuple(strides), cai.get("version"))
    except Exception:
        pass
    return _NO_KEY


#: The key of ``stream=``: a call's stream is honoured per call, never part of the memo's key.
_STREAM = ("stream",)


def _device_source(arr, flat):
    """The index in ``flat`` of the one device argument that ``arr`` (a numba device array
    the parser made of it) wraps: same data pointer and shape; None where none or several
    do."""
    try:
        ptr = arr.__cuda_array_interface__["data"][0]
        shape = tuple(arr.shape)
        found = {i for i, a in enumerate(flat)
                 if type(getattr(a, "__cuda_array_interface__", None)) is dict
                 and a.__cuda_array_interface__["data"][0] == ptr
                 and tuple(a.__cuda_array_interface__["shape"]) == shape}
    except Exception:
        return None
    return found.pop() if len(found) == 1 else None


def clear_memo():
    """Forget the parsed calls (and the plans and prepared GPU launches they keep)."""
    _MEMO.clear()
    cuda.clear_prepared()


planner.on_clear(clear_memo)


def _parse(parse, args, kwargs, names=()):
    """``parse(*args, **kwargs)``, from the memo when an earlier call had equal arguments
    (by :func:`_value_key`; ``stream=`` is not part of the key) and every operand it
    returned was one of the arguments itself, or a numba device array wrapping one
    (CuPy, PyTorch). From the memo the operands are the caller's own objects: those
    that parsing wrapped are wrapped again by :func:`_wrapped` where the general path
    needs numba device arrays (the fast path only reads their addresses).

    Returns ``(problem, operands, entry)``: ``entry`` is the memo's mutable record of this
    call (``[problem, where, (plan key, plan), on device, (GPU settings, prepared
    launches), wrapped]``: the last three filled by the first call that runs), or None when
    the call is not memoised. ``names``: the parser's parameter names, in order (the
    names a wrapped operand's errors carry).
    """
    pos = tuple([_value_key(a) for a in args])
    named = tuple([(k, _STREAM if k == "stream" else _value_key(v))
                   for k, v in kwargs.items()]) if kwargs else ()
    key = (parse, pos, named)
    memo = (PARSE_MEMO_SIZE > 0 and _NO_KEY not in pos
            and all(k[1] is not _NO_KEY for k in named))
    if memo:
        hit = _MEMO.get(key)
        if hit is not None:
            flat = args + tuple(kwargs.values()) if kwargs else args
            return hit[0], {name: flat[i] for name, i in hit[1]}, hit
    problem, operands = parse(*args, **kwargs)
    if memo:
        flat = args + tuple(kwargs.values())
        keys = tuple(kwargs)
        where, wrapped = [], {}
        for name, arr in operands.items():
            i = next((i for i, a in enumerate(flat) if a is arr), None)
            if i is None:  # converted while parsing: a device array numba wraps, or a list
                i = _device_source(arr, flat) if cuda.is_device_array(arr) else None
                if i is None:
                    return problem, operands, None  # (a list: parse again)
                wrapped[name] = (names[i] if i < len(args) and i < len(names)
                                 else keys[i - len(args)] if i >= len(args) else name)
            where.append((name, i))
        if len(_MEMO) >= PARSE_MEMO_SIZE:
            _MEMO.clear()
        entry = [problem, tuple(where), None, None, None, wrapped]
        _MEMO[key] = entry
        return problem, operands, entry
    return problem, operands, None


def _wrapped(entry, operands):
    """``operands`` with the caller's CuPy/PyTorch arrays that parsing wrapped as numba
    device arrays wrapped again (zero-copy; a numba device array stays as it is)."""
    wrapped = entry[5]
    if not wrapped:
        return operands
    return {name: (cuda.as_device_array(a, wrapped[name]) if name in wrapped else a)
            for name, a in operands.items()}


def _prefixed(exc, name):
    """Re-raise a TypeError/ValueError with TF's ``name`` label in front."""
    if name is None or not isinstance(name, str) or not name:
        raise exc
    raise type(exc)(f"{name}: {exc}") from None


def device_options(problem, device, stream, precision):
    """Check a call's ``stream=`` and ``precision=`` against where it runs; returns the
    problem with its precision set.

    Both belong to device calls: on NumPy operands ``stream`` (anything but None) is a
    ValueError, as is ``precision="tf32"`` (the CPU kernels have no TF32 arithmetic, and a
    host call silently computing at another precision than asked would hide the mistake).
    ``precision="tf32"`` also needs float32 operands. A bad stream object is the backend's
    TypeError naming ``stream``.
    """
    if precision is not None:
        if not isinstance(precision, str):
            raise TypeError(f"precision: expected None, 'exact' or 'tf32', got "
                            f"{precision!r}")
        if precision.lower() not in ("tf32", "exact"):
            raise ValueError(f"precision: expected None, 'exact' or 'tf32', got {precision!r}")
        precision = precision.lower()
    if not device:
        if stream is not None:
            raise ValueError(f"stream: {type(stream).__name__} given for a call on NumPy "
                             f"arrays; a stream orders device work only: pass device arrays "
                             f"(CuPy, PyTorch CUDA tensors, numba device arrays) or drop "
                             f"stream=")
        if precision == "tf32":
            raise ValueError("precision: 'tf32' runs on the GPU's tensor cores only; this "
                             "call's operands are NumPy arrays, computed in exact "
                             f"{problem.dtype}: drop precision= or pass device arrays")
    if precision == "tf32":
        if problem.dtype != "float32":
            raise ValueError(f"precision: 'tf32' applies to float32 operands, got "
                             f"{problem.dtype}; pass float32 arrays or drop precision=")
        return dataclasses.replace(problem, precision="tf32")
    return problem


def op(parse):
    """Turn a parser ``(args...) -> (ConvProblem, operands)`` into the public op."""
    sig = inspect.signature(parse)
    params = list(sig.parameters.values())
    # where each of the wrapper's own arguments sits: (positional index or None, default)
    where = {}
    for i, prm in enumerate(params):
        if prm.name in ("name", "out", "strategy", "tune", "stream", "precision"):
            positional = prm.kind in (prm.POSITIONAL_ONLY, prm.POSITIONAL_OR_KEYWORD)
            default = None if prm.default is prm.empty else prm.default
            where[prm.name] = (i if positional else None, default)

    def _arg(args, kwargs, key):
        """The caller's value of one of the wrapper's own arguments (``name``, ``out``,
        ``strategy``, ``tune``, ``stream``, ``precision``; the parser
        has checked the call against the signature; ``inspect.Signature.bind`` cost 10-40
        us of a call that may take 300)."""
        if key not in where:
            return None
        if key in kwargs:
            return kwargs[key]
        i, default = where[key]
        return args[i] if i is not None and i < len(args) else default

    names = tuple(prm.name for prm in params)

    @functools.wraps(parse)
    def public(*args, **kwargs):
        try:
            problem, operands, entry = _parse(parse, args, kwargs, names)
            out = _arg(args, kwargs, "out")
            tune = _arg(args, kwargs, "tune")
            stream = _arg(args, kwargs, "stream")
            precision = _arg(args, kwargs, "precision")
            untuned = tune is None or tune is False
            if entry is not None and not config.VERBOSE:
                device = entry[3]
                if device is None:  # (the call's first run; TypeError when host and device mix)
                    device = entry[3] = cuda.on_device(operands, out)
                if not device and stream is None and precision is None:
                    strategy = _arg(args, kwargs, "strategy")
                    if not untuned:
                        # tune=True (checked by the planner): the planner keeps the tuned
                        # plan while the tuning cache file is unchanged (one stat)
                        the_plan = planner.make_plan(problem, strategy=strategy, tune=tune,
                                                     device="cpu")
                    else:
                        # a memoised host call (strategy= and out's shape in the key): its
                        # plan, made for the present threads and planner settings (one
                        # slot, replaced whole: Python threads may differ in Numba's threads)
                        pkey = (runtime.threads(), planner._settings())
                        kept = entry[2]
                        if kept is None or kept[0] != pkey:
                            kept = (pkey, planner.make_plan(problem, strategy=strategy,
                                                            device="cpu"))
                            entry[2] = kept
                        the_plan = kept[1]
                    # without config.THREADS the plan's threads are the calling thread's own
                    return cpu.execute(the_plan, operands, out=out,
                                       threads_current=not config.THREADS)
                if device and untuned:
                    # a memoised device call (strategy=, precision= and the layouts of the
                    # operands and out in the key): its launches, prepared once for the
                    # present config.CUDA_* settings, replayed through the driver once
                    # recorded (cuda.run_fast); the stream is the call's own
                    gkey = cuda.settings()
                    kept = entry[4]
                    if kept is not None and kept[0] == gkey and kept[1].fast:
                        res = cuda.run_fast(kept[1], operands, out, cuda.check_stream(stream))
                        if res is not None:
                            return res
                    operands = _wrapped(entry, operands)
                    if kept is None or kept[0] != gkey:
                        problem = device_options(problem, True, stream, precision)
                        cuda.check_stream(stream)  # before planning: a bad stream names it
                        the_plan = planner.make_plan(problem, strategy=_arg(args, kwargs,
                                                                            "strategy"),
                                                     device="cuda")
                        dst = cuda.check_out(out, problem)
                        kept = (gkey, cuda.prepare(the_plan, operands, dst))
                        entry[4] = kept
                    else:
                        dst = cuda.device_out(out)
                    res = cuda.run_prepared(kept[1], operands, dst, cuda.check_stream(stream))
                    return out if out is not None else res
            device = cuda.on_device(operands, out)  # TypeError when host and device mix
            problem = device_options(problem, device, stream, precision)
            if device:
                cuda.check_stream(stream)  # before planning: a bad stream names stream
            the_plan = planner.make_plan(problem, strategy=_arg(args, kwargs, "strategy"),
                                         tune=False if tune is None else tune,
                                         operands=operands,
                                         device="cuda" if device else "cpu")
            if device:
                res = cuda.execute(the_plan, operands, out=out, stream=stream)
                return out if out is not None else res
            return cpu.execute(the_plan, operands, out=out)
        except (TypeError, ValueError) as exc:
            _prefixed(exc, _arg(args, kwargs, "name"))

    public.parse = parse
    REGISTRY[parse.__name__] = public
    return public


def plan(op, *args, strategy=None, tune=False, **kwargs):
    """Plan an op without running it.

    Parameters
    ----------
    op : str or callable
        The op's name (e.g. ``"conv2d_backprop_filter"``) or the function itself.
    *args, **kwargs
        The op's own arguments: arrays (only their shapes and dtype are used), or shapes
        where the op takes shapes.
    strategy : {"direct", "gemm", "winograd"}, optional
        Force a strategy; ValueError naming the strategy and its reason if it declines.
    tune : bool
        Time the accepted candidates once and cache the winner on disk.

    Returns
    -------
    Plan
        Immutable: ``strategy``, ``tiles``, ``threads``, ``flops``, ``workspace_bytes``;
        ``str(plan)`` explains the choice in one line.

    Examples
    --------
    >>> import numpy as np, numbaconv
    >>> x = np.zeros((8, 56, 56, 64), np.float32); dy = np.zeros((8, 56, 56, 64), np.float32)
    >>> p = numbaconv.plan("conv2d_backprop_filter", x, [3, 3, 64, 64], dy, 1, "SAME")
    >>> p.flops
    1849688064
    """
    from .. import planner

    if callable(op):
        fn = REGISTRY.get(getattr(op, "__name__", None))
        if fn is None or getattr(fn, "parse", None) is not getattr(op, "parse", None):
            raise ValueError(f"op: {op!r} is not a numbaconv op; known ops: "
                             f"{', '.join(sorted(REGISTRY))}")
    elif isinstance(op, str):
        fn = REGISTRY.get(op)
        if fn is None:
            raise ValueError(f"op: unknown op {op!r}; known ops: {', '.join(sorted(REGISTRY))}")
    else:
        raise TypeError(f"op: expected an op name or function, got {type(op).__name__}")
    problem, operands = fn.parse(*args, **kwargs)
    from ..backends.cuda import on_device
    problem = device_options(problem, bool(operands) and on_device(operands),
                             kwargs.get("stream"), kwargs.get("precision"))
    return planner.make_plan(problem, strategy=strategy, tune=tune, operands=operands)
