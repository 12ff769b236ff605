"""Kernels, installed as ``ctrlg.kernels`` (a top-level ``kernels`` package would shadow
Hugging Face's ``kernels``, which transformers probes for): Triton kernels, each with a plain-torch
reference (:mod:`ctrlg.kernels.reference`) and an equivalence test run on the CPU under
``TRITON_INTERPRET=1``; the CPU's own loops compiled with numba (:mod:`ctrlg.kernels.cpu_loops`:
the backward-table step, :mod:`ctrlg.kernels.backward_table_cpu`; the kept-entry lookahead's row
passes and dot products, :mod:`ctrlg.kernels.row_candidates_cpu` and
:mod:`ctrlg.kernels.entry_dots_cpu`; each tested against the torch code it replaces); the
oneDNN-packed product (:mod:`ctrlg.kernels.packed_linear`).

May import: its own modules and third-party packages (torch, triton, numba); nothing else of ctrlg.
"""
