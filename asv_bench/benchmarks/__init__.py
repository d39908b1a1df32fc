"""asv benchmarks of numbaconv (one module per topic; shared inputs in common.py)."""
