"""The two dot products of Ctrl-G's guidance at listed entries, one compiled loop on the CPU.

For entries k = (row i, token v, table row j) of ``ctrlg.guide.entry_weights``:

    marginal_k = Σ_z p[i, z] · Bᵀ[v, z]                 = P(v | x≤t)
    joint_k    = Σ_z p[i, z] · Bᵀ[v, z] · Ŵ[j, z]        = P(v, α | x≤t) / e^{c(j)}

(p the rows' priors [R, h], Bᵀ the emission [V, h], Ŵ the guide tables flattened to
[(n + 1) · S, h], j = step · S + successor state). The torch form gathers three [K, h]
operands and writes two [K, h] products before its sums; this loop reads each operand row once
and keeps the sums in registers, so it costs one pass over the K · h gathered entries. Sums in
float32 (vectorised, so in another order than torch's: the results agree to float32 rounding),
returned as float64. Without numba, torch computes the same (:func:`compiled`).

:func:`triple_dots` is the general form Σ_z a[i, z] · b[j, z] · c[l, z] per listed (i, j, l),
which p_hmm(α | x≤t) needs per row (the default's p · (M_s ⊙ Ŵ(d)) and each pair's
p · (Ē ⊙ Ŵ(t)), :meth:`ctrlg.guide.entry_weights.EntryWeights.log_accept_rows`).
"""

from __future__ import annotations

import numpy as np
import torch

from ctrlg.kernels.cpu_loops import compiled_loop, numpy_ready

__all__ = ["entry_dots", "triple_dots", "compiled"]


def _dots_py(a, b, c, ia, ib, ic, triple, double):
    """triple[k] = Σ_z a[ia[k], z] · b[ib[k], z] · c[ic[k], z], double[k] = the same without c."""
    h = a.shape[1]
    for k in range(ia.shape[0]):
        x = a[ia[k]]
        y = b[ib[k]]
        w = c[ic[k]]
        acc3 = np.float32(0.0)
        acc2 = np.float32(0.0)
        for z in range(h):
            q = x[z] * y[z]
            acc2 += q
            acc3 += q * w[z]
        triple[k] = acc3
        double[k] = acc2


_dots = compiled_loop(_dots_py, fastmath=True)


def compiled() -> bool:
    """Whether the compiled loop is available (numba); else torch computes the same."""
    return _dots is not None


def _indices(*arrays) -> list[np.ndarray]:
    return [np.ascontiguousarray(a, dtype=np.int64) for a in arrays]


def triple_dots(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, ia: np.ndarray,
                ib: np.ndarray, ic: np.ndarray) -> torch.Tensor:
    """Σ_z a[ia[k], z] · b[ib[k], z] · c[ic[k], z] per k, float64 [K], from float32 [·, h]
    operands (module docstring)."""
    if numpy_ready(a, b, c):
        out, unused = np.empty(len(ia), dtype=np.float32), np.empty(len(ia), dtype=np.float32)
        if len(ia):     # the loop's second output (the sums without c) is not needed here
            _dots(a.numpy(), b.numpy(), c.numpy(), *_indices(ia, ib, ic), out, unused)
        return torch.from_numpy(out).double()
    dev = a.device
    ia, ib, ic = (torch.as_tensor(x, device=dev) for x in _indices(ia, ib, ic))
    return (a[ia] * b[ib] * c[ic]).sum(1).double()


def entry_dots(priors: torch.Tensor, emission_t: torch.Tensor, tables: torch.Tensor,
               rows: np.ndarray, tokens: np.ndarray, table_rows: np.ndarray
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(joint, marginal), float64 [K] each (module docstring): float32 ``priors`` [R, h],
    ``emission_t`` [V, h] and ``tables`` [rows, h]; entry k reads row ``rows[k]`` of the priors,
    ``tokens[k]`` of the emission and ``table_rows[k]`` of the tables."""
    if numpy_ready(priors, emission_t, tables):
        K = len(rows)
        joint = np.empty(K, dtype=np.float32)
        marginal = np.empty(K, dtype=np.float32)
        if K:
            _dots(priors.numpy(), emission_t.numpy(), tables.numpy(),
                  *_indices(rows, tokens, table_rows), joint, marginal)
        return torch.from_numpy(joint).double(), torch.from_numpy(marginal).double()
    dev = priors.device
    as_index = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int64), device=dev)  # noqa: E731
    q = priors[as_index(rows)] * emission_t[as_index(tokens)]
    return (q * tables[as_index(table_rows)]).sum(1).double(), q.sum(1).double()
