"""Triton kernels for the Baum-Welch E-step (reference: ``ctrlg.kernels.reference.estep_torch``).

With E_t[b, :] = B[:, x_{b,t}] (a gather of the transposed emission matrix Bᵀ [V, h]):

* ``_recursion_kernel`` (one time step of the scaled forward or backward pass, fused
  "gather × matmul", fp32 accumulation, IEEE precision)::

      forward:   α̃_t   = (α̂_{t-1} · A) ⊙ E_t                       then α̂_t = α̃_t / c_t
      backward:  w_t   = E_{t+1} ⊙ β̂_{t+1} / c_{t+1},  β̂_t = w_t · Aᵀ  (w_t is stored for ξ)

  (the normaliser c_t = Σ_z α̃_t[z] is a row sum done by torch);
* ``_emission_counts_kernel`` (expected emission counts): γ_t = α̂_t ⊙ β̂_t is formed in
  registers and scatter-added with atomics into the transposed count matrix N_Bᵀ[x_t, :].

The transition counts Σ_t ξ_t = A ⊙ (α̂_{1:L-1}ᵀ · w_{2:L}) are one large GEMM, left to
cuBLAS/oneDNN through ``torch.matmul``; initial counts are Σ_b γ_1.

:func:`estep_triton` is the launcher, with the same arguments and result as ``estep_torch``; it
falls back to ``estep_torch`` when Triton cannot run (no triton, or CPU without
``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch

from ctrlg.kernels.reference import ExpectedCounts, estep_torch
from ctrlg.kernels._triton import tl, triton, triton_available

__all__ = ["estep_triton", "triton_available"]


if triton is not None:

    @triton.jit
    def _recursion_kernel(prev, transition, emission_t, ids, scale, out, weighted, n, h,
                          BACKWARD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        in_rows = rows < n
        in_cols = cols < h
        tok = tl.load(ids + rows, mask=in_rows, other=0).to(tl.int64)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if BACKWARD:
            inv = 1.0 / tl.load(scale + rows, mask=in_rows, other=1.0).to(tl.float32)
        for k0 in range(0, h, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            in_k = ks < h
            a = tl.load(prev + rows[:, None] * h + ks[None, :],
                        mask=in_rows[:, None] & in_k[None, :], other=0.0).to(tl.float32)
            if BACKWARD:
                e = tl.load(emission_t + tok[:, None] * h + ks[None, :],
                            mask=in_rows[:, None] & in_k[None, :], other=0.0).to(tl.float32)
                a = a * e * inv[:, None]
                if tl.program_id(1) == 0:
                    tl.store(weighted + rows[:, None] * h + ks[None, :], a,
                             mask=in_rows[:, None] & in_k[None, :])
                # Aᵀ[k, j] = A[j, k]
                m = tl.load(transition + cols[None, :] * h + ks[:, None],
                            mask=in_cols[None, :] & in_k[:, None], other=0.0).to(tl.float32)
            else:
                m = tl.load(transition + ks[:, None] * h + cols[None, :],
                            mask=in_k[:, None] & in_cols[None, :], other=0.0).to(tl.float32)
            acc += tl.dot(a, m, input_precision="ieee")
        if not BACKWARD:
            e = tl.load(emission_t + tok[:, None] * h + cols[None, :],
                        mask=in_rows[:, None] & in_cols[None, :], other=0.0).to(tl.float32)
            acc = acc * e
        tl.store(out + rows[:, None] * h + cols[None, :], acc,
                 mask=in_rows[:, None] & in_cols[None, :])

    @triton.jit
    def _emission_counts_kernel(alpha, beta, ids, counts_t, h, BLOCK_H: tl.constexpr):
        r = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        in_h = offs < h
        tok = tl.load(ids + r).to(tl.int64)
        g = tl.load(alpha + r * h + offs, mask=in_h, other=0.0) \
            * tl.load(beta + r * h + offs, mask=in_h, other=0.0)
        tl.atomic_add(counts_t + tok * h + offs, g, mask=in_h)


def _blocks(n: int, h: int, block_m: int, block_n: int, block_k: int) -> tuple[int, int, int]:
    bm = max(16, min(block_m, triton.next_power_of_2(n)))
    bn = max(16, min(block_n, triton.next_power_of_2(h)))
    bk = max(16, min(block_k, triton.next_power_of_2(h)))
    return bm, bn, bk


def estep_triton(initial: torch.Tensor, transition: torch.Tensor, emission: torch.Tensor,
                 tokens: torch.Tensor, *, block_m: int = 32, block_n: int = 64, block_k: int = 32,
                 block_h: int = 128) -> ExpectedCounts:
    """Expected counts of one batch ``tokens`` [n, L] with the Triton kernels (module docstring);
    same result as ``ctrlg.kernels.reference.estep_torch``."""
    if not triton_available(emission.device):
        return estep_torch(initial, transition, emission, tokens)
    n, L = tokens.shape
    h, V = emission.shape
    device = emission.device
    tiny = torch.finfo(torch.float32).tiny
    transition = transition.float().contiguous()
    emission_t = emission.float().T.contiguous()  # [V, h]
    ids = tokens.T.contiguous()  # [L, n]: ids[t] is a contiguous row of the batch
    bm, bn, bk = _blocks(n, h, block_m, block_n, block_k)
    grid = (triton.cdiv(n, bm), triton.cdiv(h, bn))

    alpha = torch.empty(L, n, h, dtype=torch.float32, device=device)
    norm = torch.empty(L, n, dtype=torch.float32, device=device)
    a = initial.float()[None] * emission_t[ids[0]]
    c = a.sum(-1).clamp_min(tiny)
    alpha[0], norm[0] = a / c[:, None], c
    for t in range(1, L):
        _recursion_kernel[grid](alpha[t - 1], transition, emission_t, ids[t], norm[t - 1],
                                alpha[t], alpha[t], n, h, BACKWARD=False,
                                BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
        c = alpha[t].sum(-1).clamp_min(tiny)
        alpha[t] /= c[:, None]
        norm[t] = c

    beta = torch.empty_like(alpha)
    weighted = torch.empty_like(alpha)
    beta[L - 1] = 1.0
    for t in range(L - 2, -1, -1):
        _recursion_kernel[grid](beta[t + 1], transition, emission_t, ids[t + 1], norm[t + 1],
                                beta[t], weighted[t + 1], n, h, BACKWARD=True,
                                BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)

    emission_counts_t = torch.zeros(V, h, dtype=torch.float32, device=device)
    bh = min(block_h, triton.next_power_of_2(h))
    _emission_counts_kernel[(L * n, triton.cdiv(h, bh))](alpha, beta, ids, emission_counts_t, h,
                                                         BLOCK_H=bh)
    if L > 1:
        trans_counts = transition * (alpha[:-1].reshape(-1, h).T @ weighted[1:].reshape(-1, h))
    else:
        trans_counts = torch.zeros_like(transition)
    return ExpectedCounts((alpha[0] * beta[0]).sum(0), trans_counts, emission_counts_t.T.contiguous(),
                          norm.double().log().sum(), torch.tensor(float(n), dtype=torch.float64),
                          torch.tensor(float(n * L), dtype=torch.float64))
