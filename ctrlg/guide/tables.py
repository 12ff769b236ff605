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
written as a non-negative mass, so no term cancels. The exceptions of s that lead to the same
successor t are summed once per table, Ē_{s,t} = Σ_{v ∈ exc(s), δ(s,v) = t} B[:, v], so a step
reads P ≤ E (source, successor) pairs (a CommonGen DFA: 3.4× fewer). One step costs
O(S·h² + P·h). On the CPU, G is built by one compiled loop and the scales and row maxima by
another (:mod:`ctrlg.kernels.backward_table_cpu`, the same arithmetic as the torch step); on
CUDA by the torch step, or the Triton kernel with ``use_kernel=True`` (slower on an H200).

Scaling. Each row is stored as W_r(s, ·) = exp(c_r(s)) · Ŵ_r(s, ·) with max_z Ŵ_r(s, z) = 1 and
c_r(s) in float64. A step rescales every term of g_s to the common scale m_s = max of the scales
of the states it mixes, so probabilities like 1e-3000 (n ≤ 1024, V ~ 5e4) never underflow.

Exact feasibility. F_r(s) = "some token sequence of ≤ r tokens from s is accepted", computed from
the DFA alone (:mod:`ctrlg.guide.feasibility`, the base class of :class:`GuideTables`). Tokens into states
with ¬F_{r-1} get probability exactly 0; feasible tokens whose float weight underflowed get a floor
(``ratio_floor``) instead, so the guarantee never depends on rounding.

Per generated token, the guide reads P(v | x≤t), P(v, α | x≤t) and their ratio off these
tables (:mod:`ctrlg.guide.token_weights`, the other half of :class:`GuideTables`): O(h·V + h·|exc(s)|)
per row, independent of S and t. After choosing v the forward message is updated: q ∝ p ⊙ B[:, v],
p_next = q A (O(h²)).

Insertion (Ctrl-G §5). With a suffix σ (token ids), the HMM must emit σ right after the generated
middle y, and α = "the DFA accepts y" ∧ "σ follows": W_0(s, z) = [s accepting] · P_hmm(σ | z),
where P_hmm(σ | z) = Σ_{z'} A[z, z'] S(z') and S(z') = P_hmm(σ | hidden state of σ_1 is z').
EOS then means "the middle ends here and σ takes its place": its term in g_s is
[∃ e: δ(s, e) accepting] · S(z'), and P(e, α | x≤t) = [δ(s, e) accepting] · (p · S).
So W_n sums p_hmm(y σ) over every accepted middle y (of every admissible length).

Letters (token classes, ``TokenDFA.letter_of_token``). Exceptions may be stored per letter a (a
set of tokens that behave alike). The recurrence then uses B̄[:, a] = Σ_{v ∈ a, v ∉ EOS} B[:, v], so
a step costs O(S·h² + E_letters·h). The sums of large letters come from the HMM's shared
:class:`~ctrlg.guide.letter_sums.LargeLetterSums` (a CommonGen item's word-continuing letter is
the previous item's up to a few dozen tokens: a difference instead of a sum over ≈ 16,000
columns).

Reachable band. A generation is in DFA state s with r tokens left only if s can be reached from
the initial state in exactly t = n − r tokens (EOS is terminal, so never on such a path):
R_0 = {initial}, R_{t+1} = δ(R_t, non-EOS tokens). The guide reads W_r(s) only there, and only
where F_r(s) holds; with ``reachable_only`` (the default) the recurrence computes exactly those
rows, B_r = F_r ∧ R_{n−r} (one gather and one [|B_r|, h]·[h, h] product per step), and leaves the
others at 0. The rows it computes are the same numbers as without the band (up to the product's
float rounding), since the successors of a row of B_r lie in R_{n−r+1} and a successor outside
F_{r−1} has W = 0 either way. For
infilling constraints (mostly forced fragments) |B_r| is 15–45 % of S.

Logical mode (``hmm=None``, or :class:`ctrlg.guide.feasibility.Feasibility` alone): only F is built;
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
from ctrlg.guide.feasibility import Feasibility, as_token_list, renamed_budget
from ctrlg.guide.emission_operands import emission_operands
from ctrlg.guide.entry_weights import EntryWeights
from ctrlg.guide.letter_sums import LARGE_LETTER, LargeLetterSums
from ctrlg.kernels.packed_linear import PackedLinear, native_bfloat16
from ctrlg.kernels.backward_table_cpu import compiled, recurrence_step_cpu, shared_products
from ctrlg.kernels.reference import backward_step_reference
from ctrlg.memory import check_tables_fit
from ctrlg.guide.token_weights import RATIO_FLOOR_GAP, TokenWeights

__all__ = [
    "GuideTables",
    "build_tables",
    "backward_step_reference",
    "forward_update",
    "RATIO_FLOOR_GAP",
    "resolve_precision",
]

#: Exceptional letters with at least this many tokens are evaluated as one matrix product per
#: letter over a contiguous block of B's columns (grouped by letter); smaller ones token by token.
BLOCK_LETTER = 64
#: ``precision`` of the guide's matrix products: "float32", or "bfloat16" inputs with float32
#: accumulation (outputs rounded to bfloat16) for the per-token products p·B, the CPU
#: recurrence's G·Aᵀ (:mod:`ctrlg.kernels.backward_table_cpu`; the torch and Triton steps keep
#: float32) and the filter's p·A (:func:`forward_update`): relative error ≤ ~1% on P(v | x≤t)
#: and P(v, α | x≤t) at the budgets of the tests, a few % after tens of recurrence steps;
#: feasibility stays exact. 2-4× faster products on CPUs with AVX512-BF16/AMX. "auto"
#: (:func:`resolve_precision`) picks bfloat16 where the hardware computes it natively.
PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16}


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
    """Filtering step: q ∝ p ⊙ B[:, v]; returns p_next = q A ([R, h], float32). ``emission_t``
    is Bᵀ [V, h] (rows are contiguous); the product q A runs in ``transition``'s dtype (bfloat16:
    the ``precision`` of :data:`PRECISIONS`). Rows where the HMM gives the chosen token
    probability 0 keep p A (the HMM cannot explain the token; we move on)."""
    q = priors * emission_t[tokens]
    norm = q.sum(-1, keepdim=True)
    q = torch.where(norm > 0, q / norm.clamp_min(torch.finfo(q.dtype).tiny), priors)
    out = (q.to(transition.dtype) @ transition).float()
    return out / out.sum(-1, keepdim=True).clamp_min(torch.finfo(out.dtype).tiny)


class GuideTables(TokenWeights, EntryWeights, Feasibility):
    """Backward tables W_r (r = 0..n) for one DFA and one HMM, on top of the exact feasibility F_r
    (:class:`ctrlg.guide.feasibility.Feasibility`, which is all logical mode needs).

    Build with :func:`build_tables`. Rows of a batch that share a DFA share one ``GuideTables``.
    Tensors live on the HMM's device (CUDA works; ``use_kernel=True`` runs the recurrence with
    the Triton kernel).

    Attributes:
        feasible: bool numpy [n + 1, S], F_r(s).
        band: bool numpy [n + 1, S], B_r(s) = F_r(s) ∧ s ∈ R_{n−r} (all of F without
            ``reachable_only``): where W_r(s) is computed.
        w_hat: float32 [n + 1, S, h], Ŵ_r (``None`` in logical mode).
        log_scale: float64 [n + 1, S], c_r (−inf where W_r(s) = 0 or outside the band).
    """

    def __init__(self, dfa: TokenDFA, hmm=None, max_new_tokens: int = 32, *, min_new_tokens: int = 0,
                 eos_token_id: int | Sequence[int] | None = None,
                 suffix_ids: Sequence[int] | None = None, use_kernel: bool | None = None,
                 progress: bool | None = None, precision: str = "float32",
                 reachable_only: bool = True, **old_names):
        max_new_tokens, min_new_tokens = renamed_budget(max_new_tokens, min_new_tokens, old_names)
        super().__init__(dfa, max_new_tokens, min_new_tokens=min_new_tokens, eos_token_id=eos_token_id)
        self.band = self._reachable_band() if reachable_only else self.feasible
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
        """Ŵ_r and c_r for r = 0..n (module docstring): operands, W_0, then n recurrence steps.
        Tables that would not fit in the memory available are refused first (ctrlg.memory)."""
        check_tables_fit(self.dfa.num_states, self.hmm.hidden_size, self.max_new_tokens,
                         self.hmm.emission.device)
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
            # torch's step: on an H200 the Triton kernel was 0.22-0.76x as fast at h = 4,096 and at
            # 100-1,000 DFA states (1.26x only at h = 2,048 with 10 states);
            # benchmarks/results/gpu_nvidia-h200.md
            use_kernel = False
        bar = tqdm(range(1, n + 1), desc="guide tables", leave=False,
                   disable=None if progress is None else not progress)
        band = torch.as_tensor(self.band, device=device)
        w_hat[0, ~band[0]] = 0.0
        log_scale[0, ~band[0]] = -math.inf
        if not use_kernel and device.type == "cpu" and compiled():
            self._compiled_recurrence(w_hat, log_scale, A, bar)
            self.w_hat, self.log_scale = w_hat, log_scale
            return
        step = backward_step_reference
        if use_kernel:
            from ctrlg.kernels.backward_table import backward_step  # imports triton (heavy, optional)
            step = backward_step
        for r in bar:
            # the Triton kernel computes every row (its output has w_prev's rows), then the band
            rows = None if use_kernel or bool(band[r].all()) else torch.nonzero(band[r])[:, 0]
            w_hat[r], log_scale[r] = self._recurrence_step(step, r, w_hat[r - 1], log_scale[r - 1],
                                                           A, rows)
            if rows is None:
                w_hat[r, ~band[r]] = 0.0
                log_scale[r, ~band[r]] = -math.inf
        self.w_hat, self.log_scale = w_hat, log_scale

    def _compiled_recurrence(self, w_hat: torch.Tensor, log_scale: torch.Tensor, A: torch.Tensor,
                             steps) -> None:
        """Steps r ∈ ``steps`` of the recurrence on the CPU with the compiled loops of
        :mod:`ctrlg.kernels.backward_table_cpu` (the same arithmetic as :meth:`_recurrence_step`),
        writing into ``w_hat`` / ``log_scale`` (zeros / −inf outside the band)."""
        fixed = dict(default=self.dfa.default.astype(np.int64), has_default=self.has_default,
                     mass=self._nonexc_mass.numpy(), pair_ptr=self._pair_ptr,
                     pair_dst=self._pair_dst_t.numpy(), pair_row=self._pair_row,
                     pair_emission=self._pair_emission.numpy(),
                     eos_term=self._eos_term.float().contiguous().numpy(),
                     eos_live=self._eos_live.numpy(), eos_log=self._eos_log,
                     transition_t=A.T)
        if self.precision != "float32":                     # G·Aᵀ with bfloat16 inputs
            fixed["transition_t"] = A.T.to(PRECISIONS[self.precision])
        fixed["shared"] = shared_products(self._pair_dst, self._pair_row, self.hmm.hidden_size)
        w_np, c_np = w_hat.numpy(), log_scale.numpy()
        for r in steps:
            recurrence_step_cpu(w_np[r - 1], c_np[r - 1], np.flatnonzero(self.band[r]),
                                eos_ok=self.eos_allowed(r), feasible=self.feasible[r],
                                w_out=w_np[r], c_out=c_np[r], **fixed)

    def _reachable_band(self) -> np.ndarray:
        """B_r = F_r ∧ R_{n−r} (module docstring): R_t by a forward sweep over the default and
        non-EOS exception edges, O(n · (S + E))."""
        n, S = self.max_new_tokens, self.dfa.num_states
        exc = self.exc
        reach = np.zeros((n + 1, S), dtype=bool)
        reach[0, self.dfa.initial] = True
        for t in range(n):
            now = reach[t]
            nxt = reach[t + 1]
            nxt[self.dfa.default[now & self.has_default]] = True
            if len(exc.src):
                nxt[exc.dst[now[exc.src]]] = True
        return self.feasible & reach[::-1]
    def _prepare_products(self, B: torch.Tensor) -> None:
        """Layouts of B for the per-token queries. Bᵀ [V, h]: per-token columns are contiguous rows
        (gathers; p B = linear(p, Bᵀ) gives a contiguous [R, V]); a copy in the product
        precision, packed — these two shared by every table of the HMM
        (:mod:`ctrlg.guide.emission_operands`) — and, per table, one packed block of Bᵀ's rows per
        block letter (letters evaluated as blocks), packed when a query first needs it."""
        shared = emission_operands(self.hmm, PRECISIONS[self.precision])   # built once per HMM
        self._emission_t = shared.emission_t
        emission = shared.emission_low
        self._emission_min = shared.emission_min                          # min_v B[z, v], [h]
        self._emission_product = shared.product
        self._row_sum = shared.row_sum                                    # Σ_v B[z, v], float64
        self._large_letters = shared.large_letters                        # sums of large letters
        self.block_letter = np.diff(self.members_ptr) >= BLOCK_LETTER
        self._members_t = torch.as_tensor(self.members, device=B.device)
        self._letter_products = LetterProducts(emission, self._members_t, self.members_ptr)

    def _prepare_recurrence(self, A: torch.Tensor, B: torch.Tensor) -> None:
        """The recurrence's fixed operands: DFA arrays, per-letter emission rows B̄, the
        non-exception mass M_s, the EOS terminal term and its log scale."""
        dfa, exc, h, S = self.dfa, self.exc, self.hmm.hidden_size, self.dfa.num_states
        device = B.device
        tensor = lambda a: torch.tensor(a, device=device)  # noqa: E731
        self._default_t = tensor(dfa.default)
        self._exc_src_t, self._exc_dst_t = tensor(exc.src), tensor(exc.dst)
        self._exc_tok_t = tensor(exc.tok)
        if dfa.has_letters:  # B̄[:, a] = Σ_{v ∈ a, v ∉ EOS} B[:, v], float64 [A, h]
            rows = letter_emission_sums(self._emission_t, self._row_sum, self.members_ptr,
                                        self.members, self.eos_ids, self._large_letters)
            self._emission_rows = rows.float()
        else:
            rows = self._emission_rows = self._emission_t                       # [V, h]
        # Ē_{s,t} per (source, successor) pair; M_s = rowsum(B) − Σ_t Ē_{s,t} − EOS columns, in
        # float64, clamped at 0.
        pair_sums = self._recurrence_pairs(rows)                 # [U, h]: one row per letter set
        mass = self._row_sum.expand(S, h).clone()
        if len(self._pair_row):     # Σ_t Ē_{s,t} per source: pair counts per (source, set) · Ē
            mass -= grouped_sums(self._pair_src_t.cpu().numpy(), self._pair_row, pair_sums, S)
        self._pair_emission = pair_sums.float()
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

    def _recurrence_pairs(self, rows: torch.Tensor) -> torch.Tensor:
        """The exceptions grouped by (source, successor) pair, sorted by source: sets
        ``_pair_src_t``, ``_pair_dst_t``, ``_pair_ptr`` (CSR over sources) and ``_pair_row`` /
        ``_pair_row_t`` (each pair's row of the result), and returns Ē [U, h] float64: one row
        per distinct set of letters, Ē_{s,t} = Σ_{exceptional letters a of s with δ(s, a) = t}
        B̄[:, a] = row ``_pair_row[p]``, as a sparse 0/1 [U, A] matrix times ``rows`` = B̄ᵀ [A, h]
        (Bᵀ without letters; products in its dtype). The recurrence's exception term
        Σ_{v ∈ exc(s)} B[:, v] ⊙ W(δ(s, v)) is Σ_t Ē_{s,t} ⊙ W(t): one gather and one
        multiply-add per pair instead of per exception (a CommonGen DFA: 3.4× fewer). Pairs
        with the same letters share their row (a CommonGen DFA: ≈ 3,000 pairs, ≈ 50 rows), so
        the rows the recurrence streams at every step stay in cache and are summed once."""
        exc, device, S = self.exc, rows.device, self.dfa.num_states
        key = exc.src.astype(np.int64) * S + exc.dst
        pairs, of_exception = np.unique(key, return_inverse=True)
        of_exception = of_exception.reshape(-1)
        self._pair_src_t = torch.as_tensor(pairs // S, device=device)
        self._pair_dst = pairs % S                                        # numpy, for the CPU loops
        self._pair_dst_t = torch.as_tensor(self._pair_dst, device=device)
        self._pair_ptr = np.searchsorted(pairs // S, np.arange(S + 1)).astype(np.int64)
        order = np.lexsort((exc.tok, of_exception))                       # by pair, then letter
        bounds = np.searchsorted(of_exception[order], np.arange(len(pairs) + 1))
        letters = exc.tok[order].tolist()
        sets: dict[tuple, int] = {}
        self._pair_row = np.array([sets.setdefault(tuple(letters[bounds[p]:bounds[p + 1]]), len(sets))
                                   for p in range(len(pairs))], dtype=np.int64)
        self._pair_row_t = torch.as_tensor(self._pair_row, device=device)
        first = np.unique(self._pair_row, return_index=True)[1]           # a pair holding each set
        member = np.isin(of_exception, first)
        return grouped_sums(self._pair_row[of_exception[member]], exc.tok[member], rows,
                            len(sets)).double()

    def _recurrence_step(self, step, r: int, w_prev: torch.Tensor, c: torch.Tensor,
                         A: torch.Tensor, rows: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """(Ŵ_r, c_r) from (Ŵ_{r-1}, c_{r-1}): every term of g_s rescaled to the common scale m_s,
        one ``step`` (G · Aᵀ), then rows renormalised to max 1. ``rows``: compute only these
        states (the band B_r); the others are 0 with scale −inf."""
        S, device = len(c), c.device
        c_default = torch.where(self._has_default_t, c[self._default_t], -math.inf)
        m = c_default.clone()
        if len(self._pair_src_t):
            m.scatter_reduce_(0, self._pair_src_t, c[self._pair_dst_t], reduce="amax")
        eos_ok = self.eos_allowed(r)
        if eos_ok:
            m = torch.where(self._eos_live, torch.clamp_min(m, self._eos_log), m)
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        coef_default = torch.exp(c_default - m_safe).float()
        coef_pair = torch.exp(c[self._pair_dst_t] - m_safe[self._pair_src_t]).float()
        # e^{eos_log − m} ≤ 1 where EOS is live; elsewhere it may overflow (m far below 0) and
        # must read 0, not 0 · inf = nan (the compiled loop skips those rows alike)
        coef_eos = torch.where(self._eos_live, torch.exp(self._eos_log - m_safe), 0.0).float() \
            if eos_ok else torch.zeros(S, device=device)
        if rows is None:
            raw = step(w_prev, self._default_t, coef_default, self._nonexc_mass, self._pair_src_t,
                       self._pair_dst_t, self._pair_row_t, self._pair_emission, coef_pair,
                       self._eos_term, coef_eos, A)
            return self._normalised(raw, m, m_safe, self._feasible_t[r])
        local = torch.full((S,), -1, dtype=torch.long, device=device)
        local[rows] = torch.arange(len(rows), device=device)
        # pairs into the band whose successor is live (a zero coefficient adds exact zeros)
        kept = torch.nonzero((local[self._pair_src_t] >= 0) & (coef_pair > 0))[:, 0]
        raw = step(w_prev, self._default_t[rows], coef_default[rows], self._nonexc_mass[rows],
                   local[self._pair_src_t[kept]], self._pair_dst_t[kept], self._pair_row_t[kept],
                   self._pair_emission, coef_pair[kept], self._eos_term[rows], coef_eos[rows], A)
        w_rows, scale_rows = self._normalised(raw, m[rows], m_safe[rows], self._feasible_t[r][rows])
        w = torch.zeros(S, w_prev.shape[1], device=device)
        scale = torch.full((S,), -math.inf, dtype=torch.float64, device=device)
        w[rows], scale[rows] = w_rows, scale_rows
        return w, scale

    @staticmethod
    def _normalised(raw: torch.Tensor, m: torch.Tensor, m_safe: torch.Tensor,
                    feasible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of ``raw`` renormalised to max 1 with their log scales; feasible rows whose weight
        underflowed get an (over-)estimate, never exactly 0."""
        mx = raw.amax(1)
        ok = (mx > 0) & torch.isfinite(m) & torch.isfinite(mx)
        w = torch.where(ok[:, None], raw / torch.where(ok, mx, 1.0)[:, None], 0.0)
        scale = torch.where(ok, m_safe + torch.log(torch.where(ok, mx, 1.0).double()), -math.inf)
        lost = feasible & ~ok
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

    def log_prob_accept(self, state: int | None = None, prior: torch.Tensor | None = None,
                        remaining: int | None = None) -> float:
        """log P_hmm(α) from a DFA state and prior (defaults: the start of generation)."""
        s = self.dfa.initial if state is None else int(state)
        p = self.initial_prior() if prior is None else prior.reshape(1, -1)
        r = self.max_new_tokens if remaining is None else int(remaining)
        if not self.feasible[r, s]:
            return -math.inf
        if not self.band[r, s]:
            raise ConstraintError(
                f"state {s} cannot be reached with {r} of {self.max_new_tokens} tokens left, so its "
                f"table was not computed; build the tables with reachable_only=False to query it")
        log_joint, _ = self.token_weights([s], p, r)
        return float(torch.logsumexp(log_joint.double(), dim=1))

    def advance(self, priors: torch.Tensor, tokens) -> torch.Tensor:
        """Forward messages after emitting ``tokens`` [R]: see :func:`forward_update`."""
        tokens = torch.as_tensor(tokens, device=priors.device).reshape(-1)
        return forward_update(priors, tokens, self._transition, self._emission_t)


class LetterProducts:
    """Block letter a → x ↦ x · B[:, members of a] (:class:`PackedLinear` over a contiguous copy
    of its rows of Bᵀ in the product precision), packed on first use: queries that never
    reach a letter's block product (beam search keeping few candidates, sampling from states
    without it) never pay its copy and packing."""

    def __init__(self, emission_low: torch.Tensor, members: torch.Tensor, members_ptr: np.ndarray):
        self._emission, self._members, self._ptr = emission_low, members, members_ptr
        self._packed: dict[int, PackedLinear] = {}

    def __getitem__(self, letter: int) -> PackedLinear:
        if letter not in self._packed:
            tokens = self._members[self._ptr[letter]:self._ptr[letter + 1]]
            self._packed[letter] = PackedLinear(self._emission[tokens].contiguous())
        return self._packed[letter]


def grouped_sums(group: np.ndarray, member: np.ndarray, rows: torch.Tensor,
                 num_groups: int) -> torch.Tensor:
    """out[g] = Σ_{k: group[k] = g} rows[member[k]] ([num_groups, h], in ``rows``' dtype): a
    sparse 0/1 [num_groups, len(rows)] matrix times ``rows``, which reads only the member rows
    (an ``index_add_`` of gathered rows dispatches row by row on the CPU)."""
    index = torch.as_tensor(np.stack([group, member]).astype(np.int64), device=rows.device)
    onehot = torch.sparse_coo_tensor(index, torch.ones(index.shape[1], dtype=rows.dtype,
                                                       device=rows.device),
                                     size=(num_groups, rows.shape[0]), check_invariants=False)
    return torch.sparse.mm(onehot.coalesce(), rows)


def letter_emission_sums(emission_t: torch.Tensor, row_sum: torch.Tensor, members_ptr: np.ndarray,
                         members: np.ndarray, eos_ids: Sequence[int],
                         large: LargeLetterSums | None = None) -> torch.Tensor:
    """B̄ᵀ [A, h] float64, B̄[:, a] = Σ_{v ∈ a, v ∉ EOS} B[:, v], for letters given as ``members``
    sorted by letter with offsets ``members_ptr`` [A + 1]. The largest letter, usually most of the
    vocabulary, is rowsum(B) − Σ_EOS B[:, e] − the others, in float64 and clamped at 0. With
    ``large`` (the HMM's :class:`ctrlg.guide.letter_sums.LargeLetterSums`), the other letters of
    ≥ ``LARGE_LETTER`` members come from its store, as differences from a set it has summed
    before; the rest are one row each of a sparse 0/1 [A, V] matrix times Bᵀ (only their
    members' rows of Bᵀ are read)."""
    sizes = np.diff(members_ptr)
    largest = int(np.argmax(sizes))
    letter = np.repeat(np.arange(len(sizes)), sizes)
    keep = (letter != largest) & ~np.isin(members, np.asarray(eos_ids, dtype=np.int64))
    stored = np.zeros(len(sizes), dtype=bool)
    if large is not None:
        kept_sizes = np.bincount(letter[keep], minlength=len(sizes))
        stored = kept_sizes >= LARGE_LETTER
        stored[largest] = False
    summed_here = keep & ~stored[letter]
    sums = grouped_sums(letter[summed_here], members[summed_here], emission_t, len(sizes)).double()
    for a in np.flatnonzero(stored):
        sums[a] = large.sum(members[keep & (letter == a)])
    rest = row_sum - sums.sum(0)
    if len(eos_ids):
        rest -= emission_t[list(eos_ids)].double().sum(0)
    sums[largest] = rest
    return sums.clamp_min_(0)


def build_tables(hmm, dfa: TokenDFA, max_new_tokens: int, **kwargs) -> GuideTables:
    """Backward tables for ``dfa`` under ``hmm`` with budget ``max_new_tokens`` (see GuideTables).
    ``hmm=None`` gives logical-only tables (feasibility only)."""
    return GuideTables(dfa, hmm, max_new_tokens, **kwargs)
