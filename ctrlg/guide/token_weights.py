"""Per-token queries of the Ctrl-G guide tables (:mod:`ctrlg.guide.tables`): P(v | x≤t), P(v, α | x≤t)
and their ratio, the guidance term log p_hmm(α | x≤t, v), for every token v of a batch of rows.

Per generated token (row in DFA state s, prior p over the hidden state of the token being
generated, r tokens left including this one):

    P(v | x≤t)    = (p B)[v]
    P(v, α | x≤t) = ((p ⊙ W_{r-1}(default(s))) B)[v]           for non-exception v
                  = p · (B[:, v] ⊙ W_{r-1}(δ(s, v)))           for v ∈ exc(s)
                  = P(e | x≤t) · [EOS allowed ∧ δ(s, e) accepting]  for v = e ∈ EOS

costing O(h·V + h·|exc(s)|) — independent of S and t.

Per token, for a batch of R rows: one [2R, h]·[h, V] product (B packed once for oneDNN,
:class:`ctrlg.kernels.packed_linear.PackedLinear`) gives P(v | x≤t) and the default successor's
joint for every v. Exceptional letters with ≥ ``ctrlg.guide.tables.BLOCK_LETTER`` tokens get one
[rows, h]·[h, |a|] product per distinct letter a over its own packed columns; their q vectors
are first scaled to the row's default scale (e^{c(t) − c(default)}, O(h)) and the results written
into the joint rows, so the quotient and the log run once over [R, V] ("folding"; an exception
whose scaled weights could leave the float range keeps its own scale and is written after the
log). While 2R + #such exceptions ≤ ``INLINE_ROWS`` they ride along as extra rows of the dense
product instead, so B is read once. Smaller letters are handled token by token
(p · (B[:, v] ⊙ Ŵ(t))). A row costs O(h·V·2 + h·Σ_{exceptional a}|a|) multiply-adds and four
passes over its V entries. ``precision="bfloat16"`` runs the products in bfloat16 with float32
accumulation (≤ ~1% relative error on the guidance term; feasibility stays exact).

Feasibility per row: a finite guidance value implies a feasible token, and the converse is
proved without touching the [R, V] result when every q vector's lower bound
max_z q_z · min_v B[z, v] is ≥ ``UNDERFLOW_BOUND`` (no feasible weight can then be 0 in float32 or
bfloat16); otherwise the finite entries are counted against :meth:`Feasibility.feasible_counts`
and underflowed feasible tokens get a floor.

Notation as in :mod:`ctrlg.guide.tables`. :class:`TokenWeights` is the query half of
:class:`ctrlg.guide.tables.GuideTables`: it reads the tables (Ŵ_r, c_r) and the packed emission products
that ``GuideTables`` builds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ctrlg.dfa.core import ragged_indices
from ctrlg.errors import ConstraintError

__all__ = ["TokenWeights", "log_ratios", "RATIO_FLOOR_GAP", "INLINE_ROWS", "UNDERFLOW_BOUND", "FOLD_MAX_GAIN"]

#: A feasible token whose float weight underflowed gets a log-ratio this much below the smallest
#: finite log-ratio of its row (or 0 when none is finite), so it stays possible but negligible.
RATIO_FLOOR_GAP = 50.0
#: Up to this many rows in the dense product (2 per query row + 1 per block-letter exception),
#: block letters ride along as extra rows (B is read once: what matters at small batch, where the
#: product is memory-bound); beyond it, each block letter gets its own small product.
INLINE_ROWS = 16
#: A product q · B[:, v] bounded below by this (see ``TokenWeights._weight_floor``) is a normal
#: positive float in float32 and bfloat16 whatever the rounding, so it cannot have underflowed.
UNDERFLOW_BOUND = 1e-30
#: Block-letter joints are folded into the default's scale only while the factor e^{c(t) − c}
#: stays below e^this (so q · B ≤ e^this, far from overflow in float32 and bfloat16).
FOLD_MAX_GAIN = 60.0


class TokenWeights:
    """Per-token queries (module docstring), mixed into :class:`ctrlg.guide.tables.GuideTables`."""

    def token_weights(self, states, priors: torch.Tensor, remaining) -> tuple[torch.Tensor, torch.Tensor]:
        """(log P(v, α | x≤t), log P(v | x≤t)), both float32 [R, V], for rows in DFA ``states``
        with priors ``priors`` [R, h] (normalised) and ``remaining`` tokens left (incl. v).

        Raw values: −inf where the float product is 0 (infeasible or underflowed); combine with
        :meth:`token_feasible` (see :meth:`log_ratio`)."""
        return self._weights(states, priors, remaining, ratio=False)

    def _weights(self, states, priors: torch.Tensor, remaining, ratio: bool, shifted: bool = False):
        """Shared body of :meth:`token_weights` and :meth:`log_ratio`. With ``ratio`` it returns
        (log(P(v, α | x≤t) / P(v | x≤t)), safe) directly (one log per entry instead of two), where
        ``safe`` says that no feasible token's weight can have underflowed
        (:meth:`_weight_floor`), so the result needs no per-entry check. With ``shifted`` each
        row is returned minus a constant of its own (one pass over [R, V] less).

        One [2R, h]·[h, V] product gives P(v | x≤t) and the default-successor joint for every v
        (:meth:`_dense_plan` stacks its left operand; :func:`log_ratios` runs the products of
        several tables of one HMM as one); exception tokens are then overwritten
        (:meth:`_from_dense`)."""
        plan = self._dense_plan(states, priors, remaining, ratio, shifted)
        return self._from_dense(plan, self._emission_product(plan.operand))

    def _dense_plan(self, states, priors: torch.Tensor, remaining, ratio: bool,
                    shifted: bool = False) -> "_DensePlan":
        """Everything before the dense product: the rows' default-successor q vectors and their
        scales, the exception rows, and the stacked left operand [p; p ⊙ Ŵ(default); inline
        block-letter q's] of the product with B."""
        if self.hmm is None:
            raise ConstraintError("token weights need an HMM; these tables are logical-only")
        states, remaining = self._check_remaining(states, remaining)
        dev = priors.device
        R = len(states)
        rr = torch.as_tensor(remaining - 1, device=dev)
        d = self._default_t[torch.as_tensor(states, device=dev)]
        c_default = self.log_scale[rr, d]                                # [R] float64
        rows, k = self._row_exceptions(states)
        block = self.block_letter[self.exc.tok[k]]
        inline = 2 * R + int(block.sum()) <= INLINE_ROWS
        live = torch.isfinite(c_default)
        base = torch.where(live, c_default, 0.0)  # each row's values are relative to this scale
        exc = _RowExceptions(priors, None, rr, ratio, base if shifted else torch.zeros_like(base))
        q_default = priors * self.w_hat[rr, d] * live.float()[:, None]
        stacked = [priors, q_default]
        block_terms = None
        if inline:  # few rows: B is read once, block letters as extra rows of the same product
            block_terms = self._successor_terms(exc, rows[block], k[block])
            stacked.append(block_terms[1])
        return _DensePlan(states, remaining, exc, rows, k, block, inline, live, base, q_default,
                          block_terms, torch.cat(stacked), shifted)

    def _from_dense(self, plan: "_DensePlan", both: torch.Tensor, out: torch.Tensor | None = None):
        """The rest of :meth:`_weights`, from the dense product ``both`` = plan.operand · B:
        exception tokens of block letters by one [rows, h]·[h, |letter|] product per distinct
        letter (or, for few rows, from extra rows of the dense product), the others token by
        token, EOS last.

        Folding (ratio mode, per-letter block products): a row's block-letter joints are brought
        to the default's scale c_default by scaling their q vectors by e^{c(t) − c_default}
        (O(h) per exception) and written into the joint rows *before* the quotient and log,
        so those run once over [R, V]. Exceptions whose scaled weights could underflow (or
        overflow) keep their own scale and are written after the log instead. ``out`` (ratio
        mode): a float32 [R, V] buffer to write the result into."""
        exc, states, rows, k, block = plan.exc, plan.states, plan.rows, plan.k, plan.block
        R, ratio = len(states), exc.ratio
        fold = ratio and not plan.inline and bool(block.any())
        exc.marginal = both[:R]                                          # product dtype
        if ratio:
            exc.floors += [self._weight_floor(exc.priors), self._weight_floor(plan.q_default, plan.live)]
        late = np.zeros_like(block) if plan.inline else block.copy()   # block letters written after the log
        if fold:
            late[late] = ~self._fold_block_letters(both[R:2 * R], exc, plan.base, rows[late], k[late])
        if ratio:  # the quotient in the product dtype (bfloat16: ≤ 0.4 % relative), log in float32
            if out is None:
                out = torch.empty(R, both.shape[1], device=exc.priors.device)
            torch.div(both[R:2 * R], exc.marginal, out=out).log_()
            log_marginal = None
        else:
            log_marginal = torch.log(exc.marginal.float())
            out = torch.log(both[R:2 * R].float())
        if not plan.shifted:
            out.add_(plan.base.float()[:, None])
        if plan.inline:
            self._inline_block_values(out, exc, both[2 * R:], plan.block_terms, rows[block], k[block])
        self._block_letter_values(out, exc, rows[late], k[late])
        self._token_values(out, exc, rows[~block], k[~block])
        self._eos_values(out, exc, states, plan.remaining, log_marginal)
        if ratio:
            return out, bool(torch.cat(exc.floors).min() >= UNDERFLOW_BOUND)
        return out, log_marginal

    def _fold_block_letters(self, joint: torch.Tensor, exc: "_RowExceptions", base: torch.Tensor,
                            rows: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Block-letter joints at their rows' scale ``base``: per distinct letter a,
        (p ⊙ Ŵ(t) · e^{c(t) − base}) · B[:, a] written into ``joint`` (the default joint rows,
        product dtype) at the letter's columns. Returns which exceptions were folded: those
        whose scaled weights stay within [``UNDERFLOW_BOUND``, e^{FOLD_MAX_GAIN}] (infeasible
        successors, with exact zeros, always are)."""
        rows_t, q, log_scale = self._successor_weights(exc, rows, k)
        gap = log_scale - base[rows_t]
        live = torch.isfinite(gap)
        q = q * torch.exp(gap).float()[:, None]
        floor = self._weight_floor(q, live)
        ok = (floor >= UNDERFLOW_BOUND) & (~live | (gap <= FOLD_MAX_GAIN))
        folded = ok.cpu().numpy()
        letters = self.exc.tok[k]
        for a, idx_t, tok in self._letter_groups(letters, np.flatnonzero(folded), q.device):
            vals = self._letter_products[a](q[idx_t])                        # [n_a, |a|]
            _write_rows(joint, rows_t[idx_t], tok, vals)
        return folded

    def _letter_groups(self, letters: np.ndarray, subset: np.ndarray, device):
        """(letter a, positions in ``subset`` with that letter as a tensor, a's member tokens)
        per distinct letter, in increasing letter order (stable within a letter)."""
        order = subset[np.argsort(letters[subset], kind="stable")]
        cuts = np.flatnonzero(np.diff(letters[order])) + 1
        for idx in np.split(order, cuts) if len(order) else []:
            a = int(letters[idx[0]])
            yield a, torch.as_tensor(idx, device=device), \
                self._members_t[self.members_ptr[a]:self.members_ptr[a + 1]]

    def _weight_floor(self, q: torch.Tensor, live: torch.Tensor | None = None) -> torch.Tensor:
        """A lower bound on every q · B[:, v] per row (q [n, h] ≥ 0; rows without ``live`` get
        +inf: their zeros are exact), in the product precision: max_z q_z · min_v B[z, v], in
        O(n·h) instead of an O(n·V) pass over the result. When every bound is ≥
        ``UNDERFLOW_BOUND``, every feasible token's weight is a positive normal float and the
        ratio needs no per-entry check."""
        floor = (q * self._emission_min).amax(1)
        return floor if live is None else floor.masked_fill(~live, math.inf)

    def _inline_block_values(self, out, exc: "_RowExceptions", products: torch.Tensor,
                             terms, rows: np.ndarray, k: np.ndarray) -> None:
        """Block-letter exceptions (rows ``rows``) whose q · B rows were computed with the dense
        product (few: at most ``INLINE_ROWS``), one contiguous run of letter members each."""
        _, _, scale = terms
        ptr = self.members_ptr
        for i, a in enumerate(self.exc.tok[k].tolist()):
            tok = self._members_t[ptr[a]:ptr[a + 1]]
            r = int(rows[i])   # from the host array: no device read per exception
            vals = products[i].index_select(0, tok).float()
            if exc.ratio:
                vals.div_(exc.marginal[r].index_select(0, tok))
            out[r].index_copy_(0, tok, vals.log_().add_(scale[i]))

    def _successor_weights(self, exc: "_RowExceptions", rows: np.ndarray, k: np.ndarray):
        """(rows tensor, q = p ⊙ Ŵ_{r-1}(t) [P, h], log scale c_{r-1}(t) [P], float64) per
        exception k of row ``rows``, t its successor state."""
        dev = exc.priors.device
        rows_t = torch.as_tensor(rows, device=dev)
        dst = self._exc_dst_t[torch.as_tensor(k, device=dev)]
        steps = exc.rr[rows_t]
        return rows_t, exc.priors[rows_t] * self.w_hat[steps, dst], self.log_scale[steps, dst]

    def _successor_terms(self, exc: "_RowExceptions", rows: np.ndarray, k: np.ndarray):
        """(rows tensor, q = p ⊙ Ŵ_{r-1}(t) [P, h], log scale c_{r-1}(t) − the row's shift [P])
        per exception, recording the q's underflow floors for the ratio."""
        rows_t, q, scale = self._successor_weights(exc, rows, k)
        if exc.ratio:
            exc.floors.append(self._weight_floor(q, torch.isfinite(scale)))
        return rows_t, q, (scale - exc.shift[rows_t]).float()

    def _block_letter_values(self, out, exc: "_RowExceptions", rows: np.ndarray, k: np.ndarray) -> None:
        """Exceptions over letters of ≥ BLOCK_LETTER tokens: per distinct letter a, the rows'
        q · B[:, tokens of a] as one small product over a contiguous block of B's columns."""
        if not len(rows):
            return
        rows_t, q, scale = self._successor_terms(exc, rows, k)
        letters = self.exc.tok[k]
        for a, idx_t, tok in self._letter_groups(letters, np.arange(len(letters)), q.device):
            vals = self._letter_products[a](q[idx_t])                        # [n_a, |a|]
            r = rows_t[idx_t]
            if exc.ratio:   # column gather first: index_select along dim 1 is one fast pass
                vals.div_(exc.marginal.index_select(1, tok)[r])
            _write_rows(out, r, tok, vals.float().log_().add_(scale[idx_t][:, None]))

    def _token_values(self, out, exc: "_RowExceptions", rows: np.ndarray, k: np.ndarray) -> None:
        """Exceptions over single tokens or small letters: p · (B[:, v] ⊙ Ŵ(t)) token by token."""
        if not len(rows):
            return
        _, q, scale = self._successor_terms(exc, rows, k)
        letters = self.exc.tok[k]
        starts = self.members_ptr[letters]
        sizes = self.members_ptr[letters + 1] - starts
        tokens = self.members[ragged_indices(starts, sizes)]
        at = np.repeat(np.arange(len(k)), sizes)                 # exception of each token
        trows = rows[at]
        dev = q.device
        pos = torch.as_tensor(at, device=dev)
        rows_t, tok_t = torch.as_tensor(trows, device=dev), torch.as_tensor(tokens, device=dev)
        val = (q[pos] * self._emission_t[tok_t]).sum(-1)
        if exc.ratio:
            val = val / exc.marginal[rows_t, tok_t]
        out[rows_t, tok_t] = torch.log(val) + scale[pos]

    def _eos_values(self, out, exc: "_RowExceptions", states, remaining, log_marginal) -> None:
        """EOS columns: terminal (or "the suffix follows" with insertion), overriding the rest."""
        if not self.eos_ids:
            return
        dev, R = exc.priors.device, len(states)
        allowed_rows = torch.as_tensor([self.eos_allowed(r) for r in remaining], device=dev)
        suffix_value = (torch.log(exc.priors @ self._suffix_hat) + self._suffix_log) \
            if self.suffix_ids else None
        for j, e in enumerate(self.eos_ids):
            allowed = allowed_rows & torch.as_tensor(self.eos_accept[states, j], device=dev)
            if suffix_value is not None:
                value = suffix_value - (torch.log(exc.marginal[:, e].float()) if exc.ratio else 0.0)
            else:
                value = torch.zeros(R, device=dev) if exc.ratio else log_marginal[:, e]
            out[:, e] = torch.where(allowed, value - exc.shift.float(), -math.inf)

    def log_ratio(self, states, priors: torch.Tensor | None, remaining, *,
                  shifted: bool = False) -> torch.Tensor:
        """Ctrl-G's guidance term log p_hmm(α | x≤t, v) = log P(v, α | x≤t) − log P(v | x≤t),
        float32 [R, V]: −inf exactly on infeasible tokens; feasible tokens whose weight underflowed
        get the row's smallest finite log-ratio minus ``RATIO_FLOOR_GAP``. In logical mode
        (no HMM, or ``priors=None``) it is 0 on feasible tokens. ``shifted=True`` allows each
        row to be off by a constant (what a row-wise softmax removes; one pass less)."""
        if self.hmm is None or priors is None:
            return super().log_ratio(states, priors, remaining)
        ratio, safe = self._weights(states, priors, remaining, ratio=True, shifted=shifted)
        return self._exact_ratio(ratio, safe, states, remaining)

    def _exact_ratio(self, ratio: torch.Tensor, safe: bool, states, remaining) -> torch.Tensor:
        """The ratio of :meth:`_weights` with −inf exactly on the infeasible tokens and a floor
        on the feasible ones whose weight underflowed (:meth:`log_ratio`)."""
        if safe:  # no feasible weight can have underflowed: −inf exactly on infeasible tokens
            return ratio
        finite = torch.isfinite(ratio)
        # A finite ratio implies a feasible token (infeasible successors have W = 0 exactly), so
        # when each row has as many finite entries as feasible tokens, the two sets coincide.
        expected = torch.as_tensor(self.feasible_counts(states, remaining), device=finite.device)
        if torch.equal(finite.sum(1), expected):
            return ratio.masked_fill_(~finite, -math.inf)
        mask = self.token_feasible(states, remaining)
        lost = mask & ~finite
        if bool(lost.any()):  # underflow on a feasible token: floor it (rare)
            good = finite & mask
            lowest = torch.where(good, ratio, math.inf).amin(1, keepdim=True)
            floor = torch.where(torch.isfinite(lowest), lowest - RATIO_FLOOR_GAP, 0.0)
            ratio = torch.where(lost, floor, ratio)
        return ratio.masked_fill_(~mask, -math.inf)


def log_ratios(queries, *, shifted: bool = False, marginals: list | None = None,
               out: torch.Tensor | None = None) -> list[torch.Tensor]:
    """:meth:`TokenWeights.log_ratio` of several queries ``(tables, states, priors, remaining)``,
    equal to asking each table alone, with one dense product per HMM: the left operands of
    the queries whose tables share the HMM's packed emission
    (:mod:`ctrlg.guide.emission_operands`) are stacked and multiplied by B together. The product
    reads all h·V entries of B whatever the number of rows, so with few rows per table (a batch
    of items at a few beams each) it is memory-bound, and one product per table read B once per
    item and step.

    With a list ``marginals``, it receives per query the product's P(v | x≤t) = p B [R, V] (in
    the product dtype; None for logical queries), which the lookahead's log p_hmm(α | x≤t) needs
    (:func:`ctrlg.guide.guidance.lookahead_scores`) and would otherwise compute again. With
    ``out`` (float32 [Σ rows, V]) the results are its consecutive row blocks, in query order (no
    per-query buffers to concatenate afterwards)."""
    results: list = [None] * len(queries)
    if marginals is not None:
        marginals[:] = [None] * len(queries)
    starts = np.cumsum([0] + [len(q[1]) for q in queries])
    block = (lambda i: out[starts[i]:starts[i + 1]]) if out is not None else (lambda i: None)
    groups: dict[int, list] = {}
    for i, (tables, states, priors, remaining) in enumerate(queries):
        if getattr(tables, "hmm", None) is None or priors is None:
            results[i] = _into(block(i), tables.log_ratio(states, priors, remaining, shifted=shifted))
            continue
        plan = tables._dense_plan(states, priors, remaining, True, shifted)
        groups.setdefault(id(tables._emission_product), []).append((i, tables, plan, states, remaining))
    for members in groups.values():
        product = members[0][1]._emission_product
        both = product(torch.cat([m[2].operand for m in members])) if len(members) > 1 \
            else product(members[0][2].operand)
        start = 0
        for i, tables, plan, states, remaining in members:
            rows = plan.operand.shape[0]
            ratio, safe = tables._from_dense(plan, both[start:start + rows], block(i))
            results[i] = _into(block(i), tables._exact_ratio(ratio, safe, states, remaining))
            if marginals is not None:
                marginals[i] = both[start:start + len(states)]
            start += rows
    return results


def _into(buffer: torch.Tensor | None, values: torch.Tensor) -> torch.Tensor:
    """``values``, copied into ``buffer`` unless it is None or already holds them."""
    if buffer is None or values.data_ptr() == buffer.data_ptr():
        return values if buffer is None else buffer
    return buffer.copy_(values)


@dataclass
class _DensePlan:
    """What :meth:`TokenWeights._dense_plan` hands to :meth:`TokenWeights._from_dense`."""

    states: np.ndarray
    remaining: np.ndarray
    exc: "_RowExceptions"
    rows: np.ndarray            # the rows' exceptions: row of each
    k: np.ndarray               # ... and its index into the DFA's exception list
    block: np.ndarray           # bool per exception: a block letter
    inline: bool                # block letters ride along as extra rows of the dense product
    live: torch.Tensor          # [R] rows whose default successor can still accept
    base: torch.Tensor          # [R] float64, each row's scale
    q_default: torch.Tensor     # [R, h]
    block_terms: tuple | None   # (rows, q, scale) of the inline block letters
    operand: torch.Tensor       # [2R (+ inline), h], the product's left operand
    shifted: bool


@dataclass
class _RowExceptions:
    """What the exception passes of :meth:`GuideTables._weights` share."""

    priors: torch.Tensor        # [R, h]
    marginal: torch.Tensor | None   # [R, V], P(v | x≤t) (set once the dense product is done)
    rr: torch.Tensor            # [R], remaining − 1
    ratio: bool
    shift: torch.Tensor         # [R] float64, subtracted from every value of the row
    floors: list = field(default_factory=list)   # per-row weight floors (ratio mode)


def _write_rows(dst: torch.Tensor, rows: torch.Tensor, tok: torch.Tensor, vals: torch.Tensor) -> None:
    """dst[rows[i], tok] = vals[i]: one column copy when ``rows`` is every row of ``dst`` in
    order, else a scatter."""
    if len(rows) == dst.shape[0] and bool((rows == torch.arange(len(rows), device=rows.device)).all()):
        dst.index_copy_(1, tok, vals)                                        # every row, in order
    else:
        dst[rows[:, None], tok[None, :]] = vals
