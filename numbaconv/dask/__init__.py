"""numbaconv on Dask arrays: every op, lazily, chunk by chunk (extra ``dask``).

The same names and arguments as the NumPy API (``numbaconv.conv2d_backprop_filter``, ...,
``numbaconv.convolution``, ...). Data operands (``input``, ``out_backprop``,
``output_delta``) are ``dask.array`` arrays; filters may be NumPy or Dask arrays. Each op
returns a lazy ``dask.array`` array of the NumPy op's shape and dtype; nothing is computed
until ``.compute()``, ``dask.compute`` or a ``distributed`` client runs it.

Chunks may lie along the batch, every spatial axis, and (for grouped convolutions) the
channel axis when each chunk holds whole groups. Every block of the result is one NumPy-API
call on exactly the rows it needs (its halo, with the padding, stride and dilation of the
problem); weight gradients are partial sums per block, added in a fixed tree. See
docs/dask.md.
"""
try:
    import dask.array as _da
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError("numbaconv.dask needs Dask: pip install 'numbaconv[dask]' "
                      "(dask[array] and distributed)") from _exc

import dataclasses as _dc
import inspect as _inspect
import math as _math

import numpy as _np

from .. import planner as _planner
from ..api import _op as _opmod
from ..api import tf as _tf  # noqa: F401  (registers the TF-style ops)
from ..api import onednn as _onednn  # noqa: F401  (registers the generic ops)
from ..problem import numpy_dtype as _numpy_dtype
from . import _graph
from ._worker import NumbaconvSetup, worker_state

#: Partial weight gradients added per node of the reduction tree (an int >= 2); read when
#: an op is called. Up to this many partials are added by one task, the result's own.
SPLIT_EVERY = 8

#: The ops, by direction (docs/contract.md section 1).
OPS = {
    "fwd": ("conv2d", "depthwise_conv2d_native", "conv3d", "convolution"),
    "bwd_d": ("conv2d_backprop_input", "conv2d_backprop_input_v2",
              "depthwise_conv2d_native_backprop_input", "conv3d_backprop_input_v2",
              "convolution_backprop_data"),
    "bwd_w": ("conv2d_backprop_filter", "conv2d_backprop_filter_v2",
              "depthwise_conv2d_native_backprop_filter", "conv3d_backprop_filter_v2",
              "convolution_backprop_filters"),
}


def _is_device(v):
    return (hasattr(v, "__cuda_array_interface__")
            or getattr(v, "__cuda_ndarray__", False) is True)


def _check_dask(arr, arg):
    meta = getattr(arr, "_meta", None)
    if meta is not None and not isinstance(meta, _np.ndarray):
        raise TypeError(f"{arg}: a Dask array of {type(meta).__module__}."
                        f"{type(meta).__name__} chunks; numbaconv.dask takes Dask arrays of "
                        f"NumPy chunks (device arrays are not supported)")
    if isinstance(meta, _np.ma.MaskedArray):
        raise TypeError(f"{arg}: a Dask array of masked chunks is not supported; pass "
                        f"{arg}.map_blocks(np.ma.filled, 0)")
    if any(_math.isnan(c) for cs in arr.chunks for c in cs):
        raise ValueError(f"{arg}: the chunk sizes are unknown (NaN); call "
                         f"{arg}.compute_chunk_sizes() first")


def _check_strategy(strategy, tune):
    if strategy is not None and (not isinstance(strategy, str)
                                 or strategy not in _planner.STRATEGY_NAMES):
        raise ValueError(f"strategy: expected a family {list(_planner.FAMILIES)}, one entry "
                         f"{[n for n in _planner.STRATEGY_NAMES if n not in _planner.FAMILIES]}"
                         f" or None, got {strategy!r}")
    if not isinstance(tune, (bool, int)) or isinstance(tune, float):
        raise TypeError(f"tune: expected a bool, got {tune!r}")


def _roles(params):
    """The argument that carries each operand, for messages."""
    dy = "out_backprop" if "out_backprop" in params else "output_delta"
    return {"x": "input", "dy": dy, "w": "filter"}


def _check_split_every():
    v = SPLIT_EVERY
    if isinstance(v, bool) or not isinstance(v, int) or v < 2:
        raise ValueError(f"numbaconv.dask.SPLIT_EVERY: expected an int >= 2 (partial weight "
                         f"gradients added per node of the reduction tree), got {v!r}")
    return v


def _build(np_op, sig, direction, args, kwargs):
    bound = sig.bind(*args, **kwargs)
    values = bound.arguments
    if values.get("out") is not None:
        raise TypeError("out: not supported on Dask arrays (the result is a lazy Dask "
                        "array); write it with dask.array.store(result, target) or "
                        "result.compute()")
    strategy = values.get("strategy")
    tune = values.get("tune", False)
    _check_strategy(strategy, tune)
    standins = {}  # id(stand-in) -> (argument, Dask array, stand-in)
    given = {}  # id(value) -> argument, for NumPy values
    for arg, v in list(values.items()):
        if _is_device(v):
            raise TypeError(f"{arg}: a device array; numbaconv.dask takes Dask arrays of "
                            f"NumPy chunks (and NumPy filters): call numbaconv.{np_op.__name__}"
                            f" for device arrays")
        if isinstance(v, _da.Array):
            _check_dask(v, arg)
            # the parser reads shapes and dtypes only: a zero-stride stand-in of the shape
            s = _np.broadcast_to(_np.zeros((), v.dtype), v.shape)
            standins[id(s)] = (arg, v, s)
            values[arg] = s
        else:
            given[id(v)] = arg
    problem, operands = np_op.parse(*bound.args, **bound.kwargs)
    # the chunks are NumPy arrays: stream= and precision="tf32" are refused as on the host
    problem = _opmod.device_options(problem, False, values.get("stream"),
                                    values.get("precision"))
    names = _roles(sig.parameters)
    arrays = {}
    for role, arr in operands.items():
        hit = standins.get(id(arr))
        if hit is not None:
            names[role] = hit[0]
            arrays[role] = hit[1]
            continue
        arg = given.get(id(arr), names[role])
        if role != "w":
            raise TypeError(f"{arg}: expected a dask.array.Array, got "
                            f"{type(values.get(arg, arr)).__name__}; numbaconv.dask computes "
                            f"on Dask arrays (da.from_array({arg}, chunks=...)), or call "
                            f"numbaconv.{np_op.__name__} for NumPy arrays")
        names[role] = arg
        arrays[role] = arr
    dtype = _numpy_dtype(problem.dtype)
    if problem.empty:
        return _da.zeros(problem.result_shape, dtype=dtype)
    xim = problem.filter_format == "XIM"
    p = _dc.replace(problem, filter_format="XIO") if xim else problem
    nd = problem.ndim
    if "w" in arrays:
        w = arrays["w"]
        if xim:  # TF's depthwise [*X, C, M] is the generic XIO [*X, 1, C*M], groups C
            w = w.reshape(tuple(w.shape[:nd]) + (1, problem.oc))
        arrays["w"] = _graph.single_chunk(w)
    token = _graph.token_of(problem, {k: (a.name if isinstance(a, _da.Array) else a)
                                      for k, a in arrays.items()}, strategy, bool(tune),
                            SPLIT_EVERY)
    if direction == "fwd":
        return _graph.forward(p, arrays["x"], arrays["w"], names, token, strategy, tune)
    if direction == "bwd_d":
        return _graph.backward_data(p, arrays["dy"], arrays["w"], names, token, strategy,
                                    tune)
    dw = _graph.backward_weights(p, arrays["x"], arrays["dy"], names, token, strategy, tune,
                                 split_every=_check_split_every())
    if xim:
        dw = dw.reshape(problem.w_shape)
    return dw


def _wrap(op_name, direction):
    np_op = _opmod.REGISTRY[op_name]
    sig = _inspect.signature(np_op.parse)

    def dask_op(*args, **kwargs):
        try:
            return _build(np_op, sig, direction, args, kwargs)
        except (TypeError, ValueError) as exc:
            name = kwargs.get("name")
            if name is None and "name" in sig.parameters:
                try:
                    name = sig.bind(*args, **kwargs).arguments.get("name")
                except TypeError:
                    name = None
            _opmod._prefixed(exc, name)

    dask_op.__name__ = dask_op.__qualname__ = op_name
    dask_op.__signature__ = sig
    dask_op.__doc__ = (f"``numbaconv.{op_name}`` on Dask arrays: the same arguments, a lazy "
                       f"dask.array result (``out=`` is refused).\n\n"
                       f"The NumPy op's documentation follows.\n\n{np_op.__doc__ or ''}")
    return dask_op


for _direction, _names in OPS.items():
    for _n in _names:
        globals()[_n] = _wrap(_n, _direction)
del _direction, _names, _n

__all__ = [n for names in OPS.values() for n in names] + [
    "NumbaconvSetup", "worker_state", "SPLIT_EVERY", "OPS"]
