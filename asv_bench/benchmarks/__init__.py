"""asv benchmarks of numbaconv (one module per topic; shared inputs in common.py).

Imported before any benchmark module, so before Numba: when the benchmarks run in an
environment asv built (a virtualenv under ``asv_bench/env/``), Numba's on-disk cache is
kept in that environment (``<env>/numba_cache``), unless ``NUMBACONV_ASV_NUMBA_CACHE`` names
another directory. Each commit's environment then compiles its kernels once, in the first
benchmark ``setup`` that needs them, and later processes load them from disk; no timing
includes compilation either way (every ``setup`` calls the op once before asv times it).
"""
import os
import sys

if "NUMBACONV_ASV_NUMBA_CACHE" in os.environ:
    os.environ["NUMBA_CACHE_DIR"] = os.environ["NUMBACONV_ASV_NUMBA_CACHE"]
elif sys.prefix != sys.base_prefix:  # a virtualenv: asv's, or the user's own
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(sys.prefix, "numba_cache")
