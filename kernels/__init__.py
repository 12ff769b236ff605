"""Triton kernels, installed as ``ctrlg.kernels`` (a top-level ``kernels`` package would shadow
Hugging Face's ``kernels``, which transformers probes for). Each kernel has a plain-torch
reference (:mod:`ctrlg.kernels.reference`) and an equivalence test run on the CPU under
``TRITON_INTERPRET=1``.

May import: its own modules and third-party packages (torch, triton); nothing else of ctrlg.
"""
