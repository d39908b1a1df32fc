"""CPU kernels: parallel loop nests compiled through numbaconv._jit."""
