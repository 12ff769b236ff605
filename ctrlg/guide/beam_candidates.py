"""Lookahead beam scores on the only tokens a beam search can keep: exact values there, −inf
elsewhere, without the product with all of B.

A beam search that keeps K continuations per input picks, at each step, the K largest
``running_i + score_i(v)`` over the input's rows i and tokens v (transformers: K = max(2, 1 + #EOS)
· beams, ``running`` = the rows' beam scores). Only those entries' scores matter; any entry may be
lowered (to −inf) without changing the pick, as long as the K picked keep their values. With the
lookahead score of :func:`ctrlg.guide.guidance.lookahead_scores`,

    score_i(v) = l_i(v) + w · (log p_hmm(α | x≤t, v) − log p_hmm(α | x≤t))      (l: the LM's log-probs)

and log p_hmm(α | x≤t, v) ≤ c_{r−1}(δ(s, v)) (:mod:`ctrlg.guide.entry_weights`), so every token
outside the row's small exceptional letters and EOS obeys

    score_i(v) ≤ l_i(v) + β_i,        β_i = w · (max_{common classes} c_{r−1}(t) − log p_hmm(α | x≤t)).

Algorithm (all rows at once):

1. the exact scores of each row's ``m₀`` tokens of largest l (``torch.topk``) and of its EOS
   tokens (:meth:`EntryWeights.entry_log_ratios`, O(h) per entry); log p_hmm(α | x≤t) per row from
   the pair masses (:meth:`EntryWeights.log_accept_rows`); rows left without a finite threshold
   (step 2: some of those tokens infeasible) take 4× more of their top tokens, up to V or
   ``MAX_ENTRIES``;
2. a threshold θ_i per row below which none of its entries can be picked: the K-th best exact
   score of the row itself (valid whatever the beam scores: K better entries of the same row beat
   it), and, when the beam scores are known, the K-th best ``running + score`` among the input's
   exact entries minus ``running_i``; the larger of the two;
3. a row is complete when its largest l outside step 1's tokens plus β_i is below θ_i; small
   letters' tokens whose own bound reaches θ_i, and for incomplete rows every token with
   l_i(v) ≥ θ_i − β_i, are scored exactly too. Thresholds only rise as entries are added, so every
   entry whose bound reaches the final threshold has its exact value.

Rows that cannot be settled so — fewer than K finite scores, a feasible weight that underflowed
(its floor depends on the whole row), more than ``MAX_ENTRIES`` candidates — are computed by
:func:`ctrlg.guide.guidance.lookahead_scores` itself. A margin of ``MARGIN`` nats (plus a relative
part for large beam scores) on every comparison covers float rounding, so the pick equals the
full computation's up to ties within rounding.

Cost per step: one streaming read of the LM's [R, V] scores for their block maxima, then only
the blocks that can hold the top tokens or entries above the floors (compiled passes,
:mod:`ctrlg.kernels.row_candidates_cpu`), and one [R, V] fill; O(h) per scored entry (a few
times K per input at 8–128 beams on CommonGen: a few hundred to a few thousand, against R·V for
the product); and O(h · pairs) per row without a parent entry (``known_prev``: from the second
step on, only the rows of the full fallback): independent of V·h, so an HMM of h = 2,048 costs
little more than h = 512.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from ctrlg.guide.feasibility import Feasibility
from ctrlg.kernels.cpu_loops import numpy_ready
from ctrlg.kernels.row_candidates_cpu import at_least_per_row, block_maxima, top_per_row

__all__ = ["top_lookahead_scores", "MARGIN", "MAX_ENTRIES"]

#: Absolute slack (nats) on every bound comparison; a relative 1e-5 of the compared magnitudes is added.
MARGIN = 1e-3
#: A row needing more exactly scored entries than this is computed in full instead.
MAX_ENTRIES = 4096


def top_lookahead_scores(scores: torch.Tensor, tables: Sequence[Feasibility], table_of_row: np.ndarray,
                         states: np.ndarray, priors: torch.Tensor, remaining: int, strength: float,
                         first: bool, keep: int, running: torch.Tensor | None = None,
                         groups: np.ndarray | None = None, full=None,
                         out: torch.Tensor | None = None, known_prev: np.ndarray | None = None,
                         on_scored=None, on_support=None) -> torch.Tensor:
    """Lookahead scores [R, V] (module docstring): exact at every entry that can be among the
    ``keep`` best of its row — or, with ``running`` [R] beam scores and ``groups`` [R] (the
    input of each row), among the ``keep`` best ``running + score`` of its input — and −inf
    elsewhere. ``full(rows)``: the full lookahead scores of those rows (for the rows that fall
    back); ``strength`` > 0. ``out``: a float32 [R, V] tensor to write the result into, which
    may be ``scores`` itself (everything is read from ``scores`` before it is overwritten): the
    −inf fill then writes memory already in use instead of a fresh [R, V] buffer.

    ``known_prev`` [R] float64: log p_hmm(α | x≤t) of the rows where it is already known (NaN
    elsewhere, where it is computed). A row's value is its parent's exact entry log p_hmm(α |
    x<t, x_t) of the previous step: the same quantity (the tables' recurrence), so reusing it
    changes the scores only by float rounding, and makes the beam scores telescope exactly.
    ``on_scored(rows, tokens, log_ratios)``: called with the exactly scored entries that are
    written (rows of the fallback excluded) and their finite log p_hmm(α | x≤t, v), for the
    caller to pass on as the next step's ``known_prev``. ``on_support(rows, tokens)``: called with
    every entry written (outside them the result is −inf), or ``(None, None)`` when a row fell back
    to its full scores (:func:`ctrlg.lm.beam_scores.publish_support`)."""
    table_of_row = np.asarray(table_of_row, dtype=np.int64)
    states = np.asarray(states, dtype=np.int64)
    R, V = scores.shape
    dev = scores.device
    lm = scores.float()
    w = float(strength)
    prev = np.zeros(R)
    common = np.full(R, -math.inf)
    small = []
    split = _split_by_table(table_of_row, states, priors)
    for k, (rows, table_states, table_priors) in split.items():
        table = tables[k]
        if not first:
            prev[rows] = np.nan if known_prev is None else known_prev[rows]
            sub = np.flatnonzero(np.isnan(prev[rows]))          # rows without a parent entry
            if len(sub):
                part = table_priors if len(sub) == len(rows) else \
                    table_priors[torch.as_tensor(sub, device=table_priors.device)]
                prev[rows[sub]] = table.log_accept_rows(table_states[sub], part, remaining).cpu().numpy()
        bound, (srow, stok, sbound) = table.successor_bounds(table_states, remaining)
        common[rows] = bound
        small.append((rows[srow], stok, sbound))
    live = np.isfinite(prev) & np.array([tables[k].feasible[remaining, s]
                                         for k, s in zip(table_of_row, states)], dtype=bool)
    fallback = np.zeros(R, dtype=bool)
    fallback[~np.isfinite(prev) & live] = True          # p_hmm(α | x≤t) underflowed: the full path
    live &= ~fallback
    beta = np.where(live, w * (common - prev), -math.inf)
    entries = _Entries(lm, tables, table_of_row, split, remaining, w, prev)

    # 1. each live row's m₀ tokens of largest l, and its EOS tokens
    per_row = keep if running is None else max(4, -(-2 * keep // max(1, _largest_group(groups))))
    m0 = min(V, per_row)
    live_rows = np.flatnonzero(live)
    top_l = np.full(R, -math.inf)
    blocks = block_maxima(lm) if len(live_rows) and numpy_ready(lm) else None   # shared by both passes
    if len(live_rows):
        values, index = top_per_row(lm, live_rows, m0, blocks)
        top_l[live_rows] = values[:, -1].double().cpu().numpy()
        entries.add(np.repeat(live_rows, m0), index.reshape(-1).cpu().numpy())
        eos = _eos_ids(tables)
        if len(eos):
            entries.add(np.repeat(live_rows, len(eos)), np.tile(eos, len(live_rows)))
    small_rows = np.concatenate([s[0] for s in small]) if small else np.zeros(0, np.int64)
    small_tok = np.concatenate([s[1] for s in small]) if small else np.zeros(0, np.int64)
    small_bound = np.concatenate([s[2] for s in small]) if small else np.zeros(0)

    # 2. thresholds (more top tokens for rows without one); 3. the rest of every row's possible picks
    theta = _thresholds(entries, R, keep, running, groups)
    m = m0
    while m < min(V, MAX_ENTRIES):
        short = np.flatnonzero(live & ~np.isfinite(theta))
        if not len(short):
            break
        m = min(V, MAX_ENTRIES, 4 * m)
        values, index = top_per_row(lm, short, m, blocks)
        top_l[short] = values[:, -1].double().cpu().numpy()
        entries.add(np.repeat(short, m), index.reshape(-1).cpu().numpy())
        theta = _thresholds(entries, R, keep, running, groups)
    margin = MARGIN + 1e-5 * (np.abs(np.where(np.isfinite(theta), theta, 0.0))
                              + (0.0 if running is None else np.abs(running.double().cpu().numpy())))
    fallback |= live & ~np.isfinite(theta)
    settle = live & ~fallback
    last_rows, last_tokens = [], []       # scored together: one pass per table
    if len(small_rows):
        at = torch.as_tensor(small_rows, device=dev), torch.as_tensor(small_tok, device=dev)
        reach = lm[at].double().cpu().numpy() + w * (small_bound - prev[small_rows])
        pick = settle[small_rows] & (reach >= theta[small_rows] - margin[small_rows])
        last_rows.append(small_rows[pick])
        last_tokens.append(small_tok[pick])
    open_rows = np.flatnonzero(settle & (top_l + beta >= theta - margin))
    if len(open_rows):
        floor = theta[open_rows] - beta[open_rows] - margin[open_rows]
        at, columns, counts = at_least_per_row(lm, open_rows, floor, MAX_ENTRIES, blocks)
        fallback[open_rows[counts > MAX_ENTRIES]] = True
        last_rows.append(open_rows[at])
        last_tokens.append(columns)
    if last_rows:
        entries.add(np.concatenate(last_rows), np.concatenate(last_tokens))
    fallback |= entries.lost_rows(R)

    where = np.flatnonzero(fallback)
    if len(where) and full is None:
        raise ValueError("rows need the full lookahead scores but no `full` was given")
    full_rows = full(where).float() if len(where) else None     # read before ``out`` is filled
    out = out.fill_(-math.inf) if out is not None else torch.full((R, V), -math.inf, device=dev)
    rows, tokens, values = entries.result()
    keep_entry = ~fallback[rows]
    if on_scored is not None:
        ratios = entries.log_ratios()
        scored = keep_entry & np.isfinite(ratios)
        on_scored(rows[scored], tokens[scored], ratios[scored])
    if on_support is not None:
        on_support(*((None, None) if len(where) else (rows, tokens)))
    out[torch.as_tensor(rows[keep_entry], device=dev),
        torch.as_tensor(tokens[keep_entry], device=dev)] = values[torch.as_tensor(keep_entry, device=dev)].float()
    if full_rows is not None:
        out[torch.as_tensor(where, device=dev)] = full_rows
    return out


def _split_by_table(table_of_row: np.ndarray, states: np.ndarray, priors: torch.Tensor) -> dict:
    """table → (its rows, their states, their priors [rows, h] contiguous), gathered once per
    step (every pass of the step reads them; one table's rows are ``priors`` itself)."""
    split = {}
    for k in np.unique(table_of_row):
        rows = np.flatnonzero(table_of_row == k)
        part = priors if len(rows) == len(table_of_row) else \
            priors[torch.as_tensor(rows, device=priors.device)]
        split[int(k)] = rows, states[rows], part.contiguous()
    return split


class _Entries:
    """The exactly scored entries so far: (row, token) pairs, their scores, lost rows."""

    def __init__(self, lm, tables, table_of_row, split, remaining, w, prev):
        self.lm, self.tables, self.table_of_row = lm, tables, table_of_row
        self.remaining, self.w = remaining, w
        self.prev = torch.as_tensor(prev, device=lm.device)
        self.V = lm.shape[1]
        self._keys = np.zeros(0, dtype=np.int64)
        self._values = torch.zeros(0, dtype=torch.float64, device=lm.device)
        self._ratios = np.zeros(0)           # log p_hmm(α | x≤t, v) of the same entries
        self._lost = np.zeros(0, dtype=np.int64)
        self._split = split                  # _split_by_table

    def add(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """Score the new (row, token) entries exactly (entries already scored are skipped)."""
        keys = np.unique(np.asarray(rows, dtype=np.int64) * self.V + np.asarray(tokens, dtype=np.int64))
        keys = keys[~np.isin(keys, self._keys, assume_unique=True)]
        if not len(keys):
            return
        rows, tokens = keys // self.V, keys % self.V
        values = torch.empty(len(keys), dtype=torch.float64, device=self.lm.device)
        for k in np.unique(self.table_of_row[rows]):
            at = np.flatnonzero(self.table_of_row[rows] == k)
            table_rows, table_states, table_priors = self._split[int(k)]
            local = np.searchsorted(table_rows, rows[at])
            ratio, lost = self.tables[k].entry_log_ratios(local, tokens[at], table_states,
                                                          table_priors, self.remaining)
            values[torch.as_tensor(at, device=values.device)] = ratio.to(values.device)
            self._lost = np.concatenate([self._lost, rows[at][lost]])
        rows_t = torch.as_tensor(rows, device=self.lm.device)
        lm = self.lm[rows_t, torch.as_tensor(tokens, device=self.lm.device)].double()
        ratios = values.cpu().numpy()
        # −inf stays −inf: w · (−inf − prev) is −inf for w > 0
        values = lm + self.w * (values - self.prev[rows_t])
        order = np.argsort(np.concatenate([self._keys, keys]), kind="stable")
        self._keys = np.concatenate([self._keys, keys])[order]
        self._values = torch.cat([self._values, values])[torch.as_tensor(order, device=values.device)]
        self._ratios = np.concatenate([self._ratios, ratios])[order]

    def lost_rows(self, R: int) -> np.ndarray:
        out = np.zeros(R, dtype=bool)
        out[self._lost] = True
        return out

    def result(self) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
        return self._keys // self.V, self._keys % self.V, self._values

    def log_ratios(self) -> np.ndarray:
        """log p_hmm(α | x≤t, v) of the entries of :meth:`result`, in its order."""
        return self._ratios


def _thresholds(entries: _Entries, R: int, keep: int, running, groups) -> np.ndarray:
    """θ per row (module docstring, step 2): the row's own ``keep``-th best exact score and,
    with beam scores, the input's ``keep``-th best ``running + score`` minus the row's running
    score; −inf where fewer than ``keep`` finite exact scores exist."""
    rows, _, values = entries.result()
    values = values.cpu().numpy()
    theta = _kth_best(rows, values, R, keep)
    if running is not None:
        run = running.double().cpu().numpy()
        groups = np.asarray(groups, dtype=np.int64)
        best = _kth_best(groups[rows], values + run[rows], int(groups.max()) + 1, keep)
        theta = np.maximum(theta, best[groups] - run)
    return theta


def _kth_best(owner: np.ndarray, values: np.ndarray, num: int, k: int) -> np.ndarray:
    """The k-th largest finite value per owner (−inf where fewer than k)."""
    finite = np.isfinite(values)
    owner, values = owner[finite], values[finite]
    order = np.lexsort((-values, owner))
    owner, values = owner[order], values[order]
    start = np.searchsorted(owner, np.arange(num))
    count = np.bincount(owner, minlength=num)
    out = np.full(num, -math.inf)
    ok = count >= k
    out[ok] = values[start[ok] + k - 1]
    return out


def _largest_group(groups) -> int:
    return int(np.bincount(np.asarray(groups, dtype=np.int64)).max()) if groups is not None else 1


def _eos_ids(tables) -> np.ndarray:
    ids = sorted({e for t in tables for e in getattr(t, "eos_ids", [])})
    return np.asarray(ids, dtype=np.int64)
