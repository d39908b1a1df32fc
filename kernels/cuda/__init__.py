"""numba.cuda kernels, twins of :mod:`numbaconv.kernels.cpu` (same canonical layouts).

Importing a module of this package imports ``numba.cuda`` (which needs neither a GPU nor a
driver); only :mod:`numbaconv.backends.cuda` imports them, lazily. Kernels are built by small
factories keyed on the compute dtype, the compile-time tile sizes (shared and local array
shapes must be constants) and, for the GEMM and row kernels, the problem's geometry (so
index arithmetic folds), cached per process, and compiled lazily at the first launch: no
eager signature is ever compiled at import.

* :mod:`.gemm`: implicit-GEMM kernels (shared-memory tiles, per-thread register tiles) for
  the three directions, exact float32/float64 and TF32 (``gemm[tf32]``), and the
  deterministic split reduction of the weight gradient.
* :mod:`.tf32`: the TF32 implicit GEMMs fed by ``cp.async`` (``gemm[tf32-async]``).
* :mod:`._ptx`: shared by the two: the intrinsics' inline-PTX code generation.
* :mod:`.depthwise`: row kernels for depthwise proper (``icg == 1``: source rows staged in
  shared memory, a row of results and the filter in registers), and one-element-per-thread
  kernels, channels across threads, correct for any grouping.
* :mod:`.layout`: the small gather/scatter kernels that bring user layouts and dtypes to the
  canonical form and back on the device.
"""
