"""Ctrl-G's guidance at listed entries: p_hmm(α | x≤t, v) for given (row, token) pairs and each
row's p_hmm(α | x≤t), in O(h) per entry, instead of a product with all of B.

Notation of :mod:`ctrlg.guide.tables`. A row is in DFA state s with prior p over the hidden state
of the next token v and r tokens left (including v); t = δ(s, v), d = default(s), and Ŵ, c are
the tables at r − 1:

    log p_hmm(α | x≤t, v) = log (p ⊙ B[:, v]) · Ŵ(t) − log p · B[:, v] + c(t)      (v not EOS)
                          = 0 / −inf                 (EOS e: allowed and δ(s, e) accepting / not)
                          = log p · Ŝ + c_σ − log p · B[:, e]           (EOS e with a suffix σ)

    p_hmm(α | x≤t) = Σ_v P(v, α | x≤t)
                   = e^{c(d)} p · (M_s ⊙ Ŵ(d)) + Σ_{pairs (s, t)} e^{c(t)} p · (Ē_{s,t} ⊙ Ŵ(t))
                     + Σ_{allowed accepting e} P(e, α | x≤t)

with M_s and Ē the backward recurrence's non-exception mass and pair masses: the sum the
recurrence forms for W_r(s) before its product with A, read with the row's own prior. Cost:
O(h) per entry (both dot products in one compiled pass on the CPU:
:mod:`ctrlg.kernels.entry_dots_cpu`), O(h · (1 + pairs of s)) per row.

Bounds. Ŵ(t) ≤ 1 entrywise (each row is scaled to max 1), so log p_hmm(α | x≤t, v) ≤ c(δ(s, v))
for every token: :meth:`EntryWeights.successor_bounds` gives each row the largest such bound over
the tokens of its default and of its exceptional letters of ≥ ``BOUND_LETTER`` tokens (one number
per row, valid for every token outside the small letters), and the small letters' tokens with
their own bounds. :mod:`ctrlg.guide.beam_candidates` uses both to find the only tokens a beam
search can keep.

:class:`EntryWeights` is mixed into :class:`ctrlg.guide.tables.GuideTables` and reads its tables.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ctrlg.dfa.core import ragged_indices
from ctrlg.errors import ConstraintError
from ctrlg.kernels.entry_dots_cpu import entry_dots, triple_dots

__all__ = ["EntryWeights", "BOUND_LETTER", "row_logsumexp"]

#: Exceptional letters with at least this many tokens are bounded together with the default
#: (one bound per row); smaller ones token by token.
BOUND_LETTER = 64


def row_logsumexp(rows: torch.Tensor, values: torch.Tensor, num_rows: int) -> torch.Tensor:
    """log Σ_{k: rows[k] = i} exp(values[k]) for i < ``num_rows`` (float64; −inf for rows
    without a finite term)."""
    values = values.double()
    top = torch.full((num_rows,), -math.inf, dtype=torch.float64, device=values.device)
    top.scatter_reduce_(0, rows, values, reduce="amax")
    safe = torch.where(torch.isfinite(top), top, 0.0)
    total = torch.zeros(num_rows, dtype=torch.float64, device=values.device)
    total.index_add_(0, rows, torch.exp(values - safe[rows]))
    return torch.log(total) + safe


class EntryWeights:
    """Per-entry queries of the guide tables (module docstring)."""

    def _entry_setup(self, states, priors, remaining):
        if self.hmm is None or priors is None:
            raise ConstraintError("entry weights need an HMM and priors; these tables are logical-only")
        states, remaining = self._check_remaining(states, remaining)
        return states, remaining

    def log_accept_rows(self, states, priors: torch.Tensor, remaining) -> torch.Tensor:
        """log p_hmm(α | x≤t) per row, float64 [R] (module docstring); −inf for rows whose state
        cannot reach acceptance within the remaining tokens."""
        states, remaining = self._entry_setup(states, priors, remaining)
        dev, R = priors.device, len(states)
        rr = torch.as_tensor(remaining - 1, device=dev)
        scale = self.log_scale
        has = torch.as_tensor(self.has_default[states], device=dev)
        rows_t = torch.arange(R, device=dev)
        S = self.dfa.num_states
        priors = priors.contiguous()
        tables = self.w_hat.reshape(-1, self.w_hat.shape[-1])          # [(n + 1) · S, h]
        steps_np = remaining.astype(np.int64) - 1
        default_np = np.where(self.has_default[states], self.dfa.default[states], 0)
        default = triple_dots(priors, tables, self._nonexc_mass, np.arange(R),
                              steps_np * S + default_np, states).to(dev)
        d = torch.as_tensor(default_np, device=dev)                  # rows without one: masked
        terms = [torch.where(has, torch.log(default) + scale[rr, d], -math.inf)]
        owners = [rows_t]
        lo, hi = self._pair_ptr[states], self._pair_ptr[states + 1]
        if int((hi - lo).sum()):
            rows = np.repeat(np.arange(R), hi - lo)
            pairs = ragged_indices(lo, hi - lo)
            rows_p = torch.as_tensor(rows, device=dev)
            dst = self._pair_dst[pairs]
            value = triple_dots(priors, tables, self._pair_emission, rows,
                                steps_np[rows] * S + dst, self._pair_row[pairs]).to(dev)
            terms.append(torch.log(value) + scale[rr[rows_p], torch.as_tensor(dst, device=dev)])
            owners.append(rows_p)
        eos_rows, eos_tokens = self._allowed_eos(states, remaining)
        if len(eos_rows):
            rows_e = torch.as_tensor(eos_rows, device=dev)
            terms.append(self._eos_joint(priors[rows_e], torch.as_tensor(eos_tokens, device=dev)))
            owners.append(rows_e)
        out = row_logsumexp(torch.cat(owners), torch.cat(terms), R)
        dead = torch.as_tensor(~self.feasible[remaining, states], device=dev)
        return out.masked_fill_(dead, -math.inf)

    def _allowed_eos(self, states: np.ndarray, remaining: np.ndarray):
        """(row, EOS token) for each EOS that is allowed and accepting in the row's state."""
        if not self.eos_ids:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        allowed = np.array([self.eos_allowed(r) for r in remaining], dtype=bool)
        ok = allowed[:, None] & self.eos_accept[states]
        rows, j = np.nonzero(ok)
        return rows, np.asarray(self.eos_ids, dtype=np.int64)[j]

    def _eos_joint(self, priors: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """log P(e, α | x≤t) of allowed accepting EOS entries (float64): the marginal
        p · B[:, e], or with a suffix log p · Ŝ + c_σ."""
        if self.suffix_ids:
            return torch.log((priors @ self._suffix_hat).double()) + self._suffix_log
        return torch.log((priors * self._emission_t[tokens]).sum(1).double())

    def entry_log_ratios(self, rows: np.ndarray, tokens: np.ndarray, states, priors: torch.Tensor,
                         remaining) -> tuple[torch.Tensor, np.ndarray]:
        """(log p_hmm(α | x≤t, v) float64 [C], lost bool [C]) at the entries (row ``rows[k]``,
        token ``tokens[k]``) of rows in ``states`` with ``priors`` [R, h] and ``remaining``
        tokens left. −inf exactly where v is infeasible; ``lost`` marks feasible entries whose
        float weight underflowed (their value is not exact: the caller must handle the row)."""
        states, remaining = self._entry_setup(states, priors, remaining)
        dev = priors.device
        rows = np.asarray(rows, dtype=np.int64)
        tokens = np.asarray(tokens, dtype=np.int64)
        out = torch.full((len(rows),), -math.inf, dtype=torch.float64, device=dev)
        lost = np.zeros(len(rows), dtype=bool)
        is_eos = np.isin(tokens, np.asarray(self.eos_ids, dtype=np.int64))
        regular = np.flatnonzero(~is_eos)
        if len(regular):
            r, v = rows[regular], tokens[regular]
            succ = self.dfa.step_many(states[r], v)
            steps = remaining[r] - 1
            S = self.dfa.num_states
            joint, marginal = entry_dots(priors.contiguous(), self._emission_t,
                                         self.w_hat.reshape(-1, self.w_hat.shape[-1]), r, v,
                                         steps.astype(np.int64) * S + succ)
            scale = self.log_scale[torch.as_tensor(steps, device=dev), torch.as_tensor(succ, device=dev)]
            value = torch.log(joint) - torch.log(marginal) + scale
            feasible = self.feasible[steps, succ]
            bad = (~torch.isfinite(value)).cpu().numpy() & feasible
            lost[regular] = bad
            out[torch.as_tensor(regular, device=dev)] = torch.where(
                torch.as_tensor(feasible, device=dev), value, -math.inf)
        special = np.flatnonzero(is_eos)
        if len(special):
            r, e = rows[special], tokens[special]
            allowed = np.array([self.eos_allowed(x) for x in remaining[r]], dtype=bool)
            ok = allowed & self._eos_accepts(states[r], e)
            value = torch.zeros(len(special), dtype=torch.float64, device=dev)
            if self.suffix_ids:
                r_t, e_t = torch.as_tensor(r, device=dev), torch.as_tensor(e, device=dev)
                value = self._eos_joint(priors[r_t], e_t) - \
                    torch.log((priors[r_t] * self._emission_t[e_t]).sum(1).double())
            out[torch.as_tensor(special, device=dev)] = torch.where(
                torch.as_tensor(ok, device=dev), value, -math.inf)
        return out, lost

    def _eos_accepts(self, states: np.ndarray, eos_tokens: np.ndarray) -> np.ndarray:
        """Whether δ(s, e) accepts, for paired arrays of states and EOS tokens."""
        column = {e: j for j, e in enumerate(self.eos_ids)}
        j = np.array([column[int(e)] for e in eos_tokens], dtype=np.int64)
        return self.eos_accept[states, j]

    def successor_bounds(self, states, remaining):
        """Upper bounds of log p_hmm(α | x≤t, v) from the successors' scales c_{r−1}(δ(s, v))
        (module docstring): (``common`` float64 [R], the largest over the default and the
        exceptional letters of ≥ ``BOUND_LETTER`` tokens; ``small`` = (rows, tokens, bounds)
        of the tokens of the smaller exceptional letters, EOS excluded). −inf bounds are dead
        classes."""
        states, remaining = self._check_remaining(states, remaining)
        c = self.log_scale.cpu().numpy()
        steps = remaining - 1
        common = np.where(self.has_default[states], c[steps, self.dfa.default[states]], -math.inf)
        rows, k = self._row_exceptions(states)
        size = self.letter_size[self.exc.tok[k]]
        bound = c[steps[rows], self.exc.dst[k]]
        big = size >= BOUND_LETTER
        np.maximum.at(common, rows[big], bound[big])
        small = ~big
        trows, tokens, tk = self._expand(rows[small], k[small])
        keep = ~np.isin(tokens, np.asarray(self.eos_ids, dtype=np.int64))
        tbound = c[steps[trows], self.exc.dst[tk]]
        return common, (trows[keep], tokens[keep], tbound[keep])
