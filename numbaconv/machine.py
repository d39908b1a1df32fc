"""A small model of the machine the planner sizes its tiles for (read once, lazily).

The CPU's name, features and vector width come from the kernels' one probe
(:mod:`numbaconv.kernels.cpu._host`), so that the planner and the kernels agree.
"""
from dataclasses import dataclass
import functools
import os


@dataclass(frozen=True)
class Machine:
    cores: int
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    vector_bytes: int      # widest usable SIMD register: 64 with AVX-512, 32 with AVX/AVX2
    cpu_name: str
    features: tuple

    def lanes(self, itemsize):
        return max(self.vector_bytes // itemsize, 1)


def _cache_size(level, kind=("Data", "Unified")):
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            p = os.path.join(base, entry)
            with open(os.path.join(p, "level")) as f:
                if int(f.read()) != level:
                    continue
            with open(os.path.join(p, "type")) as f:
                if f.read().strip() not in kind:
                    continue
            with open(os.path.join(p, "size")) as f:
                s = f.read().strip()
            mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(s[-1:], 1)
            return int(s.rstrip("KMG")) * mult
    except (OSError, ValueError):
        pass
    return None


@functools.lru_cache(maxsize=1)
def machine():
    """The host as the planner sees it (cores = Numba's thread pool size)."""
    import numba
    from .kernels.cpu import _host
    return Machine(cores=numba.config.NUMBA_NUM_THREADS,
                   l1d_bytes=_cache_size(1) or 32 * 1024,
                   l2_bytes=_cache_size(2) or 1024 * 1024,
                   l3_bytes=_cache_size(3) or 8 * 1024 * 1024,
                   vector_bytes=_host.VECTOR_BYTES, cpu_name=_host.CPU_NAME,
                   features=_host.FEATURES)
