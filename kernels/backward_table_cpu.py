"""The Ctrl-G backward-table recurrence on the CPU: one step as two compiled loops around one
matrix product.

One step r of the recurrence of ``ctrlg.guide.tables`` (scaled rows Ŵ with log scales c), for the
rows s of the band B_r (``rows``), with the exceptions grouped by (source, successor) pair p
(Ē_p = the emission mass of the pair's tokens; ``pair_ptr`` is CSR over sources):

    m_s      = max(c_{r-1}(default(s)), max_p c_{r-1}(dst_p), [EOS live] c_eos)
    G[s, z'] = (Ŵ[default(s), z'] · e^{c(default(s)) − m_s}) · M[s, z']
             + Σ_{p: src_p = s} (Ŵ[dst_p, z'] · Ē_p[z']) · e^{c(dst_p) − m_s}   (Ē_p = row pair_row[p])
             + eos_term[s, z'] · e^{c_eos − m_s}
    raw      = G · Aᵀ                                             ((|B_r|×h)·(h×h), oneDNN)
    Ŵ_r(s)   = raw_s / max_z raw_s,   c_r(s) = m_s + log max_z raw_s

(m_s taken as 0 when it is −inf; the exponentials in float64, rounded to float32, as the torch
recurrence does). A feasible row whose maximum is 0 or not finite (underflow) gets Ŵ = 1 and the
scale m_s + log(float32 tiny), an over-estimate instead of an exact 0; infeasible ones stay 0 with
scale −inf.

:func:`_build_g` builds G in one pass: the products Ŵ_{r−1}[dst] ⊙ Ē that several pairs share
first (once per step), then each pair adds its product, scaled, into G's row in place.
:func:`_normalise` takes the rows' maxima from torch's vectorised reduction. The torch recurrence
(``GuideTables._recurrence_step`` with ``ctrlg.kernels.reference.backward_step_reference``) does
the same arithmetic in the same order with a gather, two multiplications and an ``index_add_``
per chunk of pairs (whose CPU kernel dispatches row by row), plus a few dozen small ops per step
for the scales and the band; on the CommonGen tables (h = 512, ~300 band rows, ~2,500 pairs per
step) those cost more than the product. The results equal the torch recurrence's up to the
last bit of float64 ``exp`` (tested).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ctrlg.kernels.cpu_loops import compiled_loop

__all__ = ["recurrence_step_cpu", "shared_products", "compiled"]

TINY = float(np.finfo(np.float32).tiny)


def _build_g_py(w_prev, c_prev, rows, default, has_default, mass, pair_ptr, pair_dst,
                pair_emission, pair_product, product_dst, product_row, products, needed,
                eos_term, eos_live, eos_log, eos_ok, g, m_out):
    """G (module docstring) into ``g`` [len(rows), h]; each row's m_s into ``m_out``.

    Pairs with the same successor and the same emission row (``pair_product[p]``, a CommonGen
    table: ≈ 4 pairs each) share the product Ŵ[dst_p] ⊙ Ē_p, computed once per step into
    ``products`` [K, h] for the products the band's live pairs need (``needed`` [K], scratch);
    each pair then adds product · e^{c(dst_p) − m_s}: the same float operations in the same order
    as (Ŵ[dst_p] ⊙ Ē_p) · e^{…} per pair."""
    h = g.shape[1]
    needed[:] = 0
    for i in range(rows.shape[0]):
        s = rows[i]
        for p in range(pair_ptr[s], pair_ptr[s + 1]):
            if c_prev[pair_dst[p]] != -np.inf:
                needed[pair_product[p]] = 1
    for k in range(products.shape[0]):
        if needed[k]:
            t = product_dst[k]
            e = product_row[k]
            for z in range(h):
                products[k, z] = w_prev[t, z] * pair_emission[e, z]
    for i in range(rows.shape[0]):
        s = rows[i]
        d = default[s]
        c_default = c_prev[d] if has_default[s] else -np.inf
        m = c_default
        for p in range(pair_ptr[s], pair_ptr[s + 1]):
            m = max(m, c_prev[pair_dst[p]])
        live = eos_ok and eos_live[s]
        if live:
            m = max(m, eos_log)
        m_safe = m if np.isfinite(m) else 0.0
        m_out[i] = m
        coef = np.float32(np.exp(c_default - m_safe))
        for z in range(h):
            g[i, z] = (w_prev[d, z] * coef) * mass[s, z]
        for p in range(pair_ptr[s], pair_ptr[s + 1]):
            coef = np.float32(np.exp(c_prev[pair_dst[p]] - m_safe))
            if coef == 0.0:       # the successor is dead (or negligible): exact zeros
                continue
            k = pair_product[p]
            for z in range(h):
                g[i, z] += products[k, z] * coef
        if live:
            coef = np.float32(np.exp(eos_log - m_safe))
            for z in range(h):
                g[i, z] += eos_term[s, z] * coef


def _normalise_py(raw, row_max, m, rows, feasible, w_out, c_out, tiny):
    """Ŵ_r and c_r of the band rows from ``raw`` = G · Aᵀ and its row maxima ``row_max``
    (module docstring), written at their states in ``w_out`` [S, h] (zeros) and ``c_out`` [S]
    (−inf)."""
    h = raw.shape[1]
    for i in range(rows.shape[0]):
        s = rows[i]
        mx = max(np.float32(0.0), row_max[i])
        m_safe = m[i] if np.isfinite(m[i]) else 0.0
        if mx > 0 and np.isfinite(m[i]) and np.isfinite(mx):
            for z in range(h):
                w_out[s, z] = raw[i, z] / mx
            c_out[s] = m_safe + np.log(np.float64(mx))
        elif feasible[s]:
            for z in range(h):
                w_out[s, z] = 1.0
            c_out[s] = m_safe + np.log(tiny)


_build_g = compiled_loop(_build_g_py)
_normalise = compiled_loop(_normalise_py)


def compiled() -> bool:
    """Whether the compiled loops are available (numba); else the guide uses its torch step."""
    return _build_g is not None


def shared_products(pair_dst: np.ndarray, pair_row: np.ndarray, hidden: int):
    """The products Ŵ[dst] ⊙ Ē_row that pairs share (:func:`_build_g_py`): each pair's product
    index [P], each product's successor and emission row [K], a [K, h] float32 buffer and a [K]
    scratch flag array; fixed per table."""
    key = pair_dst.astype(np.int64) * (int(pair_row.max(initial=0)) + 1) + pair_row
    _, first, pair_product = np.unique(key, return_index=True, return_inverse=True)
    return dict(pair_product=pair_product.reshape(-1).astype(np.int64),
                product_dst=np.ascontiguousarray(pair_dst[first], dtype=np.int64),
                product_row=np.ascontiguousarray(pair_row[first], dtype=np.int64),
                products=np.empty((len(first), hidden), dtype=np.float32),
                needed=np.zeros(len(first), dtype=np.uint8))


def recurrence_step_cpu(w_prev: np.ndarray, c_prev: np.ndarray, rows: np.ndarray,
                        default: np.ndarray, has_default: np.ndarray, mass: np.ndarray,
                        pair_ptr: np.ndarray, pair_dst: np.ndarray, pair_row: np.ndarray,
                        pair_emission: np.ndarray,
                        eos_term: np.ndarray, eos_live: np.ndarray, eos_log: float, eos_ok: bool,
                        feasible: np.ndarray, transition_t: torch.Tensor,
                        w_out: np.ndarray, c_out: np.ndarray, shared: dict | None = None) -> None:
    """One step (module docstring) for the states ``rows``, written into ``w_out`` [S, h]
    float32 (zeros) and ``c_out`` [S] float64 (−inf): numpy arrays (views of the tables);
    ``transition_t`` is Aᵀ, float32 or bfloat16 (then G is rounded to bfloat16 for the product,
    which accumulates in float32: the guide's ``precision``). ``shared``: the table's
    :func:`shared_products` (built here when not given)."""
    if shared is None:
        shared = shared_products(pair_dst, pair_row, w_prev.shape[1])
    g = np.empty((len(rows), w_prev.shape[1]), dtype=np.float32)
    m = np.empty(len(rows), dtype=np.float64)
    _build_g(w_prev, c_prev, rows, default, has_default, mass, pair_ptr, pair_dst,
             pair_emission, shared["pair_product"], shared["product_dst"], shared["product_row"],
             shared["products"], shared["needed"], eos_term, eos_live,
             float(eos_log) if eos_ok else -math.inf, bool(eos_ok), g, m)
    raw_t = (torch.from_numpy(g).to(transition_t.dtype) @ transition_t).float()
    row_max = raw_t.amax(1).numpy() if len(rows) else np.zeros(0, dtype=np.float32)
    raw = raw_t.numpy()
    _normalise(raw, row_max, m, rows, feasible, w_out, c_out, TINY)
