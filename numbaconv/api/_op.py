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
#: among the arguments). Parsing a call is 30-40 us of Python (70-100 us right after a
#: kernel has evicted it from the caches), a tenth of a small layer.
PARSE_MEMO_SIZE = 512
_MEMO = {}
_NO_KEY = object()


def _value_key(v, depth=0):
    """A hashable stand-in for one argument that decides everything parsing sees of it, or
    ``_NO_KEY``: float arrays by type, shape, dtype and strides (their values are never
    read), small integer arrays and scalars by value (with their type: ``True`` is not
    ``1``), lists and tuples item by item; anything else is not memoised."""
    t = type(v)
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
    return _NO_KEY


def clear_memo():
    """Forget the parsed calls (and the plans they keep)."""
    _MEMO.clear()


planner.on_clear(clear_memo)


def _parse(parse, args, kwargs):
    """``parse(*args, **kwargs)``, from the memo when an earlier call had equal arguments
    (by :func:`_value_key`) and every operand it returned was one of the arguments itself.

    Returns ``(problem, operands, entry)``: ``entry`` is the memo's mutable record of this
    call (``[problem, where, (plan key, plan)]``), or None when the call is not memoised. Every
    operand of a memoised call is a NumPy array the caller passed (a device array has no
    key), so it runs on the host.
    """
    pos = tuple([_value_key(a) for a in args])
    named = tuple([(k, _value_key(v)) for k, v in kwargs.items()]) if kwargs else ()
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
        where = []
        for name, arr in operands.items():
            i = next((i for i, a in enumerate(flat) if a is arr), None)
            if i is None:  # converted while parsing (a list, a device array): parse again
                return problem, operands, None
            where.append((name, i))
        if len(_MEMO) >= PARSE_MEMO_SIZE:
            _MEMO.clear()
        entry = [problem, tuple(where), None]
        _MEMO[key] = entry
        return problem, operands, entry
    return problem, operands, None


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

    @functools.wraps(parse)
    def public(*args, **kwargs):
        try:
            problem, operands, entry = _parse(parse, args, kwargs)
            out = _arg(args, kwargs, "out")
            tune = _arg(args, kwargs, "tune")
            stream = _arg(args, kwargs, "stream")
            precision = _arg(args, kwargs, "precision")
            if (entry is not None and (tune is None or tune is False) and not config.VERBOSE
                    and stream is None and precision is None):
                # a memoised call (host arrays only; strategy= and out's shape in the key):
                # its plan, made for the present threads and planner settings
                # (one slot, replaced whole: Python threads may differ in Numba's threads)
                pkey = (runtime.threads(), planner._settings())
                kept = entry[2]
                if kept is None or kept[0] != pkey:
                    kept = (pkey, planner.make_plan(problem, strategy=_arg(args, kwargs,
                                                                           "strategy"),
                                                    device="cpu"))
                    entry[2] = kept
                # without config.THREADS the plan's threads are the calling thread's own
                return cpu.execute(kept[1], operands, out=out,
                                   threads_current=not config.THREADS)
            device = cuda.on_device(operands, out)  # TypeError when host and device mix
            problem = device_options(problem, device, stream, precision)
            if device:
                cuda.check_stream(stream)  # before planning: a bad stream names stream
            the_plan = planner.make_plan(problem, strategy=_arg(args, kwargs, "strategy"),
                                         tune=False if tune is None else tune,
                                         operands=operands,
                                         device="cuda" if device else "cpu")
            if device:
                return cuda.execute(the_plan, operands, out=out, stream=stream)
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
