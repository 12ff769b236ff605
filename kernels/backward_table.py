"""Triton kernel for one step of the Ctrl-G backward-table recurrence (see ``ctrlg.guide``).

For every DFA state s (rows) and hidden state z' (columns)

    G[s, z'] = coef_default[s] · Ŵ[default[s], z'] · M[s, z']
             + Σ_{k ∈ exc(s)} coef_exc[k] · emission_rows[exc_row[k], z'] · Ŵ[exc_dst[k], z']
             + coef_eos[s] · eos_term[s, z']
    out      = G · Aᵀ        ((S×h)·(h×h), fp32 accumulation)

Two kernels: ``_gather_kernel`` builds G (one program per state × block of h; the ragged exception
loop runs over that state's CSR slice only, so the work is O(S·h + E·h)), then ``_matmul_kernel``
multiplies by Aᵀ with ``tl.dot`` at IEEE fp32 precision (no TF32). Inputs may be bf16/fp16
(``w_prev``, ``transition``, ...); everything is accumulated in fp32.

:func:`backward_step` is the launcher; it falls back to ``ctrlg.kernels.reference.backward_step_reference``
(plain torch) when Triton is missing or the tensors are on CPU without ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch

from ctrlg.kernels.reference import backward_step_reference
from ctrlg.kernels._triton import tl, triton, triton_available

__all__ = ["backward_step", "triton_available"]


if triton is not None:

    @triton.jit
    def _gather_kernel(w_prev, default, coef_default, mass, exc_ptr, exc_dst, exc_row,
                       emission_rows, coef_exc, eos_term, coef_eos, g_out, h,
                       BLOCK_H: tl.constexpr):
        s = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        in_h = offs < h
        d = tl.load(default + s)
        g = tl.load(coef_default + s).to(tl.float32) \
            * tl.load(w_prev + d * h + offs, mask=in_h, other=0.0).to(tl.float32) \
            * tl.load(mass + s * h + offs, mask=in_h, other=0.0).to(tl.float32)
        lo = tl.load(exc_ptr + s)
        hi = tl.load(exc_ptr + s + 1)
        for k in range(lo, hi):
            dst = tl.load(exc_dst + k)
            c = tl.load(coef_exc + k).to(tl.float32)
            row = tl.load(exc_row + k)
            b = tl.load(emission_rows + row * h + offs, mask=in_h, other=0.0).to(tl.float32)
            w = tl.load(w_prev + dst * h + offs, mask=in_h, other=0.0).to(tl.float32)
            g += c * b * w
        g += tl.load(coef_eos + s).to(tl.float32) \
            * tl.load(eos_term + s * h + offs, mask=in_h, other=0.0).to(tl.float32)
        tl.store(g_out + s * h + offs, g, mask=in_h)

    @triton.jit
    def _matmul_kernel(g, transition, out, S, h, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, h, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(g + rows[:, None] * h + ks[None, :],
                        mask=(rows[:, None] < S) & (ks[None, :] < h), other=0.0).to(tl.float32)
            # Aᵀ[k, n] = A[n, k]
            b = tl.load(transition + cols[None, :] * h + ks[:, None],
                        mask=(cols[None, :] < h) & (ks[:, None] < h), other=0.0).to(tl.float32)
            acc += tl.dot(a, b, input_precision="ieee")
        tl.store(out + rows[:, None] * h + cols[None, :], acc,
                 mask=(rows[:, None] < S) & (cols[None, :] < h))


def backward_step(w_prev: torch.Tensor, default: torch.Tensor, coef_default: torch.Tensor,
                  nonexc_mass: torch.Tensor, exc_src: torch.Tensor, exc_dst: torch.Tensor,
                  exc_row: torch.Tensor, emission_rows: torch.Tensor, coef_exc: torch.Tensor,
                  eos_term: torch.Tensor,
                  coef_eos: torch.Tensor, transition: torch.Tensor, *,
                  block_h: int = 128, block_m: int = 32, block_n: int = 32,
                  block_k: int = 32) -> torch.Tensor:
    """G · Aᵀ for one recurrence step (same arguments as ``backward_step_reference``; the
    exceptions must be sorted by ``exc_src``, as CSR order gives). Returns float32 [S, h]."""
    if not triton_available(w_prev.device):
        return backward_step_reference(w_prev, default, coef_default, nonexc_mass, exc_src, exc_dst,
                                       exc_row, emission_rows, coef_exc, eos_term, coef_eos,
                                       transition)
    S, h = w_prev.shape
    device = w_prev.device
    exc_ptr = torch.searchsorted(exc_src.contiguous(),
                                 torch.arange(S + 1, device=device, dtype=exc_src.dtype))
    contig = [t.contiguous() for t in (w_prev, default, coef_default, nonexc_mass, exc_dst, exc_row,
                                       emission_rows, coef_exc, eos_term, coef_eos, transition)]
    w_prev, default, coef_default, nonexc_mass, exc_dst, exc_row, emission_rows, coef_exc, \
        eos_term, coef_eos, transition = contig
    if exc_dst.numel() == 0:  # the kernel needs valid pointers even with no exceptions
        exc_dst = torch.zeros(1, dtype=default.dtype, device=device)
        exc_row = torch.zeros(1, dtype=default.dtype, device=device)
        coef_exc = torch.zeros(1, device=device)
    if emission_rows.numel() == 0:
        emission_rows = torch.zeros(1, h, device=device, dtype=w_prev.dtype)
    g = torch.empty(S, h, device=device, dtype=torch.float32)
    block_h = min(block_h, triton.next_power_of_2(h))
    _gather_kernel[(S, triton.cdiv(h, block_h))](
        w_prev, default, coef_default, nonexc_mass, exc_ptr, exc_dst, exc_row, emission_rows,
        coef_exc, eos_term, coef_eos, g, h, BLOCK_H=block_h)
    out = torch.empty(S, h, device=device, dtype=torch.float32)
    bm = max(16, min(block_m, triton.next_power_of_2(S)))
    bn = max(16, min(block_n, triton.next_power_of_2(h)))
    bk = max(16, min(block_k, triton.next_power_of_2(h)))
    _matmul_kernel[(triton.cdiv(S, bm), triton.cdiv(h, bn))](g, transition, out, S, h,
                                                             BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
    return out
