"""DFA × HMM guidance tables for Ctrl-G (Zhang et al. 2024, §3): p_hmm(α | x≤t, v) for every v.

Notation. The HMM (``ctrlg.hmm.model``) has initial π [h], transition A [h, h], emission B [h, V];
it sees only the *generated* tokens (never the prompt), so the hidden state of generated token 1
is drawn from π. The budget is ``n = max_new_tokens``; a generation is a token sequence y that ends at
an EOS token (inclusive) or after n tokens, and it is *accepted* iff the DFA accepts y. EOS is
terminal: emitting EOS from DFA state s is worth ``[δ(s, EOS) accepting]`` whatever the HMM would
do next, and EOS is only allowed once ``min_new_tokens`` tokens have been generated.

Backward tables. W_r(s, z) = P_hmm(accepted | DFA state s, r tokens left, z = hidden state of the
token just emitted; the next token is drawn z' ~ A[z], v ~ B[z']). W_0(s, ·) = [s accepting], and

    g_s(z')  = M_s(z') · W_{r-1}(default(s), z')                      (all non-exception tokens)
             + Σ_{v ∈ exc(s)} B[z', v] · W_{r-1}(δ(s, v), z')          (sparse exceptions)
             + [EOS allowed] · Σ_{e ∈ EOS} B[z', e] · [δ(s, e) accepting] (terminal EOS)
    W_r(s)   = A · g_s                      i.e. for all states at once  W_r = G · Aᵀ  ((S×h)·(h×h))

with M_s(z') = Σ_{v ∉ exc(s) ∪ EOS} B[z', v] = rowsum(B)[z'] − Σ_{v ∈ exc(s) ∪ EOS} B[z', v]
(computed in float64 and clamped at 0). This is DESIGN.md's identity with the default's share
written as a non-negative mass, so no term cancels. One step costs O(S·h² + E·h).

Scaling. Each row is stored as W_r(s, ·) = exp(c_r(s)) · Ŵ_r(s, ·) with max_z Ŵ_r(s, z) = 1 and
c_r(s) in float64. A step rescales every term of g_s to the common scale m_s = max of the scales
of the states it mixes, so probabilities like 1e-3000 (n ≤ 1024, V ~ 5e4) never underflow.

Exact feasibility. F_r(s) = "some token sequence of ≤ r tokens from s is accepted", computed from
the DFA alone (:mod:`ctrlg.feasibility`, the base class of :class:`GuideTables`). Tokens into states
with ¬F_{r-1} get probability exactly 0; feasible tokens whose float weight underflowed get a floor
(``ratio_floor``) instead, so the guarantee never depends on rounding.

Per generated token (row in DFA state s, prior p over the hidden state of the token being
generated, r tokens left including this one):

    P(v | x≤t)    = (p B)[v]
    P(v, α | x≤t) = ((p ⊙ W_{r-1}(default(s))) B)[v]           for non-exception v
                  = p · (B[:, v] ⊙ W_{r-1}(δ(s, v)))           for v ∈ exc(s)
                  = P(e | x≤t) · [EOS allowed ∧ δ(s, e) accepting]  for v = e ∈ EOS

costing O(h·V + h·|exc(s)|) — independent of S and t. After choosing v the forward message is
updated: q ∝ p ⊙ B[:, v], p_next = q A (O(h²)).

Insertion (Ctrl-G §5). With a suffix σ (token ids), the HMM must emit σ right after the generated
middle y, and α = "the DFA accepts y" ∧ "σ follows": W_0(s, z) = [s accepting] · P_hmm(σ | z),
where P_hmm(σ | z) = Σ_{z'} A[z, z'] S(z') and S(z') = P_hmm(σ | hidden state of σ_1 is z').
EOS then means "the middle ends here and σ takes its place": its term in g_s is
[∃ e: δ(s, e) accepting] · S(z'), and P(e, α | x≤t) = [δ(s, e) accepting] · (p · S).
So W_n sums p_hmm(y σ) over every accepted middle y (of every admissible length).

Letters (token classes, ``TokenDFA.letter_of_token``). Exceptions may be stored per letter a (a
set of tokens that behave alike). The recurrence then uses B̄[:, a] = Σ_{v ∈ a, v ∉ EOS} B[:, v], so
a step costs O(S·h² + E_letters·h).

Per token, for a batch of R rows: one [2R, h]·[h, V] product (B packed once for oneDNN,
:class:`ctrlg.kernels.packed_linear.PackedLinear`) gives P(v | x≤t) and the default successor's
joint for every v. Exceptional letters with ≥ ``BLOCK_LETTER`` tokens get one
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

Logical mode (``hmm=None``, or :class:`ctrlg.feasibility.Feasibility` alone): only F is built;
guidance is 0 on feasible tokens and −inf on the others (what Outlines / guidance do).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ctrlg.dfa.core import TokenDFA, ragged_indices
from ctrlg.errors import ConstraintError, VocabularyMismatchError
from ctrlg.feasibility import Feasibility, as_token_list, renamed_budget
from ctrlg.kernels.packed_linear import PackedLinear, native_bfloat16
from ctrlg.kernels.reference import backward_step_reference

__all__ = [
    "GuideTables",
    "build_tables",
    "backward_step_reference",
    "forward_update",
    "RATIO_FLOOR_GAP",
    "resolve_precision",
]

#: A feasible token whose float weight underflowed gets a log-ratio this much below the smallest
#: finite log-ratio of its row (or 0 when none is finite), so it stays possible but negligible.
RATIO_FLOOR_GAP = 50.0
#: Exceptional letters with at least this many tokens are evaluated as one matrix product per
#: letter over a contiguous block of B's columns (grouped by letter); smaller ones token by token.
BLOCK_LETTER = 64
#: Up to this many rows in the dense product (2 per query row + 1 per block-letter exception),
#: block letters ride along as extra rows (B is read once: what matters at small batch, where the
#: product is memory-bound); beyond it, each block letter gets its own small product.
INLINE_ROWS = 16
#: ``precision`` of the per-token products p·B: "float32", or "bfloat16" inputs with float32
#: accumulation (the output rounded to bfloat16: relative error ≤ ~1% on P(v | x≤t) and
#: P(v, α | x≤t); feasibility stays exact), about 2× faster on CPUs with AVX512-BF16/AMX.
#: "auto" (:func:`resolve_precision`) picks bfloat16 where the hardware computes it natively.
PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: A product q · B[:, v] bounded below by this (see ``GuideTables._weight_floor``) is a normal
#: positive float in float32 and bfloat16 whatever the rounding, so it cannot have underflowed.
UNDERFLOW_BOUND = 1e-30
#: Block-letter joints are folded into the default's scale only while the factor e^{c(t) − c}
#: stays below e^this (so q · B ≤ e^this, far from overflow in float32 and bfloat16).
FOLD_MAX_GAIN = 60.0


_CHUNK = 4096


def resolve_precision(precision: str, device: torch.device | str = "cpu") -> str:
    """``precision`` with "auto" resolved: "bfloat16" on a CUDA device that supports it or a CPU
    whose oneDNN has native bfloat16 dot products (AVX512-BF16 / AMX), else "float32"."""
    if precision == "auto":
        device = torch.device(device)
        if device.type == "cuda":
            native = torch.cuda.is_bf16_supported()
        else:
            native = device.type == "cpu" and native_bfloat16()
        return "bfloat16" if native else "float32"
    if precision not in PRECISIONS:
        raise ConstraintError(f"precision must be one of {tuple(PRECISIONS) + ('auto',)}, got {precision!r}")
    return precision


def forward_update(priors: torch.Tensor, tokens: torch.Tensor, transition: torch.Tensor,
                   emission_t: torch.Tensor) -> torch.Tensor:
    """Filtering step: q ∝ p ⊙ B[:, v]; returns p_next = q A ([R, h]). ``emission_t`` is Bᵀ
    [V, h] (rows are contiguous). Rows where the HMM gives the chosen token probability 0 keep
    p A (the HMM cannot explain the token; we move on)."""
    q = priors * emission_t[tokens]
    norm = q.sum(-1, keepdim=True)
    q = torch.where(norm > 0, q / norm.clamp_min(torch.finfo(q.dtype).tiny), priors)
    out = q @ transition
    return out / out.sum(-1, keepdim=True).clamp_min(torch.finfo(out.dtype).tiny)


class GuideTables(Feasibility):
    """Backward tables W_r (r = 0..n) for one DFA and one HMM, on top of the exact feasibility F_r
    (:class:`ctrlg.feasibility.Feasibility`, which is all logical mode needs).

    Build with :func:`build_tables`. Rows of a batch that share a DFA share one ``GuideTables``.
    Tensors live on the HMM's device (CUDA works; the recurrence then uses the Triton kernel).

    Attributes:
        feasible: bool numpy [n + 1, S], F_r(s).
        w_hat: float32 [n + 1, S, h], Ŵ_r (``None`` in logical mode).
        log_scale: float64 [n + 1, S], c_r (−inf where W_r(s) = 0).
    """

    def __init__(self, dfa: TokenDFA, hmm=None, max_new_tokens: int = 32, *, min_new_tokens: int = 0,
                 eos_token_id: int | Sequence[int] | None = None,
                 suffix_ids: Sequence[int] | None = None, use_kernel: bool | None = None,
                 progress: bool | None = None, precision: str = "float32", **old_names):
        max_new_tokens, min_new_tokens = renamed_budget(max_new_tokens, min_new_tokens, old_names)
        super().__init__(dfa, max_new_tokens, min_new_tokens=min_new_tokens, eos_token_id=eos_token_id)
        if hmm is not None and hmm.vocab_size != dfa.vocab_size:
            raise VocabularyMismatchError(
                f"the DFA has vocabulary size {dfa.vocab_size} but the HMM has {hmm.vocab_size}")
        self.hmm = hmm
        if hmm is not None:
            self.device = hmm.emission.device
        self.suffix_ids = as_token_list(suffix_ids, "suffix_ids", dfa.vocab_size)
        if suffix_ids is not None and not self.suffix_ids:
            raise ConstraintError("suffix_ids must be a non-empty token sequence (or None)")
        if self.suffix_ids and hmm is None:
            raise ConstraintError("an insertion suffix needs an HMM (it is not a DFA constraint)")
        self.precision = resolve_precision(precision, self.device if hmm is not None else "cpu")
        self.w_hat = self.log_scale = None
        if hmm is not None:
            self._build_tables(use_kernel, progress)

    # ------------------------------------------------------------------ backward tables
    def _build_tables(self, use_kernel: bool | None, progress: bool | None) -> None:
        """Ŵ_r and c_r for r = 0..n (module docstring): operands, W_0, then n recurrence steps."""
        A, B = self.hmm.transition.float(), self.hmm.emission.float()
        self._transition = A
        self._prepare_products(B)
        self._prepare_recurrence(A, B)
        device, n, S = B.device, self.max_new_tokens, self.dfa.num_states
        w_hat = torch.zeros(n + 1, S, self.hmm.hidden_size, device=device)
        log_scale = torch.full((n + 1, S), -math.inf, dtype=torch.float64, device=device)
        acc = torch.tensor(self.dfa.accepting, device=device)
        if self.suffix_ids:  # W_0(s) = [acc] · A S
            w0 = A @ (self._suffix_hat)
            mx = w0.max()
            w_hat[0, acc] = w0 / mx
            log_scale[0, acc] = self._suffix_log + math.log(float(mx))
        else:
            w_hat[0, acc] = 1.0
            log_scale[0, acc] = 0.0
        if use_kernel is None:
            use_kernel = device.type == "cuda"
        step = backward_step_reference
        if use_kernel:
            from ctrlg.kernels.backward_table import backward_step  # imports triton (heavy, optional)
            step = backward_step
        bar = tqdm(range(1, n + 1), desc="guide tables", leave=False,
                   disable=None if progress is None else not progress)
        for r in bar:
            w_hat[r], log_scale[r] = self._recurrence_step(step, r, w_hat[r - 1], log_scale[r - 1], A)
        self.w_hat, self.log_scale = w_hat, log_scale

    def _prepare_products(self, B: torch.Tensor) -> None:
        """Layouts of B for the per-token queries. Bᵀ [V, h]: per-token columns are contiguous rows
        (gathers; p B = linear(p, Bᵀ) gives a contiguous [R, V]); a copy in the product
        precision; and one with its rows grouped by letter (letters evaluated as blocks)."""
        self._emission_t = B.T.contiguous()
        emission = self._emission_t.to(PRECISIONS[self.precision])
        self._emission_min = emission.float().amin(0)                   # min_v B[z, v], [h]
        self._emission_product = PackedLinear(emission)
        self.block_letter = np.diff(self.members_ptr) >= BLOCK_LETTER
        self._members_t = torch.as_tensor(self.members, device=B.device)
        self._letter_products = {}      # block letter a → p · B[:, members of a], packed
        for a in np.unique(self.exc.tok[self.block_letter[self.exc.tok]]).tolist():
            tokens = self._members_t[self.members_ptr[a]:self.members_ptr[a + 1]]
            self._letter_products[a] = PackedLinear(emission[tokens].contiguous())

    def _prepare_recurrence(self, A: torch.Tensor, B: torch.Tensor) -> None:
        """The recurrence's fixed operands: DFA arrays, per-letter emission rows B̄, the
        non-exception mass M_s, the EOS terminal term and its log scale."""
        dfa, exc, h, S = self.dfa, self.exc, self.hmm.hidden_size, self.dfa.num_states
        device = B.device
        tensor = lambda a: torch.tensor(a, device=device)  # noqa: E731
        self._default_t = tensor(dfa.default)
        self._exc_src_t, self._exc_dst_t = tensor(exc.src), tensor(exc.dst)
        self._exc_tok_t = tensor(exc.tok)
        if dfa.has_letters:  # B̄[:, a] = Σ_{v ∈ a, v ∉ EOS} B[:, v]
            letter_emission = torch.zeros(h, dfa.num_letters, device=device)
            letter_emission.index_add_(1, tensor(dfa.letter_of_token), B)
            for e in self.eos_ids:
                letter_emission[:, int(dfa.letter_of_token[e])] -= B[:, e]
            self._emission_rows = letter_emission.clamp_min_(0).T.contiguous()  # [A, h]
        else:
            self._emission_rows = self._emission_t                              # [V, h]
        # M_s = rowsum(B) - Σ_{exc(s) ∪ EOS} B[:, v], in float64, clamped at 0.
        mass = B.double().sum(1).expand(S, h).clone()
        for lo in range(0, len(exc.src), _CHUNK):
            rows = self._emission_rows[self._exc_tok_t[lo:lo + _CHUNK]]
            mass.index_add_(0, self._exc_src_t[lo:lo + _CHUNK], -rows.double())
        if self.eos_ids:
            mass -= B[:, self.eos_ids].double().sum(1)
        self._nonexc_mass = mass.clamp_min_(0).float()
        # EOS terminal term and its log scale (0 without suffix).
        eos_accept = tensor(self.eos_accept)
        if self.suffix_ids:
            self._suffix_hat, self._suffix_log = self._suffix_first(A, B)
            self._eos_term = eos_accept.any(1).float()[:, None] * self._suffix_hat[None]
            self._eos_log = self._suffix_log
        else:
            self._eos_term = (eos_accept.float() @ B[:, self.eos_ids].T) if self.eos_ids \
                else torch.zeros(S, h, device=device)
            self._eos_log = 0.0
        self._eos_live = tensor(self.eos_accept.any(1) if self.eos_ids else np.zeros(S, bool))
        self._has_default_t = tensor(self.has_default)
        self._feasible_t = tensor(self.feasible)

    def _recurrence_step(self, step, r: int, w_prev: torch.Tensor, c: torch.Tensor,
                         A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Ŵ_r, c_r) from (Ŵ_{r-1}, c_{r-1}): every term of g_s rescaled to the common scale m_s,
        one ``step`` (G · Aᵀ), then rows renormalised to max 1."""
        S, device = len(c), c.device
        c_default = torch.where(self._has_default_t, c[self._default_t], -math.inf)
        m = c_default.clone()
        if len(self.exc.src):
            m.scatter_reduce_(0, self._exc_src_t, c[self._exc_dst_t], reduce="amax")
        eos_ok = self.eos_allowed(r)
        if eos_ok:
            m = torch.where(self._eos_live, torch.clamp_min(m, self._eos_log), m)
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        coef_default = torch.exp(c_default - m_safe).float()
        coef_exc = torch.exp(c[self._exc_dst_t] - m_safe[self._exc_src_t]).float()
        coef_eos = (torch.exp(self._eos_log - m_safe) * self._eos_live).float() if eos_ok \
            else torch.zeros(S, device=device)
        raw = step(w_prev, self._default_t, coef_default, self._nonexc_mass, self._exc_src_t,
                   self._exc_dst_t, self._exc_tok_t, self._emission_rows, coef_exc, self._eos_term,
                   coef_eos, A)
        mx = raw.amax(1)
        ok = (mx > 0) & torch.isfinite(m) & torch.isfinite(mx)
        w = torch.where(ok[:, None], raw / torch.where(ok, mx, 1.0)[:, None], 0.0)
        scale = torch.where(ok, m_safe + torch.log(torch.where(ok, mx, 1.0).double()), -math.inf)
        # Feasible states whose weight underflowed: an (over-)estimate, never exactly 0.
        lost = self._feasible_t[r] & ~ok
        if bool(lost.any()):
            w[lost] = 1.0
            scale[lost] = m_safe[lost] + math.log(torch.finfo(torch.float32).tiny)
        return w, scale

    def _suffix_first(self, A: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, float]:
        """S(z) = P_hmm(σ | hidden state of σ_1 is z), scaled: returns (Ŝ with max 1, log scale)."""
        log_scale = 0.0
        b = B[:, self.suffix_ids[-1]].clone()
        for tok in reversed(self.suffix_ids[:-1]):
            b = B[:, tok] * (A @ b)
            mx = float(b.max())
            if mx <= 0:
                break
            b, log_scale = b / mx, log_scale + math.log(mx)
        mx = float(b.max())
        if mx <= 0:
            return torch.zeros_like(b), -math.inf
        return b / mx, log_scale + math.log(mx)

    # ------------------------------------------------------------------ per-token queries
    def initial_prior(self, num_rows: int = 1) -> torch.Tensor:
        """The prior over the hidden state of generated token 1: π, repeated ``num_rows`` times."""
        return self.hmm.initial.float().expand(num_rows, -1).clone()

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

        One [2R, h]·[h, V] product gives P(v | x≤t) and the default-successor joint for every v;
        exception tokens are then overwritten: tokens of block letters by one
        [rows, h]·[h, |letter|] product per distinct letter (or, for few rows, by extra rows of
        the dense product), the others token by token, EOS last.

        Folding (ratio mode, per-letter block products): a row's block-letter joints are brought
        to the default's scale c_default by scaling their q vectors by e^{c(t) − c_default}
        (O(h) per exception) and written into the joint rows *before* the quotient and log,
        so those run once over [R, V]. Exceptions whose scaled weights could underflow (or
        overflow) keep their own scale and are written after the log instead."""
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
        fold = ratio and not inline and bool(block.any())
        live = torch.isfinite(c_default)
        base = torch.where(live, c_default, 0.0)  # each row's values are relative to this scale
        exc = _RowExceptions(priors, None, rr, ratio, base if shifted else torch.zeros_like(base))
        q_default = priors * self.w_hat[rr, d] * live.float()[:, None]
        stacked = [priors, q_default]
        if inline:  # few rows: B is read once, block letters as extra rows of the same product
            block_terms = self._successor_terms(exc, rows[block], k[block])
            stacked.append(block_terms[1])
        both = self._emission_product(torch.cat(stacked))                # one pass over B
        exc.marginal = both[:R]                                          # product dtype
        if ratio:
            exc.floors += [self._weight_floor(priors), self._weight_floor(q_default, live)]
        late = np.zeros_like(block) if inline else block.copy()   # block letters written after the log
        if fold:
            late[late] = ~self._fold_block_letters(both[R:2 * R], exc, base, rows[late], k[late])
        if ratio:  # the quotient in the product dtype (bfloat16: ≤ 0.4 % relative), log in float32
            out = torch.empty(R, both.shape[1], device=dev)
            torch.div(both[R:2 * R], exc.marginal, out=out).log_()
            log_marginal = None
        else:
            log_marginal = torch.log(exc.marginal.float())
            out = torch.log(both[R:2 * R].float())
        if not shifted:
            out.add_(base.float()[:, None])
        if inline:
            self._inline_block_values(out, exc, both[2 * R:], block_terms, k[block])
        self._block_letter_values(out, exc, rows[late], k[late])
        self._token_values(out, exc, rows[~block], k[~block])
        self._eos_values(out, exc, states, remaining, log_marginal)
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
        dev = exc.priors.device
        rows_t = torch.as_tensor(rows, device=dev)
        dst = self._exc_dst_t[torch.as_tensor(k, device=dev)]
        steps = exc.rr[rows_t]
        gap = self.log_scale[steps, dst] - base[rows_t]
        live = torch.isfinite(gap)
        q = exc.priors[rows_t] * self.w_hat[steps, dst] * torch.exp(gap).float()[:, None]
        floor = self._weight_floor(q, live)
        ok = (floor >= UNDERFLOW_BOUND) & (~live | (gap <= FOLD_MAX_GAIN))
        folded = ok.cpu().numpy()
        letters = self.exc.tok[k]
        order = np.flatnonzero(folded)
        order = order[np.argsort(letters[order], kind="stable")]
        cuts = np.flatnonzero(np.diff(letters[order])) + 1
        for idx in np.split(order, cuts) if len(order) else []:
            a = int(letters[idx[0]])
            idx_t = torch.as_tensor(idx, device=dev)
            vals = self._letter_products[a](q[idx_t])                        # [n_a, |a|]
            tok = self._members_t[self.members_ptr[a]:self.members_ptr[a + 1]]
            r = rows_t[idx_t]
            if len(idx) == joint.shape[0] and bool((r == torch.arange(len(r), device=dev)).all()):
                joint.index_copy_(1, tok, vals)                            # every row, in order
            else:
                joint[r[:, None], tok[None, :]] = vals
        return folded

    def _weight_floor(self, q: torch.Tensor, live: torch.Tensor | None = None) -> torch.Tensor:
        """A lower bound on every q · B[:, v] per row (q [n, h] ≥ 0; rows without ``live`` get
        +inf: their zeros are exact), in the product precision: max_z q_z · min_v B[z, v], in
        O(n·h) instead of an O(n·V) pass over the result. When every bound is ≥
        ``UNDERFLOW_BOUND``, every feasible token's weight is a positive normal float and the
        ratio needs no per-entry check."""
        floor = (q * self._emission_min).amax(1)
        return floor if live is None else floor.masked_fill(~live, math.inf)

    def _inline_block_values(self, out, exc: "_RowExceptions", products: torch.Tensor,
                             terms, k: np.ndarray) -> None:
        """Block-letter exceptions whose q · B rows were computed with the dense product (few:
        at most ``INLINE_ROWS``), one contiguous run of letter members each."""
        rows_t, _, scale = terms
        ptr = self.members_ptr
        for i, a in enumerate(self.exc.tok[k].tolist()):
            tok = self._members_t[ptr[a]:ptr[a + 1]]
            r = int(rows_t[i])
            vals = products[i].index_select(0, tok).float()
            if exc.ratio:
                vals.div_(exc.marginal[r].index_select(0, tok))
            out[r].index_copy_(0, tok, vals.log_().add_(scale[i]))

    def _successor_terms(self, exc: "_RowExceptions", rows: np.ndarray, k: np.ndarray):
        """(rows tensor, q = p ⊙ Ŵ_{r-1}(t) [P, h], log scale c_{r-1}(t) [P]) per exception."""
        dev = exc.priors.device
        rows_t = torch.as_tensor(rows, device=dev)
        dst = self._exc_dst_t[torch.as_tensor(k, device=dev)]
        steps = exc.rr[rows_t]
        q, scale = exc.priors[rows_t] * self.w_hat[steps, dst], self.log_scale[steps, dst]
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
        order = np.argsort(letters, kind="stable")
        cuts = np.flatnonzero(np.diff(letters[order])) + 1
        for idx in np.split(order, cuts):
            a = int(letters[idx[0]])
            lo, hi = int(self.members_ptr[a]), int(self.members_ptr[a + 1])
            idx_t = torch.as_tensor(idx, device=q.device)
            vals = self._letter_products[a](q[idx_t])                        # [n_a, |a|]
            tok = self._members_t[lo:hi]
            r = rows_t[idx_t]
            if exc.ratio:   # column gather first: index_select along dim 1 is one fast pass
                vals.div_(exc.marginal.index_select(1, tok)[r])
            vals = vals.float().log_().add_(scale[idx_t][:, None])
            if len(idx) == out.shape[0] and bool((r == torch.arange(len(r), device=r.device)).all()):
                out.index_copy_(1, tok, vals)                              # every row, in order
            else:
                out[r[:, None], tok[None, :]] = vals

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

    def log_prob_accept(self, state: int | None = None, prior: torch.Tensor | None = None,
                        remaining: int | None = None) -> float:
        """log P_hmm(α) from a DFA state and prior (defaults: the start of generation)."""
        s = self.dfa.initial if state is None else int(state)
        p = self.initial_prior() if prior is None else prior.reshape(1, -1)
        r = self.max_new_tokens if remaining is None else int(remaining)
        if not self.feasible[r, s]:
            return -math.inf
        log_joint, _ = self.token_weights([s], p, r)
        return float(torch.logsumexp(log_joint.double(), dim=1))

    def advance(self, priors: torch.Tensor, tokens) -> torch.Tensor:
        """Forward messages after emitting ``tokens`` [R]: see :func:`forward_update`."""
        tokens = torch.as_tensor(tokens, device=priors.device).reshape(-1)
        return forward_update(priors, tokens, self._transition, self._emission_t)


@dataclass
class _RowExceptions:
    """What the exception passes of :meth:`GuideTables._weights` share."""

    priors: torch.Tensor        # [R, h]
    marginal: torch.Tensor | None   # [R, V], P(v | x≤t) (set once the dense product is done)
    rr: torch.Tensor            # [R], remaining − 1
    ratio: bool
    shift: torch.Tensor         # [R] float64, subtracted from every value of the row
    floors: list = field(default_factory=list)   # per-row weight floors (ratio mode)


def build_tables(hmm, dfa: TokenDFA, max_new_tokens: int, **kwargs) -> GuideTables:
    """Backward tables for ``dfa`` under ``hmm`` with budget ``max_new_tokens`` (see GuideTables).
    ``hmm=None`` gives logical-only tables (feasibility only)."""
    return GuideTables(dfa, hmm, max_new_tokens, **kwargs)
