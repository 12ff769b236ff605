"""Guided log-probabilities: the pure function at the heart of :class:`ctrlg.ConstraintLogitsProcessor`.

Ctrl-G's rule (Zhang et al. 2024, eq. 2), for each row with DFA state s, prior p and r tokens left:

    log p(v | x≤t, α) = log_softmax_v( scores[v] + w · log p_hmm(α | x≤t, v) ),

i.e. p ∝ p_lm(v) · p_hmm(α | x≤t, v)^w with guidance strength w ≥ 0 (w = 1: Ctrl-G; w = 0:
logical masking; the −inf of infeasible tokens is never scaled),

with the guidance term log p_hmm(α | x≤t, v) from the row's tables (:meth:`GuideTables.log_ratio`,
−inf exactly on tokens that make acceptance impossible; logical mode: 0 on feasible tokens). The
guidance term is added to the LM's scores in one place, :func:`_guide` (behind both
:func:`apply_guidance` and :func:`guided_log_probs`). If the LM gives
every feasible token probability 0 (e.g. −inf logits), the row falls back to the guidance term
alone (a uniform LM), so a feasible token is still chosen; rows in dead states (no feasible token,
possible only for non-top beams) stay all −inf.

Beam scores. transformers' beam search ranks a beam by the sum of the scores its processors
returned. With :func:`guided_log_probs` that sum telescopes: writing
Z_s = Σ_v p_lm(v | x<s) p_hmm(α | x<s, v) for the normaliser of step s,

    Σ_{s≤t} log p(x_s | x<s, α) = log p_lm(x≤t) + log p_hmm(α | x≤t) − log p_hmm(α)
                                  − Σ_{s≤t} log ρ_s,      ρ_s = Z_s / p_hmm(α | x<s),

because p_hmm(α | x<s) = Σ_v p_hmm(v | x<s) p_hmm(α | x<s, v). ρ_s compares the LM's and the
HMM's expectations of the lookahead; when the LM *is* the HMM, ρ_s = 1 and the beam score is
exactly log p_hmm(x≤t | α). :func:`lookahead_scores` (the processor's ``beam_score="lookahead"``)
returns instead

    log p_lm(v | x≤t) + w · (log p_hmm(α | x≤t, v) − log p_hmm(α | x≤t))    (t ≥ 1; at t = 0
                                                                              no subtraction)

so a beam's summed score is log p_lm(x≤t) + w · log p_hmm(α | x≤t): the LM likelihood of its
prefix plus how likely the HMM thinks it can still finish accepted. A finished accepted
hypothesis has p_hmm(α | x) = 1 and scores exactly log p_lm(x). Softmax-normalised, these scores
are the guided distribution again (the subtracted term is a per-row constant), so sampling is
unchanged; they differ for beam search only. Cost: two passes over [R, V] (the row's
log p_hmm(α | x≤t) = logsumexp_v(log p_hmm(v | x≤t) + log p_hmm(α | x≤t, v)), with the HMM's
marginal p_hmm(v | x≤t) read off the product that gave the ratio).

Nothing here keeps state: the row bookkeeping is :mod:`ctrlg.guide.row_state`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from ctrlg.guide.feasibility import Feasibility
from ctrlg.guide.token_weights import log_ratios

__all__ = ["guidance_log_ratio", "apply_guidance", "guided_log_probs", "lookahead_scores"]


def guidance_log_ratio(tables: Sequence[Feasibility], table_of_row: np.ndarray, states: np.ndarray,
                       priors: torch.Tensor | None, remaining: int | np.ndarray,
                       device: torch.device | str = "cpu", *, shifted: bool = False,
                       log_accept: list | None = None) -> torch.Tensor:
    """log p_hmm(α | x≤t, v), float32 [R, V], for rows using ``tables[table_of_row[i]]`` in DFA
    state ``states[i]`` with prior ``priors[i]`` (None: logical guidance) and ``remaining`` tokens
    left (including v; one count for all rows, or one per row: the rows of a table and budget
    are one query, and the queries of one HMM one product, :func:`log_ratios`). Rows whose state
    cannot reach acceptance get −inf everywhere. With ``shifted`` a row may be off by a constant
    (:meth:`GuideTables.log_ratio`). A list ``log_accept`` (not with ``shifted``) receives
    log p_hmm(α | x≤t) = logsumexp_v(log p_hmm(v | x≤t) + log p_hmm(α | x≤t, v)), float32 [R]
    (−inf on rows that cannot reach acceptance), with the marginal p_hmm(v | x≤t) read off the
    same products."""
    if log_accept is not None and (shifted or priors is None):
        raise ValueError("log_accept needs the exact (unshifted) ratio of HMM guidance (priors)")
    table_of_row = np.asarray(table_of_row, dtype=np.int64)
    states = np.asarray(states, dtype=np.int64)
    R, V = len(states), tables[0].vocab_size
    remaining_of_row = np.broadcast_to(np.asarray(remaining, dtype=np.int64), (R,))
    queries, where = [], []
    for k in np.unique(table_of_row):
        table = tables[k]
        for left in np.unique(remaining_of_row[table_of_row == k]):   # one query per budget
            rows = np.flatnonzero((table_of_row == k) & (remaining_of_row == left))
            rows = rows[table.feasible[left, states[rows]]]
            if not len(rows):
                continue
            rows_t = torch.as_tensor(rows, device=priors.device) if priors is not None else None
            queries.append((table, states[rows], None if priors is None else priors[rows_t], int(left)))
            where.append(rows)
    marginals = [] if log_accept is not None else None
    tiled = bool(where) and sum(map(len, where)) == R and \
        np.array_equal(np.concatenate(where), np.arange(R))   # a batch's items are row blocks
    buffer = torch.empty(R, V, device=priors.device) if tiled and len(where) > 1 and \
        priors is not None else None
    ratios = log_ratios(queries, shifted=shifted, marginals=marginals, out=buffer)   # one product per HMM
    if log_accept is not None:
        accept = torch.full((R,), -math.inf, device=device)
        for rows, ratio, marginal in zip(where, ratios, marginals):
            value = torch.logsumexp(marginal.float().log() + ratio, 1)
            accept[torch.as_tensor(rows, device=device)] = value.to(device)
        log_accept.append(accept)
    if buffer is not None:
        return buffer.to(device)
    if len(where) == 1 and len(where[0]) == R:
        return ratios[0].to(device)
    out = torch.full((R, V), -math.inf, device=device)
    for rows, part in zip(where, ratios):
        out[torch.as_tensor(rows, device=device)] = part.to(device)
    return out


def apply_guidance(lm_scores: torch.Tensor, log_ratio: torch.Tensor,
                   strength: float = 1.0) -> torch.Tensor:
    """log_softmax(lm_scores + w · log_ratio) per row, float32 [R, V], with the fallback of the
    module docstring. The guidance strength w ≥ 0 scales only finite terms, so infeasible tokens
    stay exactly −inf for every w (w = 0: logical masking, w = 1: Ctrl-G). The inputs are left
    unchanged."""
    return _guide(lm_scores, log_ratio.clone(), strength, lambda bad: log_ratio[bad])


def guided_log_probs(scores: torch.Tensor, tables: Sequence[Feasibility], table_of_row: np.ndarray,
                     states: np.ndarray, priors: torch.Tensor | None, remaining: int | np.ndarray,
                     strength: float = 1.0) -> torch.Tensor:
    """Guided log-probabilities [R, V] from the LM's ``scores`` [R, V] (module docstring):
    :func:`apply_guidance` of :func:`guidance_log_ratio` at guidance strength ``strength``
    (``remaining``: one count, or one per row). Pure: no state is read or kept.

    Cost: besides the HMM products, four passes over [R, V] (quotient, log, the sum with the LM's
    scores in place, log_softmax); the guidance term is computed up to a per-row constant (the
    softmax removes it), and only for rows that fall back is it recomputed."""
    table_of_row, states = np.asarray(table_of_row), np.asarray(states)
    ratio = guidance_log_ratio(tables, table_of_row, states, priors, remaining, scores.device,
                               shifted=True)   # a per-row constant cancels in the softmax

    def ratio_again(bad: torch.Tensor) -> torch.Tensor:   # ``ratio`` was consumed: recompute
        rows = bad.nonzero()[:, 0].cpu().numpy()
        left = remaining if np.ndim(remaining) == 0 else np.asarray(remaining)[rows]
        return guidance_log_ratio(tables, table_of_row[rows], states[rows],
                                  None if priors is None else priors[bad.to(priors.device)],
                                  left, scores.device, shifted=True)

    return _guide(scores, ratio, strength, ratio_again)


def lookahead_scores(scores: torch.Tensor, tables: Sequence[Feasibility], table_of_row: np.ndarray,
                     states: np.ndarray, priors: torch.Tensor, remaining: int, strength: float = 1.0,
                     first: bool = False) -> torch.Tensor:
    """Beam scores that rank prefixes by log p_lm(x≤t) + w · log p_hmm(α | x≤t) (module
    docstring): ``scores`` [R, V] (the LM's log-probabilities, as beam search hands them) plus
    w · (log p_hmm(α | x≤t, v) − log p_hmm(α | x≤t)), the subtraction skipped when ``first`` (no
    token generated yet). −inf exactly on infeasible tokens (for every w ≥ 0); not normalised.
    Rows that cannot finish accepted are all −inf (no fallback: beam search drops them)."""
    table_of_row, states = np.asarray(table_of_row), np.asarray(states)
    log_accept: list = []
    ratio = guidance_log_ratio(tables, table_of_row, states, priors, remaining, scores.device,
                               log_accept=None if first else log_accept)
    if first:
        prev = torch.zeros(len(states), device=scores.device)
    else:   # log p_hmm(α | x≤t) from the marginal the ratio's product already gave
        prev = torch.where(torch.isfinite(log_accept[0]), log_accept[0], 0.0)
    if strength:   # −inf (infeasible) stays −inf: ratio − prev and w · (−inf) are −inf, no NaN
        return ratio.sub_(prev[:, None]).mul_(strength).add_(scores.float())
    return torch.where(torch.isfinite(ratio), scores.float(), -math.inf)


def _guide(lm_scores: torch.Tensor, log_ratio: torch.Tensor, strength: float,
           ratio_of_rows) -> torch.Tensor:
    """THE place where guidance meets the LM: :func:`_combine` (consuming ``log_ratio``), then
    :func:`_fallback` for the rows left without a finite entry, whose guidance term
    ``ratio_of_rows(bad)`` gives (``bad``: bool [R])."""
    guided = _combine(lm_scores, log_ratio, strength)
    bad = _dead_rows(guided)
    if bad is not None:
        guided[bad] = _fallback(ratio_of_rows(bad), strength)
    return guided


def _combine(lm_scores: torch.Tensor, log_ratio: torch.Tensor, strength: float) -> torch.Tensor:
    """log_softmax(lm + w · log_ratio), overwriting ``log_ratio`` with the sum (one pass, no
    new [R, V] buffer); w · (−inf) = −inf for w > 0, and w = 0 is masking (0 · −inf is NaN)."""
    lm = lm_scores.float()
    if strength == 0.0:
        log_ratio.masked_fill_(torch.isfinite(log_ratio), 0.0).add_(lm)
    else:
        torch.add(lm, log_ratio, alpha=strength, out=log_ratio)
    return torch.log_softmax(log_ratio, 1)


def _dead_rows(guided: torch.Tensor) -> torch.Tensor | None:
    """Bool [R] of rows with no finite entry (log_softmax made them NaN throughout, so column 0
    tells), or None when there is none."""
    bad = torch.isnan(guided[:, 0])
    return bad if bool(bad.any()) else None


def _fallback(log_ratio: torch.Tensor, strength: float) -> torch.Tensor:
    """The guidance term alone, log_softmax(w · log_ratio) (a uniform LM); rows without a
    feasible token stay all −inf."""
    term = torch.where(torch.isfinite(log_ratio), strength * log_ratio, log_ratio)
    fallback = torch.log_softmax(term, -1)
    return torch.where(torch.isnan(fallback), -math.inf, fallback)
