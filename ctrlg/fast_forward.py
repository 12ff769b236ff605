"""Guided sampling that feeds the tokens a constraint forces to the LM in one forward pass.

Many constraints force long runs of tokens: an infilling constraint (:mod:`ctrlg.tasks.infill`)
allows exactly one token at every position of an unmasked fragment, a JSON template at every
key. Token-by-token decoding pays one LM step per forced token; this sampler pays one step per
*choice*. Each row r of a batch of R samples keeps its DFA state s, its HMM prior p (the filtering
posterior over its generated tokens, :meth:`ctrlg.guide.GuideTables.advance`), the tokens generated
so far and the LM's next-token logits. One iteration:

1. **choice** — every row draws x ~ p(x | x≤t, α) ∝ p_lm(x | x≤t)^{1/T} · p_hmm(α | x≤t, x)^{w}
   (:func:`ctrlg.guide.guidance.guided_log_probs` with the row's remaining budget; w = 0 or no HMM:
   logical masking), unless its state is *forced*: exactly one token is feasible
   (:meth:`~ctrlg.guide.feasibility.Feasibility.feasible_counts`), which is then taken;
2. **fast-forward** — while the row's state is forced and it has not ended (EOS or the budget),
   the forced token is appended without consulting the LM (the guided distribution gives it
   probability 1, so the sampled distribution is unchanged);
3. **one LM forward** over each row's new tokens at once (a ragged batch: rows padded on the right
   of their chunk, masked out of attention, positions counted per row; the KV cache holds the pad
   slots, masked for ever after). Its logits give log p_lm of every forced token (for the
   likelihood used to rank samples) and the next choice's distribution.

A finished row (EOS, or the budget spent) leaves the batch (:meth:`DynamicCache.batch_select_indices`).
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
from ctrlg.lm.models import cache_keyword, returned_cache

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
    """The batch's per-row state (indices are positions in the current batch)."""

    states: np.ndarray
    priors: torch.Tensor | None
    tokens: list[list[int]]
    loglik: list[float]
    calls: list[int]
    forced: list[int]
    origin: list[int]                                  # the sample each row is
    positions: np.ndarray                              # the next token's position per row
    last_logits: torch.Tensor                          # [R, V] float32
    attention: torch.Tensor = field(default=None)      # [R, past] 0/1


def _forced_tokens(table, states: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """The only feasible token of each row, or −1 where there is a choice."""
    counts = table.feasible_counts(states, remaining)
    out = np.full(len(states), -1, dtype=np.int64)
    single = np.flatnonzero(counts == 1)
    if len(single):
        mask = table.token_feasible(states[single], remaining[single])
        out[single] = mask.to(torch.int8).argmax(1).cpu().numpy()
    return out


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
    eos = [] if eos_token_id is None else ([int(eos_token_id)] if isinstance(eos_token_id, int)
                                           else [int(e) for e in eos_token_id])
    n = int(max_new_tokens)
    if table is None:
        table = build_guide(constraint, n, hmm=hmm, eos_token_id=eos or None, precision=precision)
    guided = hmm is not None and strength > 0 and isinstance(table, GuideTables)
    V = table.vocab_size
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(int(seed))
    from transformers import DynamicCache

    keyword = cache_keyword(model)
    prompt = torch.as_tensor([list(prompt_ids)], dtype=torch.long, device=device)
    out = model(input_ids=prompt, use_cache=True, **{keyword: DynamicCache()})
    cache = returned_cache(out)
    cache.batch_repeat_interleave(num_samples)
    R = num_samples
    rows = _Rows(states=np.full(R, table.dfa.initial, dtype=np.int64),
                 priors=table.initial_prior(R) if guided else None,
                 tokens=[[] for _ in range(R)], loglik=[0.0] * R, calls=[1] * R, forced=[0] * R,
                 origin=list(range(R)), positions=np.full(R, prompt.shape[1], dtype=np.int64),
                 last_logits=out.logits[:, -1, :V].float().expand(R, -1).clone(),
                 attention=torch.ones(R, prompt.shape[1], dtype=torch.long, device=device))
    finished: dict[int, Sample] = {}
    eos_set = set(eos)
    while len(rows.origin):
        chunks = _choose_and_extend(rows, table, n, eos_set, guided, strength, temperature,
                                    generator)
        done = [i for i, chunk in enumerate(chunks)
                if chunk[-1] in eos_set or len(rows.tokens[i]) >= n]
        # forced tokens after the chosen one still need their LM log-probabilities
        needs_lm = [i for i in range(len(chunks)) if i not in done or len(chunks[i]) > 1]
        if needs_lm:
            _forward(model, rows, chunks, needs_lm, cache, V, keyword)
        for i in done:
            ids = rows.tokens[i]
            finished[rows.origin[i]] = Sample(ids, rows.loglik[i], bool(constraint.accepts(ids)),
                                              rows.calls[i], rows.forced[i])
        keep = [i for i in range(len(chunks)) if i not in done]
        if len(keep) < len(chunks):
            _select(rows, keep, cache)
    return [finished[i] for i in range(R)]


def _choose_and_extend(rows: _Rows, table, n: int, eos_set: set, guided: bool, strength: float,
                       temperature: float, generator) -> list[list[int]]:
    """Step 1 and 2 of the module docstring for every row: the new tokens of each row."""
    R = len(rows.origin)
    remaining = np.array([n - len(t) for t in rows.tokens], dtype=np.int64)
    chosen = _forced_tokens(table, rows.states, remaining)
    free = np.flatnonzero(chosen < 0)
    log_probs = torch.log_softmax(rows.last_logits, dim=-1)
    for r in np.unique(remaining[free]):
        group = free[remaining[free] == r]
        scores = log_probs[torch.as_tensor(group)] / temperature
        priors = rows.priors[torch.as_tensor(group)] if guided else None
        dist = guided_log_probs(scores, [table], np.zeros(len(group), dtype=np.int64),
                                rows.states[group], priors, int(r), strength if guided else 1.0)
        picks = torch.multinomial(torch.softmax(dist.float(), -1), 1, generator=generator)
        chosen[group] = picks[:, 0].numpy()
    chunks = [[int(chosen[i])] for i in range(R)]
    was_forced = np.ones(R, dtype=bool)
    was_forced[free] = False
    for i in range(R):
        rows.loglik[i] += float(log_probs[i, chunks[i][0]])
        rows.forced[i] += int(was_forced[i])
    _advance(rows, np.arange(R), chosen, table, guided)
    active = np.array([c[-1] not in eos_set and len(rows.tokens[i]) < n
                       for i, c in enumerate(chunks)], dtype=bool)
    while active.any():
        idx = np.flatnonzero(active)
        rem = np.array([n - len(rows.tokens[i]) for i in idx], dtype=np.int64)
        forced = _forced_tokens(table, rows.states[idx], rem)
        go = forced >= 0
        if not go.any():
            break
        idx, forced = idx[go], forced[go]
        for i, token in zip(idx.tolist(), forced.tolist()):
            chunks[i].append(int(token))
            rows.forced[i] += 1
        _advance(rows, idx, forced, table, guided)
        active[:] = False
        active[idx] = [chunks[i][-1] not in eos_set and len(rows.tokens[i]) < n for i in idx]
    return chunks


def _advance(rows: _Rows, idx: np.ndarray, tokens: np.ndarray, table, guided: bool) -> None:
    """Rows ``idx`` emit ``tokens``: DFA state, HMM prior, token list."""
    tokens = np.asarray(tokens, dtype=np.int64)
    rows.states[idx] = table.dfa.step_many(rows.states[idx], tokens)
    if guided:
        where = torch.as_tensor(idx)
        rows.priors[where] = table.advance(rows.priors[where], torch.as_tensor(tokens))
    for i, token in zip(idx.tolist(), tokens.tolist()):
        rows.tokens[i].append(int(token))


def _forward(model, rows: _Rows, chunks: list[list[int]], needs: list[int], cache, V: int,
             keyword: str) -> None:
    """One LM forward over every row's chunk (rows not in ``needs`` get a fully masked chunk)."""
    R = len(chunks)
    width = max(len(chunks[i]) for i in needs)
    device = rows.attention.device
    ids = torch.zeros(R, width, dtype=torch.long)
    mask = torch.zeros(R, width, dtype=torch.long)
    for i in needs:
        ids[i, :len(chunks[i])] = torch.as_tensor(chunks[i])
        mask[i, :len(chunks[i])] = 1
    positions = torch.as_tensor(rows.positions)[:, None] + torch.arange(width)[None, :]
    attention = torch.cat([rows.attention, mask.to(device)], dim=1)
    out = model(input_ids=ids.to(device), attention_mask=attention,
                position_ids=positions.to(device), use_cache=True, **{keyword: cache})
    logits = out.logits[..., :V].float()
    rows.attention = attention
    for i in needs:
        k = len(chunks[i])
        if k > 1:
            log_probs = torch.log_softmax(logits[i, :k - 1], dim=-1)
            follow = torch.as_tensor(chunks[i][1:], device=log_probs.device)
            rows.loglik[i] += float(log_probs.gather(1, follow[:, None]).sum())
        rows.last_logits[i] = logits[i, k - 1]
        rows.positions[i] += k
        rows.calls[i] += 1


def _select(rows: _Rows, keep: list[int], cache) -> None:
    """Keep only rows ``keep`` (the others finished; a row that goes on was in this iteration's
    forward, so the cache and the attention mask have the same width for every row)."""
    index = torch.as_tensor(keep, dtype=torch.long)
    cache.batch_select_indices(index.to(rows.attention.device))
    rows.states = rows.states[keep]
    rows.priors = rows.priors[index] if rows.priors is not None else None
    for name in ("tokens", "loglik", "calls", "forced", "origin"):
        setattr(rows, name, [getattr(rows, name)[i] for i in keep])
    rows.positions = rows.positions[keep]
    rows.last_logits = rows.last_logits[index]
    rows.attention = rows.attention[index.to(rows.attention.device)]
