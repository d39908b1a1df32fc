"""The planner: per direction an ordered list of strategies, an immutable Plan, tuning.

As oneDNN's ``cpu_convolution_list.cpp``: each direction has a best-first list of strategies
ending in ``direct``, which accepts everything. Each strategy's ``accepts(problem)`` returns
``None`` or a short reason; the first that accepts wins, unless ``strategy=`` forces one (a
forced strategy that declines is a ValueError naming it and its reason) or ``tune=True``
times every accepted candidate once and caches the winner on disk (as cuDNN's benchmark
mode, Triton's autotune or FFTW's wisdom). ``NUMBACONV_VERBOSE=1`` prints the dispatch trace.

Every kernel choice is one entry, ``family[variant]`` (``Plan.strategy`` is the family,
``Plan.variant`` the variant); the tiles only size it (and pick the GEMM engine, Numba
micro-kernel or BLAS: ``engine=``). Best first, per direction (:data:`LABELS`):

* ``fwd``: numpy[depthwise], numpy, winograd, direct[grouped], gemm[identity], gemm[slabs],
  direct[depthwise-unrolled], direct[depthwise-spans], direct[depthwise], direct
* ``bwd_d``: numpy[depthwise], numpy, winograd, gemm[grouped], direct[grouped],
  gemm[regions], gemm[implicit], gemm[claimed], gemm[identity], gemm[per-tap], gemm[slabs],
  gemm[col2im], direct[depthwise-rows], direct[depthwise-unrolled], direct[depthwise-spans],
  direct[depthwise], direct
* ``bwd_w``: numpy[depthwise], numpy, winograd, gemm[patch-t], direct[grouped],
  gemm[windows], gemm[patch], gemm[rows], gemm[split-k], gemm[identity], gemm[split-dw],
  gemm[slabs], direct[narrow], direct[depthwise-rows], direct[depthwise-spans],
  direct[depthwise], direct

What each takes, in brief (its ``accepts`` has the guards and the reasons):

* ``numpy[depthwise]``: small depthwise problems with multiplier 1 (one elementwise
  product per tap in NumPy);
* ``numpy``: problems under ``config.SMALL_FLOPS`` only (per-tap matrix products in NumPy:
  nothing to compile); below that limit the planner also passes over every entry whose
  kernels take seconds to compile (``compile_heavy``), see :func:`compile_guard`;
* ``winograd``: 3x3 at stride 1, one group, >= 64 channels, enough tiles;
* ``gemm[grouped]``: backward data, square groups of one vector of channels (16 float32 or
  8 float64: ResNeXt's third stage), AVX-512 hosts, strided layers only over <= 256 dY
  pixels per image, not float16 (register tiles across 4 groups, dY read in place);
* ``direct[grouped]``: >= 8 groups of <= 64 channels (not depthwise); 2-7 groups where
  every GEMM declines them (< 16 channels per group);
* ``gemm[patch-t]``: >= 16 input and <= 48 output channels per group (<= 128 over short
  rows, 1x1 and 5x5 over <= 64 inputs; <= 512 for large 3-D volumes; groups: whole
  vectors and tile rows of them; one group: >= 32 outputs in tiles of 12 only over rows
  of < 32 pixels, not 1x1; heads of 2-7 outputs over <= 64 inputs in tiles of 2, 1x1
  only with an even number of outputs), little padding waste (Numba engine);
* ``gemm[windows]``: backward weights, one group, >= 64 input and output channels, at
  least a fifth of an im2col GEMM's work on the padding (dilated layers with wide pads,
  3-D layers over few slices): one BLAS GEMM per tap over its valid window (nothing
  compiled);
* ``gemm[patch]``: one group, 8-128 output channels, either <= 4 input channels (a stem)
  or output rows of >= 19 pixels with short ends, 1x1 only over <= 32 input channels
  (Numba engine);
* ``gemm[rows]``: one group, few weights per tap row, <= 64 output channels (Numba engine);
* ``gemm[regions]``: ``gemm[implicit]``'s problems where a stride phase's taps read only
  dY's padding for at least 10% of its products (dilated layers, large filters over small
  images), not float16: region by region, each summing only the taps that reach inside;
* ``gemm[implicit]``: at most 4 groups (one at a time), whole vectors of input channels
  (Numba engine);
* ``gemm[split-k]``: 1x1 at stride 1 without pads, when the engine is Numba's;
* ``gemm[claimed]``: 1x1 at stride 1 (grouped: one GEMM per group), W^T within half of L2,
  the Numba engine;
* ``gemm[identity]``: any other 1x1 GEMM on the arrays themselves (no packing), also
  forward into and backward data from fewer than 8 channels (a few result columns, on
  BLAS: ``_gemm_common.narrow_blas``);
* ``gemm[per-tap]``: <= 512 rows per stride phase, several taps;
* ``gemm[split-dw]``: several workers, a short reduction into a dW at least as large as
  its packed columns;
* ``gemm[slabs]``: im2col slabs, any problem with >= 8 result columns per GEMM (groups of
  >= 16 channels), as every ``gemm`` entry requires, and forward passes into fewer
  output channels of one group (on BLAS);
* ``gemm[col2im]``: one group, < 8 input channels, >= 16 taps x channels;
* ``direct[narrow]``: backward weights, one group, < 8 output channels, at least as many
  input channels, a partial dW within 16 KiB (heads: channels of the input innermost);
* ``direct[depthwise-rows]``: depthwise 3x3, multiplier 1, column stride 1 or 2, column
  dilation 1;
* ``direct[depthwise-unrolled]``: depthwise 3x3, multiplier 1 (backward data: stride 1,
  no depth padding, >= 256 bytes of channels per pixel);
* ``direct[depthwise-spans]``: depthwise, multiplier 1 (forward: column stride 1, at most
  1 KiB of channels per pixel);
* ``direct[depthwise]``: any depthwise problem;
* ``direct``: everything.

``strategy=`` takes a family (its first accepting entry) or one entry's label.
"""
from collections.abc import Mapping
from dataclasses import dataclass
import sys
import threading

from . import config, runtime
from .problem import ConvProblem
from .strategies import label, small, small_limit
from .strategies.direct import DIRECT

#: ``strategy=`` with a family name runs that family's first accepting entry, best first.
FAMILIES = ("numpy", "direct", "gemm", "winograd")
#: Every entry, best first (``_strategies()``; a test keeps the two equal); ``strategy=``
#: with one of these runs exactly that entry (``direct`` and ``winograd`` are family names).
LABELS = ("numpy[depthwise]", "numpy", "gemm[bf16-amx-taps]", "gemm[bf16-amx]", "gemm[bf16-regions]", "gemm[bf16-wgrad]",
          "gemm[bf16-dot]", "winograd", "gemm[patch-t]", "gemm[grouped]", "direct[grouped]",
          "gemm[windows]", "gemm[patch]", "gemm[rows]", "gemm[regions]", "gemm[implicit]",
          "gemm[split-k]", "gemm[claimed]", "gemm[identity]",
          "gemm[per-tap]", "gemm[split-dw]", "gemm[slabs]", "gemm[col2im]", "direct[narrow]",
          "direct[depthwise-rows]", "direct[depthwise-unrolled]", "direct[depthwise-spans]",
          "direct[depthwise]", "direct")
STRATEGY_NAMES = FAMILIES + tuple(n for n in LABELS if n not in FAMILIES)

R_SMALL = ("small problem ({mflop:.2g} MFLOP < {limit:g}): its kernels take seconds to "
           "compile, more than such a problem could ever gain")
R_NOT_SMALL = ("not a small problem ({mflop:.1f} MFLOP >= {limit:g}): the compiled kernels "
               "are faster")


def compile_guard(strategy, problem):
    """The planner's own reason to pass over ``strategy`` for ``problem``, or None: small
    problems do not pay a heavy strategy's compile time, and the NumPy entry, which
    compiles nothing, serves small problems only (``config.SMALL_FLOPS``)."""
    if strategy.compile_heavy and small(problem):
        return R_SMALL.format(mflop=problem.flops / 1e6, limit=small_limit(problem) / 1e6)
    if strategy.small_only and not small(problem):
        return R_NOT_SMALL.format(mflop=problem.flops / 1e6,
                                  limit=small_limit(problem) / 1e6)
    return None


#: Where each entry lives, best first: ``(module of numbaconv.strategies, attribute)``; an
#: attribute ending in ``*`` holds several entries. The modules are imported as the planner
#: reaches them, so that a small problem, which the ``numpy`` entries at the head take,
#: imports none of the compiled entries' modules (their kernel modules declare their
#: intrinsics and dispatchers at import: about 0.1 s in all).
_ORDER = (("numpy_taps", "DEPTHWISE"), ("numpy_taps", "STRATEGY"), ("bf16amx", "TAPS"),
          ("bf16amx", "STRATEGY"), ("bf16regions", "STRATEGY"), ("bf16wgrad", "STRATEGY"),
          ("bf16dot", "STRATEGY"), ("winograd", "STRATEGY"), ("patcht", "STRATEGY"),
          ("ggemm", "STRATEGY"), ("grouped", "STRATEGY"), ("windows", "STRATEGY"),
          ("patch", "STRATEGY"), ("rowgemm", "STRATEGY"), ("igemm", "REGIONS"),
          ("igemm", "STRATEGY"), ("gemm", "STRATEGIES*"), ("col2im", "STRATEGY"),
          ("narrow", "STRATEGY"), ("depthwise", "STRATEGIES*"), ("direct", "DIRECT"))

#: The entries resolved so far, best first, and how many of :data:`_ORDER`'s items they
#: come from (extended under the lock: planning threads may meet here).
_RESOLVED = []
_RESOLVED_ITEMS = [0]
_RESOLVE_LOCK = threading.Lock()


def _iter_strategies():
    """Every entry, best first, importing each module only when its first entry is
    reached (a new strategy is one more entry in :data:`_ORDER`)."""
    import importlib
    i = 0
    while True:
        while i < len(_RESOLVED):
            yield _RESOLVED[i]
            i += 1
        with _RESOLVE_LOCK:
            if i < len(_RESOLVED):  # another thread resolved more meanwhile
                continue
            k = _RESOLVED_ITEMS[0]
            if k == len(_ORDER):
                return
            module, attr = _ORDER[k]
            mod = importlib.import_module(f"{__package__}.strategies.{module}")
            got = getattr(mod, attr.rstrip("*"))
            _RESOLVED.extend(got if attr.endswith("*") else (got,))
            _RESOLVED_ITEMS[0] = k + 1


def _strategies():
    """Best-first candidates, all of them."""
    return list(_iter_strategies())


def _forced(cands, strategy):
    """The entries of ``cands`` that ``strategy=`` names: a family's, or one entry."""
    if strategy in FAMILIES:
        return [s for s in cands if s.name == strategy]
    return [s for s in cands if label(s) == strategy]


def candidates(direction):
    return [s for s in _strategies() if direction in s.directions]


#: Plans already made in this process, keyed by everything a plan depends on: the problem,
#: ``strategy=``, the thread count and the planner's settings in :mod:`numbaconv.config`.
#: Planning a layer costs 40-60 us of Python; a depthwise layer's whole call takes 300-500
#: us. A tuned plan (``tune=True``) is kept with the version of the tuning cache on disk it
#: was made under (``tune.cache_stamp``), and planned afresh once another process (or a
#: user) has changed the file: reading the file on every call cost about 0.5 ms. A
#: winner that could not be saved is not kept: the next call tunes and tries again.
#: ``NUMBACONV_VERBOSE`` always plans afresh (the dispatch trace is its to print).
_PLANS = {}
PLAN_CACHE_SIZE = 512


def _settings():
    return (config.GEMM_ENGINE, config.GEMM_SLAB_BYTES, config.GEMM_MIN_ROWS,
            config.GEMM_WORKERS, config.SMALL_FLOPS, config.SMALL_DEPTHWISE_FLOPS)


#: Called by :func:`clear_plan_cache` after the plans are dropped: the front end registers
#: the clearing of its memo of parsed calls here (the planner does not import it).
_ON_CLEAR = []


def on_clear(fn):
    """Have :func:`clear_plan_cache` call ``fn()`` too."""
    _ON_CLEAR.append(fn)


def clear_plan_cache():
    """Forget the plans made so far (after changing a strategy's code at run time),
    including those the front end's memo of parsed calls keeps."""
    _PLANS.clear()
    for fn in _ON_CLEAR:
        fn()


class FrozenMapping(Mapping):
    """A small immutable, hashable mapping for ``Plan.tiles`` (lookups through a private
    dict: a strategy reads its tiles on every call)."""

    __slots__ = ("_items", "_d")

    def __init__(self, items=()):
        d = dict(items)
        object.__setattr__(self, "_items", tuple(sorted(d.items())))
        object.__setattr__(self, "_d", d)

    def __getitem__(self, key):
        return self._d[key]

    def __reduce__(self):  # pickled with its plan (numbaconv._ahead's helper process)
        return (FrozenMapping, (self._items,))

    def get(self, key, default=None):
        return self._d.get(key, default)

    def __contains__(self, key):
        return key in self._d

    def __iter__(self):
        return (k for k, _ in self._items)

    def __len__(self):
        return len(self._items)

    def __hash__(self):
        return hash(self._items)

    def __setattr__(self, name, value):
        raise AttributeError("Plan.tiles is immutable")

    def __repr__(self):
        return "{" + ", ".join(f"{k}: {v!r}" for k, v in self._items) + "}"


@dataclass(frozen=True)
class Plan:
    """What will run for one problem, and why. Immutable."""

    problem: ConvProblem
    strategy: str
    tiles: FrozenMapping
    threads: int
    flops: int
    workspace_bytes: int
    reason: str
    declined: tuple = ()
    variant: str = ""

    def __str__(self):
        tiles = ", ".join(f"{k}={v}" for k, v in self.tiles.items())
        s = (f"{self.problem.op or self.problem.direction} {self.problem.descriptor()}: "
             f"{self.strategy}{'[' + self.variant + ']' if self.variant else ''}({tiles}) on {self.threads} thread(s), "
             f"{self.flops / 1e9:.3g} GFLOP, workspace {self.workspace_bytes} B: {self.reason}")
        if self.declined:
            s += "; declined " + ", ".join(f"{n} ({r})" for n, r in self.declined)
        return s


def _build(problem, strat, reason, declined, threads, machine):
    """The Plan of ``strat``; ``declined`` keeps the reasons of the strategies ranked ahead
    of it (why it, and not an earlier one, runs), as oneDNN's dispatch trace does."""
    name = label(strat)
    ahead = set(LABELS[:LABELS.index(name)]) if name in LABELS else set()
    declined = [(n, r) for n, r in declined if n in ahead]
    tiles = strat.tiles(problem, machine)
    return Plan(problem=problem, strategy=strat.name, tiles=FrozenMapping(tiles),
                threads=threads, flops=problem.flops,
                workspace_bytes=int(strat.workspace_bytes(problem, tiles)), reason=reason,
                declined=tuple(declined), variant=strat.variant)


def implementation(plan):
    """The strategy object that runs ``plan`` (the modules of the entries after it are not
    imported)."""
    for s in _iter_strategies():
        if (plan.problem.direction in s.directions and s.name == plan.strategy
                and s.variant == plan.variant):
            return s
    raise LookupError(f"no implementation {plan.strategy}[{plan.variant}]")


def _gpu_plan(problem, strategy):
    """The GPU's plan: implicit GEMM or direct kernels, block and tile sizes (``threads`` is
    threads per block); ``tune`` does not apply on the GPU. Cached like the CPU's plans,
    keyed by the problem, ``strategy`` and the ``config.CUDA_*`` settings."""
    from .backends import cuda as gpu
    key = None
    if not config.VERBOSE:
        key = ("cuda", problem, strategy, gpu.settings())
        plan = _PLANS.get(key)
        if plan is not None:
            return plan
    f = gpu.gpu_plan(problem, strategy)  # ValueError for a strategy the GPU does not have
    plan = Plan(problem=problem, strategy=f["strategy"], tiles=FrozenMapping(f["tiles"]),
                threads=f["threads"], flops=problem.flops,
                workspace_bytes=f["workspace_bytes"], reason=f["reason"],
                declined=f["declined"], variant=f["variant"])
    if config.VERBOSE:
        print(f"numbaconv: {plan}", file=sys.stderr)
    if key is not None:
        if len(_PLANS) >= PLAN_CACHE_SIZE:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def make_plan(problem, strategy=None, tune=False, operands=None, device=None):
    """Choose a strategy and its tiles for ``problem``; returns an immutable :class:`Plan`
    (the same object for a problem planned before with the same settings)."""
    if strategy is not None and (not isinstance(strategy, str)
                                 or strategy not in STRATEGY_NAMES):
        from .backends.cuda import GPU_ENTRIES
        if not (isinstance(strategy, str) and strategy in GPU_ENTRIES):
            raise ValueError(f"strategy: expected a family {list(FAMILIES)}, one entry "
                             f"{[n for n in STRATEGY_NAMES if n not in FAMILIES]}, a GPU "
                             f"entry {list(GPU_ENTRIES)} or None, got {strategy!r}")
    if not isinstance(tune, (bool, int)) or isinstance(tune, float):
        raise TypeError(f"tune: expected a bool, got {tune!r}")
    if device is None and operands:
        from .backends.cuda import on_device
        device = "cuda" if on_device(operands) else "cpu"
    if device == "cuda":
        if strategy is not None and strategy not in FAMILIES:
            from .backends.cuda import GPU_ENTRIES
            if strategy not in GPU_ENTRIES:
                raise ValueError(f"strategy: {strategy!r} is a CPU entry; on the GPU "
                                 f"strategy= takes a family name {list(FAMILIES)} or a GPU "
                                 f"entry {list(GPU_ENTRIES)}")
        return _gpu_plan(problem, strategy)
    if strategy is not None and strategy not in STRATEGY_NAMES:
        raise ValueError(f"strategy: {strategy!r} is a GPU entry; on NumPy arrays strategy= "
                         f"takes a family {list(FAMILIES)} or one entry "
                         f"{[n for n in STRATEGY_NAMES if n not in FAMILIES]}")
    threads = runtime.threads()
    key = None
    if not config.VERBOSE:
        key = (problem, strategy, threads, _settings())
        if tune:
            from .tune import cache_stamp
            key += (cache_stamp(),)
        plan = _PLANS.get(key)
        if plan is not None:
            return plan
    plan = _plan_cpu(problem, strategy, tune, threads)
    if key is not None and tune:
        from .tune import NOT_SAVED
        # under the file's version now: this call's tuning may have saved to it
        key = None if NOT_SAVED in plan.reason else key[:-1] + (cache_stamp(),)
    if key is not None:
        if len(_PLANS) >= PLAN_CACHE_SIZE:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _empty_plan(problem, strategy, threads):
    """The plan of an empty problem (no batch, no channels or a zero spatial size): its
    result is zeros of the result's shape, which the backend makes without running any
    strategy, so no strategy sizes tiles or a workspace for it (their tile arithmetic
    divides by the rows and channels). A forced strategy must still implement the
    direction; whether it would accept the geometry does not matter."""
    if strategy is not None and not _forced(candidates(problem.direction), strategy):
        raise ValueError(f"strategy: {strategy!r} does not implement direction "
                         f"{problem.direction!r} ({problem.op})")
    why = "empty problem: the result is zeros, nothing runs"
    if strategy is not None:
        why += f" (strategy={strategy!r} has nothing to do)"
    return Plan(problem=problem, strategy=DIRECT.name, tiles=FrozenMapping(), threads=threads,
                flops=problem.flops, workspace_bytes=0, reason=why, variant=DIRECT.variant)


def _plan_cpu(problem, strategy, tune, threads):
    from .machine import machine

    if problem.empty:
        plan = _empty_plan(problem, strategy, threads)
        if config.VERBOSE:
            print(f"numbaconv: {plan}", file=sys.stderr)
        return plan
    m = machine()
    if strategy is None and not tune and not config.VERBOSE:
        # the first entry that accepts runs: those after it need not be asked (nor their
        # modules imported); the reasons of those ahead of it go into the plan
        trace = []
        for s in _iter_strategies():
            if problem.direction not in s.directions:
                continue
            why = s.accepts(problem)
            if why is None:
                why = compile_guard(s, problem)
            if why is None:
                return _build(problem, s, "first accepted in the best-first list", trace,
                              threads, m)
            trace.append((label(s), why))
    cands = candidates(problem.direction)
    trace = []
    accepted = []
    for s in cands:
        why = s.accepts(problem)
        if why is None and strategy is None:
            why = compile_guard(s, problem)
        if why is None:
            accepted.append(s)
        else:
            trace.append((label(s), why))
    if strategy is not None:
        forced = _forced(cands, strategy)
        if not forced:
            raise ValueError(f"strategy: {strategy!r} does not implement direction "
                             f"{problem.direction!r} ({problem.op})")
        ok = [s for s in forced if s in accepted]
        if not ok:
            why = "; ".join(f"{label(s)}: {s.accepts(problem)}" for s in forced)
            raise ValueError(f"strategy: {strategy!r} declines {problem.descriptor()}: {why}")
        plan = _build(problem, ok[0], "forced by strategy=", trace, threads, m)
    elif tune and len(accepted) > 1:
        from .tune import tuned_choice
        winner, why = tuned_choice(problem, accepted, threads, m)
        plan = _build(problem, winner, why, trace, threads, m)
    else:
        plan = _build(problem, accepted[0], "first accepted in the best-first list", trace,
                      threads, m)
    if config.VERBOSE:
        for name, r in trace:
            print(f"numbaconv: {problem.descriptor()}: {name} declined: {r}", file=sys.stderr)
        print(f"numbaconv: {plan}", file=sys.stderr)
    return plan
