"""DFA × HMM guidance tables for Ctrl-G (Zhang et al. 2024, §3): p_hmm(α | x≤t, v) for every v.

Notation. The HMM (``ctrlg.hmm.model``) has initial π [h], transition A [h, h], emission B [h, V];
it sees only the *generated* tokens (never the prompt), so the hidden state of generated token 1
is drawn from π. The budget is ``n = max_tokens``; a generation is a token sequence y that ends at
an EOS token (inclusive) or after n tokens, and it is *accepted* iff the DFA accepts y. EOS is
terminal: emitting EOS from DFA state s is worth ``[δ(s, EOS) accepting]`` whatever the HMM would
do next, and EOS is only allowed once ``min_tokens`` tokens have been generated.

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
a step costs O(S·h² + E_letters·h). Per token, exceptional letters with at most V/16 tokens are
handled token by token (p · (B[:, v] ⊙ W(t))); larger letters are grouped by successor t and get one
extra row (p ⊙ W_{r-1}(t)) in the single [rows, h]·[h, V] product, so a row costs
O(h·V·(2 + #large-letter successors) + h·#small-letter tokens) — B is still read once.

Logical mode (``hmm=None``, or :class:`ctrlg.feasibility.Feasibility` alone): only F is built;
guidance is 0 on feasible tokens and −inf on the others (what Outlines / guidance do).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ctrlg.dfa.core import TokenDFA
from ctrlg.errors import ConstraintError, VocabularyMismatchError
from ctrlg.feasibility import Feasibility, as_token_list
from ctrlg.kernels.reference import backward_step_reference

__all__ = [
    "GuideTables",
    "build_tables",
    "backward_step_reference",
    "forward_update",
    "RATIO_FLOOR_GAP",
]

#: A feasible token whose float weight underflowed gets a log-ratio this much below the smallest
#: finite log-ratio of its row (or 0 when none is finite), so it stays possible but negligible.
RATIO_FLOOR_GAP = 50.0
_CHUNK = 4096


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

    def __init__(self, dfa: TokenDFA, hmm=None, max_tokens: int = 32, *, min_tokens: int = 0,
                 eos_token_id: int | Sequence[int] | None = None,
                 suffix_ids: Sequence[int] | None = None, use_kernel: bool | None = None,
                 progress: bool | None = None):
        super().__init__(dfa, max_tokens, min_tokens=min_tokens, eos_token_id=eos_token_id)
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
        self.w_hat = self.log_scale = None
        if hmm is not None:
            self._build_tables(use_kernel, progress)

    # ------------------------------------------------------------------ backward tables
    def _build_tables(self, use_kernel: bool | None, progress: bool | None) -> None:
        hmm, dfa, exc = self.hmm, self.dfa, self.exc
        device, n, S, h = hmm.emission.device, self.max_tokens, dfa.num_states, hmm.hidden_size
        A, B = hmm.transition.float(), hmm.emission.float()
        self._transition = A
        # Bᵀ [V, h]: per-token columns of B are contiguous rows here; p B = (Bᵀ pᵀ)ᵀ (one pass).
        self._emission_t = B.T.contiguous()
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
        for lo in range(0, len(exc.src), 4096):
            rows = self._emission_rows[self._exc_tok_t[lo:lo + 4096]]
            mass.index_add_(0, self._exc_src_t[lo:lo + 4096], -rows.double())
        if self.eos_ids:
            mass -= B[:, self.eos_ids].double().sum(1)
        self._nonexc_mass = mass.clamp_min_(0).float()
        # EOS terminal term and its log scale (0 without suffix).
        eos_accept = tensor(self.eos_accept)
        if self.suffix_ids:
            s_hat, s_log = self._suffix_first(A, B)
            self._suffix_hat, self._suffix_log = s_hat, s_log
            self._eos_term = eos_accept.any(1).float()[:, None] * s_hat[None]
            eos_log = s_log
        else:
            self._eos_term = (eos_accept.float() @ B[:, self.eos_ids].T) if self.eos_ids \
                else torch.zeros(S, h, device=device)
            eos_log = 0.0
        eos_live = tensor(self.eos_accept.any(1) if self.eos_ids else np.zeros(S, bool))

        w_hat = torch.zeros(n + 1, S, h, device=device)
        log_scale = torch.full((n + 1, S), -math.inf, dtype=torch.float64, device=device)
        acc = tensor(dfa.accepting)
        if self.suffix_ids:  # W_0(s) = [acc] · A S
            w0 = A @ (self._suffix_hat)
            mx = w0.max()
            w_hat[0, acc] = w0 / mx
            log_scale[0, acc] = self._suffix_log + math.log(float(mx))
        else:
            w_hat[0, acc] = 1.0
            log_scale[0, acc] = 0.0

        step = backward_step_reference
        if use_kernel is None:
            use_kernel = device.type == "cuda"
        if use_kernel:
            from ctrlg.kernels.backward_table import backward_step  # imports triton (heavy, optional)
            step = backward_step
        has_default = tensor(self.has_default)
        feasible = tensor(self.feasible)
        tiny_log = math.log(torch.finfo(torch.float32).tiny)
        bar = tqdm(range(1, n + 1), desc="guide tables", leave=False,
                   disable=None if progress is None else not progress)
        for r in bar:
            c = log_scale[r - 1]
            c_default = torch.where(has_default, c[self._default_t], -math.inf)
            m = c_default.clone()
            if len(exc.src):
                m.scatter_reduce_(0, self._exc_src_t, c[self._exc_dst_t], reduce="amax")
            eos_ok = self.eos_allowed(r)
            if eos_ok:
                m = torch.where(eos_live, torch.clamp_min(m, eos_log), m)
            m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            coef_default = torch.exp(c_default - m_safe).float()
            coef_exc = torch.exp(c[self._exc_dst_t] - m_safe[self._exc_src_t]).float()
            coef_eos = (torch.exp(eos_log - m_safe) * eos_live).float() if eos_ok \
                else torch.zeros(S, device=device)
            raw = step(w_hat[r - 1], self._default_t, coef_default, self._nonexc_mass,
                       self._exc_src_t, self._exc_dst_t, self._exc_tok_t, self._emission_rows, coef_exc,
                       self._eos_term, coef_eos, A)
            mx = raw.amax(1)
            ok = (mx > 0) & torch.isfinite(m) & torch.isfinite(mx)
            w_hat[r] = torch.where(ok[:, None], raw / torch.where(ok, mx, 1.0)[:, None], 0.0)
            log_scale[r] = torch.where(ok, m_safe + torch.log(torch.where(ok, mx, 1.0).double()), -math.inf)
            # Feasible states whose weight underflowed: an (over-)estimate, never exactly 0.
            lost = feasible[r] & ~ok
            if bool(lost.any()):
                w_hat[r, lost] = 1.0
                log_scale[r, lost] = m_safe[lost] + tiny_log
        self.w_hat, self.log_scale = w_hat, log_scale

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

    def _weights(self, states, priors: torch.Tensor, remaining, ratio: bool):
        """Shared body of :meth:`token_weights` and :meth:`log_ratio`. With ``ratio`` it returns
        log(P(v, α | x≤t) / P(v | x≤t)) directly (one log per entry instead of two)."""
        if self.hmm is None:
            raise ConstraintError("token weights need an HMM; these tables are logical-only")
        states, remaining = self._check_remaining(states, remaining)
        dev = priors.device
        R = len(states)
        rr = torch.as_tensor(remaining - 1, device=dev)
        d = self._default_t[torch.as_tensor(states, device=dev)]
        w_default = self.w_hat[rr, d]                                    # [R, h]
        c_default = self.log_scale[rr, d]                                # [R] float64
        rows, k = self._row_exceptions(states)
        large = self.large_letter[self.exc.tok[k]]
        # large letters: one extra row p ⊙ Ŵ(t) per distinct (row, successor t)
        lrows, lk = rows[large], k[large]
        pairs, inverse = np.unique(np.stack([lrows, self.exc.dst[lk]]), axis=1, return_inverse=True)
        pairs_t = torch.as_tensor(pairs, device=dev)
        extra = priors[pairs_t[0]] * self.w_hat[rr[pairs_t[0]], pairs_t[1]]
        stacked = torch.cat([priors, priors * w_default, extra])
        both = (self._emission_t @ stacked.T).T                          # one pass over B
        marginal, joint = both[:R], both[R:2 * R]

        def log_of(values, row_idx, tok_idx, scale):
            if ratio:
                values = values / marginal[row_idx, tok_idx]
            return torch.log(values) + scale

        if ratio:
            out = torch.log(joint / marginal) + c_default.float()[:, None]
            log_marginal = None
        else:
            log_marginal = torch.log(marginal)
            out = torch.log(joint) + c_default.float()[:, None]
        out[~torch.isfinite(c_default)] = -math.inf
        if len(lrows):
            trows, tokens, tk = self._expand(lrows, lk)
            pair_of = np.repeat(np.asarray(inverse).reshape(-1), np.diff(self.members_ptr)[self.exc.tok[lk]])
            pair_t = torch.as_tensor(pair_of, device=dev)
            tok_t, rows_t = torch.as_tensor(tokens, device=dev), torch.as_tensor(trows, device=dev)
            vals = both[2 * R + pair_t, tok_t]
            scale = self.log_scale[rr[pairs_t[0][pair_t]], pairs_t[1][pair_t]].float()
            out[rows_t, tok_t] = log_of(vals, rows_t, tok_t, scale)
        srows, sk = rows[~large], k[~large]
        if len(srows):
            trows, tokens, tk = self._expand(srows, sk)
            rows_t, tok_t = torch.as_tensor(trows, device=dev), torch.as_tensor(tokens, device=dev)
            dst = self._exc_dst_t[torch.as_tensor(tk, device=dev)]
            val = (priors[rows_t] * self._emission_t[tok_t] * self.w_hat[rr[rows_t], dst]).sum(-1)
            out[rows_t, tok_t] = log_of(val, rows_t, tok_t, self.log_scale[rr[rows_t], dst].float())
        if self.eos_ids:
            allowed_rows = torch.as_tensor([self.eos_allowed(r) for r in remaining], device=dev)
            suffix_value = (torch.log(priors @ self._suffix_hat) + self._suffix_log) if self.suffix_ids else None
        for j, e in enumerate(self.eos_ids):
            allowed = allowed_rows & torch.as_tensor(self.eos_accept[states, j], device=dev)
            if suffix_value is not None:
                value = suffix_value - (torch.log(marginal[:, e]) if ratio else 0.0)
            else:
                value = torch.zeros(R, device=dev) if ratio else log_marginal[:, e]
            out[:, e] = torch.where(allowed, value, -math.inf)
        return out if ratio else (out, log_marginal)

    def log_ratio(self, states, priors: torch.Tensor | None, remaining) -> torch.Tensor:
        """Ctrl-G's guidance term log p_hmm(α | x≤t, v) = log P(v, α | x≤t) − log P(v | x≤t),
        float32 [R, V]: −inf exactly on infeasible tokens; feasible tokens whose weight underflowed
        get the row's smallest finite log-ratio minus ``RATIO_FLOOR_GAP``. In logical mode
        (no HMM, or ``priors=None``) it is 0 on feasible tokens."""
        mask = self.token_feasible(states, remaining)
        if self.hmm is None or priors is None:
            zero = torch.zeros(mask.shape, device=mask.device)
            return torch.where(mask, zero, -math.inf)
        ratio = self._weights(states, priors, remaining, ratio=True)
        finite = torch.isfinite(ratio)
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
        r = self.max_tokens if remaining is None else int(remaining)
        if not self.feasible[r, s]:
            return -math.inf
        log_joint, _ = self.token_weights([s], p, r)
        return float(torch.logsumexp(log_joint.double(), dim=1))

    def advance(self, priors: torch.Tensor, tokens) -> torch.Tensor:
        """Forward messages after emitting ``tokens`` [R]: see :func:`forward_update`."""
        tokens = torch.as_tensor(tokens, device=priors.device).reshape(-1)
        return forward_update(priors, tokens, self._transition, self._emission_t)


def build_tables(hmm, dfa: TokenDFA, max_tokens: int, **kwargs) -> GuideTables:
    """Backward tables for ``dfa`` under ``hmm`` with budget ``max_tokens`` (see GuideTables).
    ``hmm=None`` gives logical-only tables (feasibility only)."""
    return GuideTables(dfa, hmm, max_tokens, **kwargs)
