"""Strategies: each can decline a problem with a short reason, size its tiles, and run.

A strategy is a small object with:

* ``name`` and ``directions`` (a subset of ``fwd``, ``bwd_d``, ``bwd_w``);
* ``accepts(problem) -> None | reason`` (a flat run of guards, as oneDNN's ``init``);
* ``tiles(problem, machine) -> dict`` and ``workspace_bytes(problem, tiles) -> int``;
* ``run(problem, tiles, ops) -> result`` on canonical contiguous arrays (see
  :mod:`numbaconv.kernels`), importing its kernel module lazily so that importing numbaconv
  compiles nothing;
* ``bind(problem, tiles) -> call``: ``call(ops)`` is ``run(problem, tiles, ops)``, with
  what depends on the plan alone (shapes, geometry, the kernel) derived once; the backend
  binds a plan once and calls it on every run (a small layer's kernel takes 50-100 us, and
  its Python around it was a third of that);
* ``half_operands(problem, tiles) -> frozenset``: for float16 problems, the operands it
  takes as float16 bits (``uint16`` arrays in canonical layout; its kernels widen them as
  they load) and ``"result"`` when it returns float16 bits; the backend converts only the
  others (whole-array passes that cost as much as a bandwidth-bound kernel);
* ``bf16_operands(problem, tiles) -> frozenset``: the same for bfloat16 problems (bits of
  bfloat16 in ``uint16`` arrays);
* ``numba_parallel(problem, tiles) -> bool``: whether it computes in Numba parallel
  regions alone (no BLAS call, no Python worker threads), so that those conversion passes
  may run on every thread too (see :mod:`numbaconv.kernels.cpu.convert`).

The planner keeps, per direction, a best-first list ending in ``direct``, which accepts
every problem.
"""
import numpy as np


class Strategy:
    name = ""
    #: Several implementations may share a public strategy name (e.g. the depthwise variant
    #: of ``direct``); ``variant`` tells them apart in plans and traces.
    variant = ""
    directions = ("fwd", "bwd_d", "bwd_w")
    #: Whether its kernels take seconds to compile (explicit-SIMD micro-kernels and loop
    #: nests specialised by shape): the planner keeps such strategies from small problems,
    #: whose first call would otherwise pay a large layer's compile time (see
    #: ``numbaconv.config.SMALL_FLOPS``).
    compile_heavy = False
    #: Whether the planner takes it only for small problems (``config.SMALL_FLOPS``): an
    #: entry that compiles nothing but is slower than the compiled kernels beyond them.
    small_only = False

    def accepts(self, problem):
        return None

    def tiles(self, problem, machine):
        return {}

    def workspace_bytes(self, problem, tiles):
        return 0

    def run(self, problem, tiles, ops):  # pragma: no cover - abstract
        raise NotImplementedError

    def bind(self, problem, tiles):
        """``call(ops)``, equal to ``run(problem, tiles, ops)``; a strategy whose small
        problems are dominated by the Python of :meth:`run` overrides it."""
        run = self.run
        return lambda ops: run(problem, tiles, ops)

    def half_operands(self, problem, tiles):
        """What :meth:`run` takes (and returns) as float16 bits for a float16 problem; it
        must still run on float32 operands (as the tuner passes them)."""
        return frozenset()

    def bf16_operands(self, problem, tiles):
        """What :meth:`run` takes (and returns) as bfloat16 bits for a bfloat16 problem,
        as :meth:`half_operands`."""
        return frozenset()

    def numba_parallel(self, problem, tiles):
        """Whether :meth:`run` computes in Numba parallel regions alone. The backend's
        float16 conversions then run on every thread; otherwise serially, since the
        threads of a parallel conversion (OpenMP's) busy-wait on the cores for a while
        after it, as OpenBLAS's do after a GEMM, and fought the BLAS calls and Python
        worker threads that came next."""
        return False


def small(p):
    """Whether ``p`` is a small problem: below ``config.SMALL_FLOPS``, it runs on strategies
    and engines whose kernels compile in about a second. A depthwise problem (one channel
    per group) is small only below ``config.SMALL_DEPTHWISE_FLOPS``: its compiled kernels
    take about 2 s to compile and are 3-20 times faster than NumPy from there on."""
    return 0 < p.flops < small_limit(p)


def small_limit(p):
    """The FLOPs below which ``p`` is small (see :func:`small`); 0: none is."""
    from .. import config
    limit = config.SMALL_FLOPS
    if limit and p.g == p.ic and p.g > 1 and config.SMALL_DEPTHWISE_FLOPS:
        limit = min(limit, config.SMALL_DEPTHWISE_FLOPS)
    return limit


def label(s):
    return f"{s.name}[{s.variant}]" if s.variant else s.name


def canonical_shapes(p):
    """Canonical ``x``, ``y`` and ``w`` shapes of a problem (see numbaconv.kernels)."""
    return ((p.mb, *p.isz, p.ic), (p.mb, *p.osz, p.oc), (*p.ksz, p.icg, p.oc))


def geo(p):
    """The kernels' int64 geometry vector of ``p``, built once per problem object and kept
    in its ``__dict__`` (5 us of a call that may take 200; the kernels only read it)."""
    g = p.__dict__.get("_geo")
    if g is None:
        from ..kernels import geometry
        g = geometry(p.mb, p.g, p.icg, p.ocg, p.isz, p.ksz, p.osz, p.stride, p.dilation,
                     p.pad_begin)
        p.__dict__["_geo"] = g
    return g


def w_padding(p):
    """``(left, width)`` of the input zero-padded along w for gathers along it: pixel ``i``
    at ``left + i``, every tap of every output pixel inside."""
    iw, kw, ow, sw, dw, pw = p.isz[2], p.ksz[2], p.osz[2], p.stride[2], p.dilation[2], \
        p.pad_begin[2]
    return pw, max(iw + pw, (ow - 1) * sw + (kw - 1) * dw + 1)


def result_dtype(operand, compute):
    """The dtype of a result computed from ``operand``: ``uint16`` (float16 bits, see
    ``half_operands``) where the operand came as float16 bits, else ``compute``."""
    return np.uint16 if operand.dtype == np.uint16 else compute


#: A result is written with non-temporal (streaming) stores, where a kernel can, when the
#: call's operands and result together take at least this share of the L3: they cannot all
#: stay in it, and a dX sent through the caches costs a read for ownership of every line and
#: evicts the operands. Below it plain stores into L3 outrun DRAM (measured:
#: docs/performance.md, Numbers behind the constants).
STREAM_L3_FRACTION = 0.75


def streams(footprint_elems, p, machine):
    """Whether a call whose operands and result hold ``footprint_elems`` elements of
    ``p``'s compute dtype streams its result (see :data:`STREAM_L3_FRACTION`)."""
    return footprint_elems * itemsize(p) >= machine.l3_bytes * STREAM_L3_FRACTION


def itemsize(p):
    return np.dtype(p.compute_dtype).itemsize
