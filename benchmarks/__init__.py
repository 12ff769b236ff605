"""Benchmark scripts of ctrlg (measured figures, never timed tests).

This folder is not part of the installed package; run its entry points from the repository root,
e.g. ``python -m benchmarks.gpu --device cuda --size full``. Results go to ``benchmarks/results/``.
"""
