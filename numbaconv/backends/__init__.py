"""Backends: bring arrays to the canonical layout once, launch the plan's kernels."""
