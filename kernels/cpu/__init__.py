"""CPU kernels (``numba.njit(parallel=True)`` loop nests)."""
