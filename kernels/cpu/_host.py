"""What the kernels need to know about the host CPU, probed once: the one place that asks.

Plain Python, no jitted code: kernel modules and :mod:`numbaconv.machine` import these
constants (see the sharing rule in :mod:`numbaconv.kernels`). They depend only on the CPU,
which is part of Numba's cache key.
"""
import platform


def _probe():
    try:
        import llvmlite.binding as llvm
        name = llvm.get_host_cpu_name()
        feats = llvm.get_host_cpu_features()
        return name, tuple(sorted(k for k, v in feats.items() if v))
    except Exception:  # pragma: no cover - llvmlite without host queries
        return "generic", ()


#: LLVM's name of the host CPU and its enabled features (sorted).
CPU_NAME, FEATURES = _probe()
#: The widest SIMD register the kernels use, in bytes: 64 with AVX-512, 32 with AVX or
#: AVX2, else 16.
VECTOR_BYTES = (64 if "avx512f" in FEATURES else
                32 if "avx2" in FEATURES or "avx" in FEATURES else 16)
#: Non-temporal stores (``sfence`` after them) exist on every x86-64 host, not elsewhere.
STREAMS = platform.machine().lower() in ("x86_64", "amd64")
#: float16 <-> float32 conversion in hardware (x86's F16C).
F16C = "f16c" in FEATURES
