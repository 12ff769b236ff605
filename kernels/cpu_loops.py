"""The CPU loops of ``ctrlg.kernels``, compiled with numba where it is installed (a dependency).

:func:`compiled_loop` is the one place that decides: each module writes its loop as plain Python
over numpy arrays (``_name_py``, also what a test can read) and keeps ``compiled_loop(fn)``, a
numba function (cached on disk, releasing the GIL), or None where numba cannot be imported; the
module's callers then take its torch equivalent.
"""

from __future__ import annotations

import torch

__all__ = ["compiled_loop", "NUMBA", "numpy_ready"]

try:
    import numba as _numba
    NUMBA = True
except ImportError:  # pragma: no cover - odd platforms
    _numba = None
    NUMBA = False


def compiled_loop(fn, *, fastmath: bool = False):
    """``fn`` compiled by numba (``njit(cache=True, nogil=True)``; ``fastmath`` lets it reorder
    float sums and assume no NaN), or None without numba."""
    if _numba is None:
        return None
    return _numba.njit(cache=True, nogil=True, fastmath=fastmath)(fn)


def numpy_ready(*tensors) -> bool:
    """Whether the compiled loops can take ``tensors`` as numpy views: numba installed, and
    every tensor float32, contiguous and on the CPU (else the callers' torch equivalents run)."""
    return NUMBA and all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
                         for t in tensors)
