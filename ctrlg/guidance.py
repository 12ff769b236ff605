"""Guided log-probabilities: the pure function at the heart of :class:`ctrlg.ConstraintLogitsProcessor`.

Ctrl-G's rule (Zhang et al. 2024, eq. 2), for each row with DFA state s, prior p and r tokens left:

    log p(v | x≤t, α) = log_softmax_v( scores[v] + log p_hmm(α | x≤t, v) ),

with the guidance term log p_hmm(α | x≤t, v) from the row's tables (:meth:`GuideTables.log_ratio`,
−inf exactly on tokens that make acceptance impossible; logical mode: 0 on feasible tokens). The
guidance term is added to the LM's scores in one place, :func:`apply_guidance`. If the LM gives
every feasible token probability 0 (e.g. −inf logits), the row falls back to the guidance term
alone (a uniform LM), so a feasible token is still chosen; rows in dead states (no feasible token,
possible only for non-top beams) stay all −inf.

Nothing here keeps state: the row bookkeeping is :mod:`ctrlg.row_state`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from ctrlg.feasibility import Feasibility

__all__ = ["guidance_log_ratio", "apply_guidance", "guided_log_probs"]


def guidance_log_ratio(tables: Sequence[Feasibility], table_of_row: np.ndarray, states: np.ndarray,
                       priors: torch.Tensor | None, remaining: int,
                       device: torch.device | str = "cpu") -> torch.Tensor:
    """log p_hmm(α | x≤t, v), float32 [R, V], for rows using ``tables[table_of_row[i]]`` in DFA
    state ``states[i]`` with prior ``priors[i]`` (None: logical guidance) and ``remaining`` tokens
    left (including v). Rows whose state cannot reach acceptance get −inf everywhere."""
    table_of_row = np.asarray(table_of_row, dtype=np.int64)
    states = np.asarray(states, dtype=np.int64)
    R, V = len(states), tables[0].vocab_size
    out = None
    for k in np.unique(table_of_row):
        table = tables[k]
        rows = np.flatnonzero(table_of_row == k)
        rows = rows[table.feasible[remaining, states[rows]]]
        if not len(rows):
            continue
        rows_t = torch.as_tensor(rows, device=priors.device) if priors is not None else None
        ratio = table.log_ratio(states[rows], None if priors is None else priors[rows_t],
                                remaining).to(device)
        if len(rows) == R:
            return ratio
        if out is None:
            out = torch.full((R, V), -math.inf, device=device)
        out[torch.as_tensor(rows, device=device)] = ratio
    return torch.full((R, V), -math.inf, device=device) if out is None else out


def apply_guidance(lm_scores: torch.Tensor, log_ratio: torch.Tensor) -> torch.Tensor:
    """THE place where guidance meets the LM: log_softmax(lm_scores + log_ratio) per row, float32
    [R, V], with the fallback of the module docstring."""
    guided = lm_scores.float() + log_ratio
    lse = torch.logsumexp(guided, 1, keepdim=True)
    bad = ~torch.isfinite(lse[:, 0])
    guided = guided - lse
    if bool(bad.any()):
        fallback = torch.log_softmax(log_ratio[bad], -1)
        guided[bad] = torch.where(torch.isnan(fallback), -math.inf, fallback)
    return guided


def guided_log_probs(scores: torch.Tensor, tables: Sequence[Feasibility], table_of_row: np.ndarray,
                     states: np.ndarray, priors: torch.Tensor | None, remaining: int) -> torch.Tensor:
    """Guided log-probabilities [R, V] from the LM's ``scores`` [R, V] (module docstring):
    :func:`apply_guidance` of :func:`guidance_log_ratio`. Pure: no state is read or kept."""
    ratio = guidance_log_ratio(tables, table_of_row, states, priors, remaining, scores.device)
    return apply_guidance(scores, ratio)
