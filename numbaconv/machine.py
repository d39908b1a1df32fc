"""A small model of the machine the planner sizes its tiles for (read once, lazily)."""
from dataclasses import dataclass
import functools
import os


@dataclass(frozen=True)
class Machine:
    cores: int
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    vector_bytes: int      # widest usable SIMD register: 64 with AVX-512, 32 with AVX2
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
    try:
        import llvmlite.binding as llvm
        cpu_name = llvm.get_host_cpu_name()
        feats = llvm.get_host_cpu_features()
        features = tuple(sorted(k for k, v in feats.items() if v))
    except Exception:  # pragma: no cover - llvmlite without host queries
        cpu_name, features = "generic", ()
    vector = 64 if "avx512f" in features else 32 if "avx2" in features else 16
    return Machine(cores=numba.config.NUMBA_NUM_THREADS,
                   l1d_bytes=_cache_size(1) or 32 * 1024,
                   l2_bytes=_cache_size(2) or 1024 * 1024,
                   l3_bytes=_cache_size(3) or 8 * 1024 * 1024,
                   vector_bytes=vector, cpu_name=cpu_name, features=features)
