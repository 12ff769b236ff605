"""Guided sampling that feeds the tokens a constraint forces to the LM in one forward pass.

Many constraints force long runs of tokens: an infilling constraint (:mod:`ctrlg.tasks.infill`)
allows exactly one token at every position of an unmasked fragment, a JSON template at every
key. Token-by-token decoding pays one LM step per forced token; this sampler pays one step per
*choice*. Each row r of a batch of R samples keeps its DFA state s, its HMM prior p (the filtering
posterior over its generated tokens, :meth:`ctrlg.guide.GuideTables.advance`), the tokens generated
so far and the LM's next-token logits. One iteration:

1. **choice** — every row draws x ~ p(x | x≤t, α) ∝ p_lm(x | x≤t)^{1/T} · p_hmm(α | x≤t, x)^{w}
   (:func:`ctrlg.guide.guidance.guided_log_probs` with the row's remaining budget, all free rows in
   one call; w = 0 or no HMM: logical masking; drawn by inverting the cumulative sum,
   :func:`ctrlg.hmm.sampling.draw_inverse_cdf`), unless its state is *forced*: exactly one token is feasible
   (:meth:`~ctrlg.guide.feasibility.Feasibility.feasible_counts`), which is then taken;
2. **fast-forward** — while the row's state is forced and it has not ended (EOS or the budget),
   the forced token is appended without consulting the LM (the guided distribution gives it
   probability 1, so the sampled distribution is unchanged);
3. **one LM forward** over each row's new tokens at once (a ragged batch: rows padded on the right
   of their chunk, masked out of attention, positions counted per row; the KV cache holds the pad
   slots, masked for ever after; :mod:`ctrlg.lm.lean_decoder`'s forward where it covers the LM). Its logits give log p_lm of every forced token (for the
   likelihood used to rank samples) and the next choice's distribution.

A finished row (EOS, or the budget spent) leaves the batch (``batch_select_indices``). With the
lean forward the KV cache grows in place (:class:`ctrlg.lm.growing_cache.GrowingCache`), not by
concatenation.
Cost: LM forwards = choices + 1 instead of tokens; guidance per choice as in the processor
(O(h² + h·V) per row). Every output is accepted (feasibility is exact); the LM log-likelihood of
each sample is summed from the logits already computed, so reranking needs no second pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ctrlg.dfa.core import TokenDFA
from ctrlg.dfa.ops import restrict_to_budget
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError
from ctrlg.guide.feasibility import Feasibility
from ctrlg.guide.guidance import guided_log_probs
from ctrlg.guide.tables import GuideTables
from ctrlg.hmm.sampling import draw_inverse_cdf
from ctrlg.lm.lean_decoder import lean_llama
from ctrlg.lm.shared_context import cache_keyword, returned_cache

__all__ = ["Sample", "sample_fast_forward", "build_guide"]


@dataclass
class Sample:
    """One generated sequence: its token ids (EOS included when it ended one), log p_lm of those
    tokens under the LM (temperature 1), the number of LM forwards it took part in and whether the
    constraint accepts it."""

    token_ids: list[int]
    lm_log_likelihood: float
    accepted: bool
    lm_calls: int = 0
    forced: int = 0                       # tokens taken without a choice


def build_guide(constraint: TokenDFA, max_new_tokens: int, *, hmm=None, eos_token_id=None,
                precision: str = "float32", min_new_tokens: int = 0):
    """The tables of ``constraint`` under the budget (:class:`GuideTables` with an HMM, else
    :class:`Feasibility`), over the DFA restricted to what an accepted sequence of at most
    ``max_new_tokens`` tokens visits."""
    if not isinstance(constraint, TokenDFA):
        raise ConstraintError(f"the fast-forward sampler takes a TokenDFA, got {type(constraint).__name__}")
    try:
        dfa = restrict_to_budget(constraint, max_new_tokens)
    except UnsatisfiableConstraintError:
        dfa = constraint
    if hmm is None:
        table = Feasibility(dfa, max_new_tokens, min_new_tokens=min_new_tokens,
                            eos_token_id=eos_token_id)
    else:
        table = GuideTables(dfa, hmm, max_new_tokens, min_new_tokens=min_new_tokens,
                            eos_token_id=eos_token_id, precision=precision, progress=False)
    table.check_satisfiable()
    return table


@dataclass
class _Rows:
    """The batch's per-row state (indices are positions in the current batch). ``tokens`` are
    the decided tokens, of which the last ``len(pending)`` are not yet fed to the LM;
    ``last_logits`` predict the first of those (or the next choice when none is pending)."""

    states: np.ndarray
    priors: torch.Tensor | None
    tokens: list[list[int]]
    pending: list[list[int]]
    loglik: list[float]
    calls: list[int]
    forced: list[int]
    origin: list[int]                                  # the sample each row is
    positions: np.ndarray                              # the next fed token's position per row
    last_logits: torch.Tensor                          # [R, V] float32
    attention: torch.Tensor = field(default=None)      # [R, past] 0/1

    def select(self, keep: list[int]) -> None:
        index = torch.as_tensor(keep, dtype=torch.long)
        self.states = self.states[keep]
        self.priors = self.priors[index] if self.priors is not None else None
        for name in ("tokens", "pending", "loglik", "calls", "forced", "origin"):
            setattr(self, name, [getattr(self, name)[i] for i in keep])
        self.positions = self.positions[keep]
        self.last_logits = self.last_logits[index]
        self.attention = self.attention[index.to(self.attention.device)]


def _forced_tokens(table, states: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """The only feasible token of each row, or −1 where there is a choice."""
    counts = table.feasible_counts(states, remaining)
    out = np.full(len(states), -1, dtype=np.int64)
    single = np.flatnonzero(counts == 1)
    if len(single):
        mask = table.token_feasible(states[single], remaining[single])
        out[single] = mask.to(torch.int8).argmax(1).cpu().numpy()
    return out


class _Sampler:
    """One call of :func:`sample_fast_forward` (module docstring)."""

    def __init__(self, model, table, n: int, eos: list[int], guided: bool, strength: float,
                 temperature: float, generator):
        from transformers import DynamicCache

        from ctrlg.lm.growing_cache import GrowingCache   # imports transformers: only when an LM runs

        self.model, self.table, self.n = model, table, n
        self.eos_set, self.guided, self.strength = set(eos), guided, strength
        self.temperature, self.generator = temperature, generator
        self.V = table.vocab_size
        self.keyword = cache_keyword(model)
        self.device = next(model.parameters()).device
        self.lean = lean_llama(model)          # the same forward in fewer operations, where it applies
        # its KV cache written in place; other models keep transformers' own
        self.cache = GrowingCache() if self.lean is not None else DynamicCache()

    def ended(self, rows: _Rows, i: int) -> bool:
        ids = rows.tokens[i]
        return bool(ids) and (ids[-1] in self.eos_set or len(ids) >= self.n)

    def start(self, prompt_ids: Sequence[int], num_samples: int) -> _Rows:
        """One row: the prompt and the tokens forced from the initial state fed in one forward
        (every sample shares them), then the row repeated ``num_samples`` times."""
        table = self.table
        rows = _Rows(states=np.array([table.dfa.initial], dtype=np.int64),
                     priors=table.initial_prior(1) if self.guided else None, tokens=[[]],
                     pending=[[]], loglik=[0.0], calls=[0], forced=[0], origin=[0],
                     positions=np.zeros(1, dtype=np.int64), last_logits=None,
                     attention=torch.zeros(1, 0, dtype=torch.long, device=self.device))
        self.extend(rows, [0])
        prompt = [int(t) for t in prompt_ids]
        self.feed(rows, [prompt + rows.pending[0]], first_logits=None, skip=len(prompt))
        rows.pending = [[]]
        R = num_samples
        self.cache.batch_repeat_interleave(R)
        rows.select([0] * R)
        rows.origin = list(range(R))
        rows.tokens = [list(rows.tokens[0]) for _ in range(R)]
        rows.pending = [[] for _ in range(R)]
        return rows

    def decide(self, rows: _Rows) -> None:
        """Rows with nothing pending choose their next token (sampled from the guided
        distribution, or the forced one), then take every token forced after it."""
        todo = [i for i in range(len(rows.origin)) if not rows.pending[i] and not self.ended(rows, i)]
        if not todo:
            return
        idx = np.asarray(todo, dtype=np.int64)
        remaining = np.array([self.n - len(rows.tokens[i]) for i in todo], dtype=np.int64)
        chosen = _forced_tokens(self.table, rows.states[idx], remaining)
        free = np.flatnonzero(chosen < 0)
        if len(free):            # every free row in one guided call (one HMM product), one draw each
            at = torch.as_tensor(idx[free])
            scores = torch.log_softmax(rows.last_logits[at], dim=-1) / self.temperature
            priors = rows.priors[at] if self.guided else None
            dist = guided_log_probs(scores, [self.table], np.zeros(len(free), dtype=np.int64),
                                    rows.states[idx[free]], priors, remaining[free],
                                    self.strength if self.guided else 1.0)
            picks, _ = draw_inverse_cdf(dist.float(), self.generator)
            chosen[free] = picks.numpy()
        chosen_forced = np.ones(len(todo), dtype=bool)
        chosen_forced[free] = False
        for k, i in enumerate(todo):
            rows.forced[i] += int(chosen_forced[k])
        self._advance(rows, idx, chosen)
        self.extend(rows, todo)

    def extend(self, rows: _Rows, todo: list[int]) -> None:
        """Append the forced tokens of rows ``todo`` while their state is forced."""
        active = [i for i in todo if not self.ended(rows, i)]
        while active:
            idx = np.asarray(active, dtype=np.int64)
            remaining = np.array([self.n - len(rows.tokens[i]) for i in active], dtype=np.int64)
            forced = _forced_tokens(self.table, rows.states[idx], remaining)
            go = forced >= 0
            if not go.any():
                return
            idx = idx[go]
            for i in idx.tolist():
                rows.forced[i] += 1
            self._advance(rows, idx, forced[go])
            active = [i for i in idx.tolist() if not self.ended(rows, i)]

    def _advance(self, rows: _Rows, idx: np.ndarray, tokens: np.ndarray) -> None:
        """Rows ``idx`` emit ``tokens``: DFA state, HMM prior, decided and pending tokens."""
        tokens = np.asarray(tokens, dtype=np.int64)
        rows.states[idx] = self.table.dfa.step_many(rows.states[idx], tokens)
        if self.guided:
            where = torch.as_tensor(idx)
            rows.priors[where] = self.table.advance(rows.priors[where], torch.as_tensor(tokens))
        for i, token in zip(idx.tolist(), tokens.tolist()):
            rows.tokens[i].append(int(token))
            rows.pending[i].append(int(token))

    def feed_pending(self, rows: _Rows) -> None:
        """One LM forward over the pending tokens of every row, at most ``width`` each: the
        longest run when runs are alike, else max(8, 2 × the median) — a long forced run is fed
        over several forwards rather than padding every row to its length."""
        lengths = [len(p) for p in rows.pending]
        width = max(lengths)
        cap = max(8, 2 * int(np.median(lengths)))
        width = min(width, cap)
        chunks = [p[:width] for p in rows.pending]
        rows.pending = [p[width:] for p in rows.pending]
        self.feed(rows, chunks, first_logits=rows.last_logits)

    def feed(self, rows: _Rows, chunks: list[list[int]], first_logits, skip: int = 0) -> None:
        """LM forward over each row's ``chunks`` (right-padded, masked); adds log p_lm of every
        fed token past the first ``skip`` (the first from ``first_logits``) to the rows."""
        R, width = len(chunks), max(len(c) for c in chunks)
        ids = torch.zeros(R, width, dtype=torch.long)
        mask = torch.zeros(R, width, dtype=torch.long)
        for i, chunk in enumerate(chunks):
            ids[i, :len(chunk)] = torch.as_tensor(chunk, dtype=torch.long)
            mask[i, :len(chunk)] = 1
        positions = torch.as_tensor(rows.positions)[:, None] + torch.arange(width)[None, :]
        attention = torch.cat([rows.attention, mask.to(self.device)], dim=1)
        if self.lean is not None:
            logits = self.lean(ids.to(self.device), attention, positions.to(self.device),
                               self.cache)[..., :self.V]
        else:
            out = self.model(input_ids=ids.to(self.device), attention_mask=attention,
                             position_ids=positions.to(self.device), use_cache=True,
                             **{self.keyword: self.cache})
            self.cache = returned_cache(out)
            logits = out.logits[..., :self.V].float()
        rows.attention = attention
        new_last = torch.empty(R, self.V)
        for i, chunk in enumerate(chunks):
            k = len(chunk)
            if first_logits is not None and skip == 0:
                rows.loglik[i] += float(torch.log_softmax(first_logits[i], -1)[chunk[0]])
            begin = max(skip, 1)
            if k > begin:
                log_probs = torch.log_softmax(logits[i, begin - 1:k - 1], dim=-1)
                follow = torch.as_tensor(chunk[begin:], device=log_probs.device)
                rows.loglik[i] += float(log_probs.gather(1, follow[:, None]).sum())
            new_last[i] = logits[i, k - 1]
            rows.positions[i] += k
            rows.calls[i] += 1
        rows.last_logits = new_last


@torch.no_grad()
def sample_fast_forward(model, prompt_ids: Sequence[int], constraint: TokenDFA, *, hmm=None,
                        num_samples: int = 1, max_new_tokens: int, eos_token_id=None,
                        strength: float = 1.0, temperature: float = 1.0, seed: int = 0,
                        precision: str = "float32", table=None) -> list[Sample]:
    """``num_samples`` guided samples of at most ``max_new_tokens`` tokens after ``prompt_ids``
    (module docstring). ``hmm=None`` or ``strength=0``: logical masking. ``table``: tables already
    built by :func:`build_guide` for the same constraint and budget. Returns the samples in draw
    order (each accepted by ``constraint``)."""
    if temperature <= 0 or not math.isfinite(temperature):
        raise ConstraintError(f"temperature must be a positive number, got {temperature!r}")
    if num_samples < 1:
        raise ConstraintError(f"num_samples must be ≥ 1, got {num_samples}")
    if not len(prompt_ids):
        raise ConstraintError("the prompt is empty; give at least a BOS token")
    eos = [] if eos_token_id is None else ([int(eos_token_id)] if isinstance(eos_token_id, int)
                                           else [int(e) for e in eos_token_id])
    n = int(max_new_tokens)
    if table is None:
        table = build_guide(constraint, n, hmm=hmm, eos_token_id=eos or None, precision=precision)
    guided = hmm is not None and strength > 0 and isinstance(table, GuideTables)
    sampler = _Sampler(model, table, n, eos, guided, strength, temperature,
                       torch.Generator().manual_seed(int(seed)))
    rows = sampler.start(prompt_ids, num_samples)
    finished: dict[int, Sample] = {}
    while rows.origin:
        sampler.decide(rows)
        done = [i for i in range(len(rows.origin)) if not rows.pending[i] and sampler.ended(rows, i)]
        for i in done:
            ids = rows.tokens[i]
            finished[rows.origin[i]] = Sample(ids, rows.loglik[i], bool(constraint.accepts(ids)),
                                              rows.calls[i], rows.forced[i])
        if done:
            keep = [i for i in range(len(rows.origin)) if i not in done]
            sampler.cache.batch_select_indices(torch.as_tensor(keep, dtype=torch.long,
                                                               device=sampler.device))
            rows.select(keep)
        if rows.origin:
            sampler.feed_pending(rows)
    return [finished[i] for i in range(num_samples)]
