"""Plain-torch references of the Triton kernels (one module that both the library and the
kernels import, so neither imports the other).

* :func:`backward_step_reference` — one step of the Ctrl-G backward-table recurrence
  (:mod:`ctrlg.guide`; kernel: :mod:`ctrlg.kernels.backward_table`).
* :func:`estep_torch` / :class:`ExpectedCounts` — the Baum-Welch E-step (:mod:`ctrlg.hmm.em`;
  kernel: :mod:`ctrlg.kernels.em_estep`).

Every kernel's equivalence test compares it with the function here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["backward_step_reference", "ExpectedCounts", "estep_torch"]

_CHUNK = 4096


def backward_step_reference(w_prev: torch.Tensor, default: torch.Tensor, coef_default: torch.Tensor,
                            nonexc_mass: torch.Tensor, exc_src: torch.Tensor, exc_dst: torch.Tensor,
                            exc_row: torch.Tensor, emission_rows: torch.Tensor, coef_exc: torch.Tensor,
                            eos_term: torch.Tensor, coef_eos: torch.Tensor,
                            transition: torch.Tensor) -> torch.Tensor:
    """One step of the backward recurrence, unnormalised: returns G · Aᵀ ([S, h], float32) where

    G[s] = coef_default[s] · Ŵ[default[s]] ⊙ M[s]
         + Σ_{k: exc_src[k] = s} coef_exc[k] · B[:, tok_k] ⊙ Ŵ[exc_dst[k]]
         + coef_eos[s] · eos_term[s]

    ``w_prev`` [S, h] is Ŵ_{r-1}; exception k's emission column is ``emission_rows[exc_row[k]]``
    (``emission_rows`` is Bᵀ [V, h], or the per-letter sums B̄ᵀ [A, h] for DFAs with letters),
    the ``coef_*`` are the rescaling factors exp(c_{r-1}(·) − m_s) (0 for infeasible states).
    This plain-torch version is the reference for ``ctrlg.kernels.backward_table``.
    """
    g = w_prev[default].float().mul_(coef_default[:, None]).mul_(nonexc_mass)
    for lo in range(0, exc_src.numel(), _CHUNK):  # chunks keep the [E, h] temporaries small
        hi = lo + _CHUNK
        term = w_prev[exc_dst[lo:hi]].float().mul_(emission_rows[exc_row[lo:hi]]).mul_(coef_exc[lo:hi, None])
        g.index_add_(0, exc_src[lo:hi], term)
    g.add_(eos_term * coef_eos[:, None])
    return g @ transition.T.float()



@dataclass
class ExpectedCounts:
    """Sufficient statistics of one E-step: initial [h], transition [h, h], emission [h, V],
    total log-likelihood and number of sequences / tokens it covers."""
    initial: torch.Tensor
    transition: torch.Tensor
    emission: torch.Tensor
    loglik: torch.Tensor  # float64 scalar tensor
    sequences: torch.Tensor  # float64 scalar tensor
    tokens: torch.Tensor  # float64 scalar tensor

    def tensors(self) -> list[torch.Tensor]:
        return [self.initial, self.transition, self.emission, self.loglik, self.sequences, self.tokens]

    def add_(self, other: "ExpectedCounts") -> "ExpectedCounts":
        for mine, theirs in zip(self.tensors(), other.tensors()):
            mine += theirs
        return self

    @classmethod
    def zeros(cls, h: int, V: int, device) -> "ExpectedCounts":
        z = lambda *s, d=torch.float32: torch.zeros(*s, dtype=d, device=device)  # noqa: E731
        return cls(z(h), z(h, h), z(h, V), z((), d=torch.float64), z((), d=torch.float64),
                   z((), d=torch.float64))


def estep_torch(initial: torch.Tensor, transition: torch.Tensor, emission: torch.Tensor,
                tokens: torch.Tensor) -> ExpectedCounts:
    """Expected counts of one batch ``tokens`` [n, L] (module equations), plain torch."""
    n, L = tokens.shape
    h, V = emission.shape
    tiny = torch.finfo(torch.float32).tiny
    E = emission.T[tokens]  # [n, L, h]
    alpha = torch.empty(L, n, h, dtype=torch.float32, device=emission.device)
    norm = torch.empty(L, n, dtype=torch.float32, device=emission.device)
    a = initial[None] * E[:, 0]
    for t in range(L):
        if t > 0:
            a = (a @ transition) * E[:, t]
        c = a.sum(-1).clamp_min(tiny)
        a = a / c[:, None]
        alpha[t], norm[t] = a, c
    beta = torch.empty_like(alpha)
    beta[L - 1] = 1.0
    weighted = torch.empty_like(alpha)  # E_{t+1} ⊙ β̂_{t+1} / c_{t+1}, for t+1 = 1..L-1
    for t in range(L - 2, -1, -1):
        w = E[:, t + 1] * beta[t + 1] / norm[t + 1][:, None]
        weighted[t + 1] = w
        beta[t] = w @ transition.T
    gamma = alpha * beta  # [L, n, h]
    if L > 1:
        xi = alpha[:-1].reshape(-1, h).T @ weighted[1:].reshape(-1, h)
        trans_counts = transition * xi
    else:
        trans_counts = torch.zeros_like(transition)
    emit_t = torch.zeros(V, h, dtype=torch.float32, device=emission.device)
    emit_t.index_add_(0, tokens.T.reshape(-1), gamma.reshape(-1, h))
    return ExpectedCounts(gamma[0].sum(0), trans_counts, emit_t.T.contiguous(),
                          norm.double().log().sum(), torch.tensor(float(n), dtype=torch.float64),
                          torch.tensor(float(n * L), dtype=torch.float64))
