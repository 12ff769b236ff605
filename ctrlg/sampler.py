"""Ctrl-G decoding with transformers: a LogitsProcessor, a ``generate`` helper and LM reranking.

:class:`ConstraintLogitsProcessor` implements Ctrl-G's rule (Zhang et al. 2024, eq. 2)

    p(v | x≤t, α) ∝ p_lm(v | x≤t) · p_hmm(α | x≤t, v),
    p_hmm(α | x≤t, v) = P_hmm(v, α | x≤t) / P_hmm(v | x≤t)            (see :mod:`ctrlg.guide`)

as ``log_softmax(scores + log p_hmm(α | x≤t, v))`` per row, so the returned scores are normalised
log-probabilities of the guided distribution (for beam search, beam scores are then sums of guided
log-probabilities; for sampling the normalisation is immaterial). Tokens that make the constraint
unsatisfiable within the remaining budget get exactly −inf.

Order with transformers' warpers (5.x, ``GenerationMixin._get_logits_processor``): built-in
processors (min-length, repetition penalty, ...) run first, then user ``logits_processor`` entries
(this one), then — only when ``do_sample=True`` — temperature, top-k, top-p, min-p, ... So guidance
is applied before temperature/top-k/top-p, and since warpers only rescale or set entries to −inf,
infeasible tokens stay at −inf.

Structure. Every constraint reaches the processor through one interface
(:mod:`ctrlg.guide.masks`): a regular token automaton A whose tables guide it, and the exact
next-token mask under the remaining budget, advanced token by token. ``__call__`` (i) infers the
prompt length and resets on a new ``generate`` call, (ii) updates the row states
(:class:`ctrlg.guide.row_state.RowStates`: A-states and priors as arrays, mask cursors where a
mask keeps one; each row's parent found without hashing prefixes; rows may be reordered or
duplicated by beam search and ``num_return_sequences``), (iii) calls the pure
:func:`ctrlg.guide.guidance.guided_log_probs` over A's tables, then (iv) restricts the rows whose
mask refines A's (canonical filter, grammar) to that mask, renormalised. Priors come from a
pluggable source (:mod:`ctrlg.guide.priors`; default the HMM's filtering posterior). Row i uses
constraint ``i // (B / len(constraints))`` (transformers expands each input row into consecutive
beams/samples). Rows that already emitted EOS (finished samples padded by transformers) are
passed through unchanged. Tables: :class:`ctrlg.guide.GuideTables` per distinct constraint, or
only :class:`ctrlg.guide.feasibility.Feasibility` in logical mode.

Vocabularies. The DFA and HMM have V tokens; ``scores`` may be wider only by the padding of the
LM's output layer (:mod:`ctrlg.validation`: at most ``MAX_PADDING`` columns here; :func:`generate`
also checks V against the tokenizer): the extra columns are set to −inf. Narrower or much wider
scores, and integer scores, raise. Tables are built for the DFA restricted to the states that an
accepted sequence of at most ``max_new_tokens`` tokens can visit
(:func:`ctrlg.dfa.ops.restrict_to_budget`), so a huge counter costs only what the budget reaches.

Modes: ``"ctrlg"`` (HMM guidance) or ``"logical"`` (guidance 1 on every feasible token: the
Outlines/guidance baseline; no HMM needed).

Insertion (Ctrl-G §5): ``suffix_ids`` must follow the generation; the guide's tables require the
HMM to emit them right after the generated middle (see :mod:`ctrlg.guide`), while the LM sees only
the prompt and the middle. :func:`generate` reranks candidates by log p_lm(middle ⊕ suffix | prompt);
without a suffix, beam search reads each beam's log p_lm as summed during the search
(:mod:`ctrlg.lm.beam_likelihood`) instead of running the LM over every beam a second time.

If the LM gives every feasible token probability 0 (e.g. −inf logits), the row falls back to the
guidance term alone (a uniform LM), so a feasible token is still chosen.

EOS: :func:`generate` uses :func:`ctrlg.vocab.eos_token_ids` (the tokenizer's EOS, then the
model's); a generation is accepted iff the DFA accepts its tokens up to and including the EOS that
ended it (or all n tokens when none did).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from transformers import LogitsProcessor

from ctrlg.lm.beam_likelihood import BeamLogLikelihoods, records_lm_log_probs
from ctrlg.lm.beam_scores import EntrySupport, latest_beam_scores, publish_support
from ctrlg.dfa.core import TokenDFA
from ctrlg.dfa.ops import restrict_to_budget
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError, VocabularyMismatchError
from ctrlg.guide.canonical_masks import restrict_to_mask
from ctrlg.guide.feasibility import Feasibility
from ctrlg.guide.beam_candidates import top_lookahead_scores
from ctrlg.dfa.lazy import LazyTokenDFA
from ctrlg.guide.guidance import apply_guidance, guided_log_probs, lookahead_scores
from ctrlg.guide.horizon import MAX_REGION_STATES, HorizonGuide, HorizonRows
from ctrlg.guide.masks import TokenMask, is_constraint, regular_automaton, token_mask
from ctrlg.guide.priors import HeadPrior, HMMFilterPrior
from ctrlg.guide.row_state import RowStates
from ctrlg.guide.tables import GuideTables, resolve_precision
from ctrlg.lm.shared_context import ContextCache, SharedContext, right_padded, shared_prompt_inputs
from ctrlg.memory import check_lm_fits, check_tables_fit
from ctrlg.validation import (MAX_PADDING, check_count, check_float_scores, check_generation,
                              check_seed, check_vocab_width)
from ctrlg.vocab import _as_id_list, eos_token_ids, lm_vocab_size

__all__ = ["ConstraintLogitsProcessor", "Generation", "generate", "rerank", "lm_log_likelihood",
           "candidate_log_likelihoods",
           "trim_at_eos", "eos_list"]

MODES = ("ctrlg", "logical")
BEAM_SCORES = ("guided", "lookahead")


def eos_list(eos_token_id) -> list[int]:
    """``None`` / an id / ids / a tensor of ids → a list of distinct ids, order kept."""
    return list(dict.fromkeys(_as_id_list(eos_token_id)))


class ConstraintLogitsProcessor(LogitsProcessor):
    """Ctrl-G guidance as a transformers LogitsProcessor (see module docstring).

    Args:
        hmm: a :class:`ctrlg.HMM` (``None`` only with ``mode="logical"``).
        constraint: one constraint for every row — a :class:`TokenDFA`, a
            :class:`~ctrlg.dfa.canonical_filter.CanonicalDFA` or a grammar constraint
            (``dfa.grammar``) — or a list with one per input row (old keyword ``dfa=``,
            deprecated).
        prompt_length: width of the (left-padded) prompt in ``input_ids``; ``None`` infers it from
            the first call of each generation.
        max_new_tokens: the budget n (must equal the ``max_new_tokens`` given to ``generate``).
        min_new_tokens: EOS is forbidden before this many tokens.
        eos_token_id: id or ids of EOS (terminal tokens); ``None``: generations are n tokens long.
        mode: ``"ctrlg"`` or ``"logical"``.
        suffix_ids: insertion suffix (token ids) the HMM must emit after the generation.
        use_kernel: use the Triton backward-table kernel (default: no, torch's step everywhere;
            torch's step was the faster one on an H200: benchmarks/results/gpu_nvidia-h200.md).
        progress: tqdm bar while building tables (default: only on a TTY).
        prior: the source of each row's prior over the HMM's hidden state (:mod:`ctrlg.guide.priors`);
            default the HMM's filtering posterior (:class:`ctrlg.guide.priors.HMMFilterPrior`); an
            LM-conditioned head: :class:`ctrlg.guide.priors.HeadPrior` (a source with ``current()``
            gives every row's prior afresh at each step).
        precision: ``"float32"``, ``"bfloat16"`` or ``"auto"`` (default: bfloat16 where the
            hardware computes it natively, :func:`ctrlg.guide.resolve_precision`) for the
            guide's matrix products — per token with the emission matrix, the tables' recurrence
            on the CPU and the filter's step p·A (float32 accumulation; see
            ``ctrlg.guide.PRECISIONS``): 2-4× faster on CPUs with AVX512-BF16/AMX, ≤ ~1-3%
            relative error on the guidance term; feasibility is exact either way. Pass
            ``"float32"`` for results that reproduce bit for bit across machines.
        strength: guidance strength w ≥ 0, p ∝ p_lm · p_hmm(α | x≤t, v)^w (:mod:`ctrlg.guide.guidance`;
            0 = logical masking, 1 = Ctrl-G); feasibility is exact for every w.
        beam_score: ``"guided"`` (default) returns the guided log-probabilities, so a beam's
            summed score telescopes to log p_lm(x≤t) + log p_hmm(α | x≤t) − log p_hmm(α) −
            Σ log ρ_s (:mod:`ctrlg.guide.guidance`); ``"lookahead"`` returns
            log p_lm(v | x≤t) + w · (log p_hmm(α | x≤t, v) − log p_hmm(α | x≤t)) (not
            normalised), so beams are ranked by log p_lm(x≤t) + w · log p_hmm(α | x≤t) and a
            finished accepted beam by log p_lm(x) (:func:`ctrlg.guide.guidance.lookahead_scores`;
            one more [R, h]·[h, V] product per step). Sampling draws from the same guided
            distribution either way.
        horizon: guide lazy automata (:class:`~ctrlg.dfa.lazy.LazyTokenDFA`, e.g.
            :func:`ctrlg.dfa.lazy_json_schema`) without tables over the budget: exact budget
            masks, and the HMM's estimate that the next ``horizon`` tokens stay within the
            constraint (:mod:`ctrlg.guide.horizon`; ``horizon ≥ max_new_tokens`` is Ctrl-G's
            exact quantity). Nothing is built before the first token. Every constraint must then
            be lazy; ``beam_score="guided"``, the HMM's filtering prior, ``min_new_tokens=0`` and
            no suffix (ConstraintError otherwise). None (default): tables over the budget.
        max_region_states: with ``horizon``, the states of one lookahead region at most (the
            horizon shrinks where more would be needed; default
            :data:`ctrlg.guide.horizon.MAX_REGION_STATES`).
        first_horizon: with ``horizon``, the first token's horizon (None: ``horizon``); a
            shorter one cuts the time to the first token
            (:class:`ctrlg.guide.horizon.HorizonGuide`).
        keep_top: beam search with ``beam_score="lookahead"`` only (ConstraintError
            otherwise), the processor being the last one: the number K of continuations the
            search keeps per input (transformers: max(2, 1 + #EOS) · num_beams; a larger K is
            safe). The returned scores are then exact only where an entry can be among the K
            picked — its row's K best, or, inside
            :func:`ctrlg.lm.beam_scores.record_beam_scores` (which also tells the exact K; one
            above ``keep_top`` is a ConstraintError), its input's K best running scores — and −inf
            elsewhere (:mod:`ctrlg.guide.beam_candidates`): the same beams and scores, without
            the [R, h]·[h, V] product on the rows that settle. After the first step the
            returned scores are written into the input ``scores`` (float32) when they can be,
            instead of a new [R, V] buffer: read the input before calling the processor if you
            need it after. Inside ``record_beam_scores`` with
            :func:`ctrlg.lm.beam_search.two_stage_topk`, the search then picks among the entries
            written alone (:func:`ctrlg.lm.beam_scores.publish_support`), so no later processor
            may turn an entry it left at −inf finite. Ignored for constraints whose exact mask
            refines their automaton (grammars, the canonical filter). None: every score.

    Raises UnsatisfiableConstraintError at construction when a DFA cannot be satisfied within
    ``max_new_tokens`` tokens, VocabularyMismatchError when the DFA and HMM vocabularies differ.

    Example::

        proc = ConstraintLogitsProcessor(hmm, constraint, max_new_tokens=32, eos_token_id=eos)
        model.generate(input_ids, logits_processor=[proc], max_new_tokens=32, do_sample=True)
    """

    def __init__(self, hmm, constraint: TokenDFA | Sequence[TokenDFA] | None = None,
                 prompt_length: int | None = None, max_new_tokens: int = 32,
                 min_new_tokens: int = 0, eos_token_id=None, mode: str = "ctrlg",
                 suffix_ids: Sequence[int] | None = None, use_kernel: bool | None = None,
                 progress: bool | None = None, prior=None, precision: str = "auto",
                 strength: float = 1.0, beam_score: str = "guided", keep_top: int | None = None,
                 horizon: int | None = None, max_region_states: int = MAX_REGION_STATES,
                 first_horizon: int | None = None, **old_names):
        constraint = _renamed(old_names, "dfa", "constraint", constraint, "ConstraintLogitsProcessor")
        if constraint is None:
            raise ConstraintError("ConstraintLogitsProcessor needs a constraint (a TokenDFA or a "
                                  "list with one per input row)")
        if mode not in MODES:
            raise ConstraintError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "ctrlg" and hmm is None:
            raise ConstraintError("mode='ctrlg' needs an HMM (use mode='logical' for feasibility only)")
        self.dfas = _check_dfas(constraint, hmm if mode == "ctrlg" else None)
        if prompt_length is not None and int(prompt_length) < 0:
            raise ConstraintError(f"prompt_length must be ≥ 0, got {prompt_length}")
        self.strength = check_strength(strength)
        if beam_score not in BEAM_SCORES:
            raise ConstraintError(f"beam_score must be one of {BEAM_SCORES}, got {beam_score!r}")
        self.beam_score = beam_score
        self.keep_top = None if keep_top is None else check_count("keep_top", keep_top, minimum=1)
        if keep_top is not None and beam_score != "lookahead":
            raise ConstraintError(f"keep_top needs beam_score='lookahead' (the guided scores are "
                                  f"normalised over every token), got beam_score={beam_score!r}")
        self.hmm = hmm if mode == "ctrlg" else None
        self.mode = mode
        self.vocab_size = self.dfas[0].vocab_size
        self.max_new_tokens = check_count("max_new_tokens", max_new_tokens, minimum=1)
        self.min_new_tokens = check_count("min_new_tokens", min_new_tokens)
        if self.min_new_tokens > self.max_new_tokens:
            raise ConstraintError(f"min_new_tokens={self.min_new_tokens} exceeds "
                                  f"max_new_tokens={self.max_new_tokens}")
        self.eos_ids = eos_list(eos_token_id)
        _check_hmm_eos(self.hmm, self.eos_ids)
        self.suffix_ids = None if suffix_ids is None else [int(t) for t in suffix_ids]
        self._fixed_prompt_length = None if prompt_length is None else int(prompt_length)
        self.prompt_length = self._fixed_prompt_length
        resolve_precision(precision)      # a bad value is an error in logical mode too
        self.horizon_rows = None
        if first_horizon is not None and horizon is None:
            raise ConstraintError("first_horizon needs horizon= (the lazy guide); the tables over "
                                  "the budget look ahead to its end")
        if horizon is not None:
            self._build_horizon_guides(horizon, prior, precision, max_region_states, first_horizon)
            return
        self.tables, self._table_of_dfa = self._build_tables(use_kernel, progress, precision)
        if self.hmm is not None and prior is None:
            prior = HMMFilterPrior(self.hmm, emission_t=self.tables[0]._emission_t,
                                   precision=self.tables[0].precision)
        self.prior = prior if self.hmm is not None else None
        self.rows = RowStates([t.dfa for t in self.tables], self.prior, self.masks)
        self.reset()

    def _build_tables(self, use_kernel, progress, precision) -> tuple[list[Feasibility], np.ndarray]:
        """One table and one mask provider (:mod:`ctrlg.guide.masks`) per distinct constraint
        object (rows that share a constraint share them); the table is built over the
        constraint's regular automaton A, restricted to the budget."""
        tables: list[Feasibility] = []
        built: dict[int, int] = {}
        table_of_dfa = []
        self.masks: list[TokenMask] = []
        for original in self.dfas:
            if id(original) not in built:
                d = _within_budget(regular_automaton(original, self.max_new_tokens),
                                   self.max_new_tokens)
                check_tables_fit(d.num_states, None if self.hmm is None else self.hmm.hidden_size,
                                 self.max_new_tokens,
                                 "cpu" if self.hmm is None else self.hmm.emission.device)
                if self.hmm is None and self.suffix_ids is None:
                    t = Feasibility(d, self.max_new_tokens, min_new_tokens=self.min_new_tokens,
                                    eos_token_id=self.eos_ids or None)
                else:
                    t = GuideTables(d, self.hmm, self.max_new_tokens, min_new_tokens=self.min_new_tokens,
                                    eos_token_id=self.eos_ids or None, suffix_ids=self.suffix_ids,
                                    use_kernel=use_kernel, progress=progress, precision=precision)
                mask = token_mask(original, t)
                mask.check_satisfiable()
                self.masks.append(mask)
                built[id(original)] = len(tables)
                tables.append(t)
            table_of_dfa.append(built[id(original)])
        return tables, np.asarray(table_of_dfa, dtype=np.int64)

    def _build_horizon_guides(self, horizon, prior, precision, max_region_states,
                              first_horizon=None) -> None:
        """One :class:`~ctrlg.guide.horizon.HorizonGuide` per distinct lazy constraint."""
        horizon = check_count("horizon", horizon, minimum=1)
        if first_horizon is not None:
            first_horizon = check_count("first_horizon", first_horizon, minimum=1)
        for i, d in enumerate(self.dfas):
            if not isinstance(d, LazyTokenDFA):
                raise ConstraintError(f"horizon= guides lazy automata (dfa.lazy_regex, "
                                      f"dfa.lazy_json_schema); constraint {i} is a {type(d).__name__}")
        unsupported = [name for name, bad in (
            ("suffix_ids", self.suffix_ids is not None), ("min_new_tokens > 0", self.min_new_tokens > 0),
            ("a custom prior", prior is not None), ("keep_top", self.keep_top is not None),
            ("beam_score='lookahead'", self.beam_score != "guided")) if bad]
        if unsupported:
            raise ConstraintError(f"horizon= does not support {', '.join(unsupported)}; leave "
                                  f"horizon=None for tables over the budget")
        guides, built, of_dfa = [], {}, []
        for d in self.dfas:
            if id(d) not in built:
                built[id(d)] = len(guides)
                guides.append(HorizonGuide(d, self.hmm, self.max_new_tokens, horizon=horizon,
                                           precision=precision,
                                           max_region_states=max_region_states,
                                           first_horizon=first_horizon))
            of_dfa.append(built[id(d)])
        self.tables, self._table_of_dfa = guides, np.asarray(of_dfa, dtype=np.int64)
        self.horizon_rows = HorizonRows(guides)
        self.prior = None
        self.reset()

    def _horizon_call(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """``__call__`` with lazy guides: exact masks and horizon estimates per row
        (:class:`~ctrlg.guide.horizon.HorizonRows`), combined with the LM as everywhere else
        (:func:`~ctrlg.guide.guidance.apply_guidance`)."""
        B = input_ids.shape[0]
        self._check_shapes(input_ids, scores)
        generated = self._generated(input_ids)
        finished = self._finished(generated)
        if bool(finished.all()):
            return scores
        remaining = self._remaining(generated)
        active = np.flatnonzero(~finished.numpy())
        every = len(active) == B
        guide_of_row = self._table_of_dfa[np.arange(B) // (B // len(self.dfas))][active]
        use_hmm = self.hmm is not None and self.strength != 0
        ratio = self.horizon_rows.log_ratios(generated[torch.as_tensor(active)], guide_of_row,
                                             remaining, use_hmm=use_hmm)
        active_t = None if every else torch.as_tensor(active, device=scores.device)
        lm = scores[:, :self.vocab_size] if every else scores[active_t, :self.vocab_size]
        guided = apply_guidance(lm, ratio.to(lm.device), self.strength if self.hmm is not None else 1.0)
        return self._write(scores, guided, active_t)

    def reset(self) -> None:
        """Forget the row states (a new ``generate`` call starts)."""
        if self.horizon_rows is not None:
            self.horizon_rows.reset()
        else:
            self.rows.reset()
            self._scored = None    # the kept path's entries of the last call (_kept_lookahead)
        self._last_width = -1
        self.prompt_length = self._fixed_prompt_length

    # ------------------------------------------------------------------ the protocol
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.horizon_rows is not None:
            return self._horizon_call(input_ids, scores)
        B = input_ids.shape[0]
        self._check_shapes(input_ids, scores)
        generated = self._generated(input_ids)
        scored, self._scored = self._scored, None      # only a kept-path call leaves its entries
        self._support = None                           # and its written entries (_kept_lookahead)
        table_of_row = self._table_of_dfa[np.arange(B) // (B // len(self.dfas))]
        finished = self._finished(generated)
        safe = generated.masked_fill(finished[:, None], 0) if bool(finished.any()) else generated
        states, priors = self.rows.update(safe, torch.as_tensor(table_of_row))
        if bool(finished.all()):
            return scores
        if priors is not None and hasattr(self.prior, "current"):
            priors = self.prior.current(generated)  # per-step priors, in input_ids' row order
        remaining = self._remaining(generated)
        active = np.flatnonzero(~finished.numpy())
        every = len(active) == B
        if not every:
            states, table_of_row = states[active], table_of_row[active]
            priors = None if priors is None else priors[torch.as_tensor(active, device=priors.device)]
        active_t = None if every else torch.as_tensor(active, device=scores.device)
        lm = scores[:, :self.vocab_size] if every else scores[active_t, :self.vocab_size]
        if self.hmm is None or self.strength == 0:   # w = 0 is logical masking: no HMM products
            priors = None
        if self.beam_score == "lookahead" and priors is not None:
            if self.keep_top is not None and self.rows.cursors is None:
                guided = self._kept_lookahead(lm, table_of_row, states, priors, remaining,
                                              input_ids, generated.shape[1], active, scored,
                                              width=scores.shape[1])
            else:
                guided = lookahead_scores(lm, self.tables, table_of_row, states, priors, remaining,
                                          self.strength, first=generated.shape[1] == 0)
        else:
            guided = guided_log_probs(lm, self.tables, table_of_row, states, priors, remaining,
                                      self.strength if priors is not None else 1.0)
        if self.rows.cursors is not None:
            cursors = self.rows.cursors if every else [self.rows.cursors[i] for i in active]
            guided = self._exact_rows(guided, cursors, table_of_row, states, remaining)
        out = self._write(scores, guided, active_t)
        if self.keep_top is not None:      # finished rows keep their scores: no support then
            keys = self._support if every else None
            publish_support(None if keys is None else
                            EntrySupport(generated.shape[1], B, scores.shape[1], keys))
        return out

    def _kept_lookahead(self, lm: torch.Tensor, table_of_row: np.ndarray, states: np.ndarray,
                        priors: torch.Tensor, remaining: int, input_ids: torch.Tensor,
                        length: int, active: np.ndarray, scored=None, width: int | None = None
                        ) -> torch.Tensor:
        """Lookahead scores on the entries a beam search keeping :attr:`keep_top` continuations
        can pick (:func:`ctrlg.guide.beam_candidates.top_lookahead_scores`), with the search's
        running scores when :func:`ctrlg.lm.beam_scores.record_beam_scores` recorded this very
        step of a search over these rows (the same token ids). At the first step the rows of an
        input are copies (transformers repeats each input once per beam): each distinct row is
        scored once. From the second step on, a row's log p_hmm(α | x≤t) is its parent's exact
        entry for the row's last token, kept from the previous call (``scored``), where there is
        one. Records the entries it writes (keys row · ``width`` + token, ``width`` the input
        scores' width) in ``_support`` for :func:`ctrlg.lm.beam_scores.publish_support`; None
        at the first step and where a row fell back to its full scores. Raises ConstraintError
        when the record shows that the search keeps more than ``keep_top`` continuations (the
        first step's scores may then have missed some)."""
        first = length == 0
        record = latest_beam_scores()
        running = groups = None
        keep = self.keep_top
        if not first and record is not None and record.steps == length and \
                record.describes(input_ids):
            if record.keep > self.keep_top:
                raise ConstraintError(
                    f"keep_top={self.keep_top} but the beam search keeps {record.keep} continuations "
                    f"per input (max(2, 1 + #EOS) · num_beams): pass keep_top ≥ {record.keep}")
            keep = record.keep
            running = record.running[torch.as_tensor(active)].to(lm.device)
            groups = active // record.beams

        def full(rows):
            rows_t = torch.as_tensor(rows, device=lm.device)
            return lookahead_scores(lm[rows_t], self.tables, table_of_row[rows], states[rows],
                                    priors[rows_t.to(priors.device)], remaining, self.strength,
                                    first=first)

        if not first:   # the result overwrites ``lm`` where it can (keep_top's docstring)
            reuse = lm.dtype == torch.float32 and lm.is_contiguous()
            known = self._parents_entries(scored, active, input_ids[:, -1].cpu().numpy(),
                                          lm.shape[1])

            def remember(rows, tokens, log_ratios):      # keyed by (row of this call, token)
                keys = active[rows] * lm.shape[1] + tokens
                order = np.argsort(keys)
                self._scored = keys[order], log_ratios[order]

            full_width = lm.shape[1] if width is None else width

            def written(rows, tokens):     # keyed by (row, token) over the input's full width
                self._support = None if rows is None else np.sort(active[rows] * full_width + tokens)

            return top_lookahead_scores(lm, self.tables, table_of_row, states, priors, remaining,
                                        self.strength, first, keep, running, groups, full,
                                        out=lm if reuse else None, known_prev=known,
                                        on_scored=remember, on_support=written)
        copy = _copies_of_previous(lm, table_of_row, states, priors)
        distinct = np.flatnonzero(~copy)
        source = np.cumsum(~copy) - 1                     # each row's distinct original
        rows_t = torch.as_tensor(distinct, device=lm.device)
        out = top_lookahead_scores(lm[rows_t], self.tables, table_of_row[distinct],
                                   states[distinct], priors[rows_t.to(priors.device)], remaining,
                                   self.strength, first, keep,
                                   full=lambda rows: full(distinct[rows]))
        return out[torch.as_tensor(source, device=lm.device)]

    def _parents_entries(self, scored, active: np.ndarray, last_tokens: np.ndarray, V: int
                         ) -> np.ndarray | None:
        """log p_hmm(α | x≤t) of the ``active`` rows whose parent's entry for their last token
        was scored exactly at the previous call (``scored``: its sorted keys row · V + token and
        their log ratios; NaN for the other rows), or None."""
        parents = self.rows.parents
        if scored is None or parents is None or not len(scored[0]):
            return None
        keys, log_ratios = scored
        parent = parents[active]
        want = parent * V + last_tokens[active]
        at = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
        hit = (parent >= 0) & (keys[at] == want)
        out = np.full(len(active), np.nan)
        out[hit] = log_ratios[at[hit]]
        return out

    def _exact_rows(self, guided: torch.Tensor, cursors: list, table_of_row: np.ndarray,
                    states: np.ndarray, remaining: int) -> torch.Tensor:
        """Rows whose mask refines their automaton's (:attr:`TokenMask.refines`) keep only the
        tokens of that exact mask, renormalised (``beam_score="lookahead"``: only masked)."""
        for i, k in enumerate(table_of_row.tolist()):
            mask = self.masks[k]
            if mask.refines:
                allowed = torch.from_numpy(mask.allowed(cursors[i], int(states[i]), remaining))
                if self.beam_score == "lookahead" and self.hmm is not None:
                    guided[i] = guided[i].masked_fill(~allowed.to(guided.device), -math.inf)
                else:
                    guided[i] = restrict_to_mask(guided[i], allowed.to(guided.device))
        return guided

    # ------------------------------------------------------------------ __call__'s steps
    def _remaining(self, generated: torch.Tensor) -> int:
        """Tokens left, this one included; ConstraintError past the budget."""
        remaining = self.max_new_tokens - generated.shape[1]
        if remaining < 1:
            raise ConstraintError(
                f"generation reached token {generated.shape[1] + 1} but the processor was built for "
                f"max_new_tokens={self.max_new_tokens}; pass the same max_new_tokens to generate")
        return remaining

    def _check_shapes(self, input_ids: torch.Tensor, scores: torch.Tensor) -> None:
        B, V, k = input_ids.shape[0], self.vocab_size, len(self.dfas)
        check_float_scores(scores)
        if scores.shape[1] < V:
            raise VocabularyMismatchError(
                f"the LM scores have {scores.shape[1]} columns but the constraint's vocabulary has "
                f"{V} tokens")
        if scores.shape[1] - V > MAX_PADDING:
            check_vocab_width(V, scores.shape[1])
        if scores.shape[0] != B:
            raise ConstraintError(f"scores have {scores.shape[0]} rows but input_ids has {B}")
        if B % k:
            raise ConstraintError(
                f"the batch has {B} rows (inputs × beams/samples), which is not a multiple of the "
                f"number of DFAs ({k}); give one DFA per input row")

    def _generated(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The generated part ``input_ids[:, P:]`` (CPU); infers P on a generation's first call
        and resets the row states when a new generation starts (``input_ids`` got narrower)."""
        T = input_ids.shape[1]
        if T <= self._last_width or (self._fixed_prompt_length is None and self.prompt_length is None):
            self.reset()
            if self._fixed_prompt_length is None:
                self.prompt_length = T
        self._last_width = T
        P = self.prompt_length
        if T < P:
            raise ConstraintError(f"input_ids has {T} columns, fewer than prompt_length={P}")
        if T == P and len(self.dfas) > 1:
            _check_rows_match_dfas(input_ids, input_ids.shape[0] // len(self.dfas))
        return input_ids[:, P:].to("cpu", torch.long)

    def _finished(self, generated: torch.Tensor) -> torch.Tensor:
        """Bool [B]: rows that already emitted EOS (transformers pads them; passed through)."""
        if not self.eos_ids or generated.shape[1] == 0:
            return torch.zeros(generated.shape[0], dtype=torch.bool)
        return torch.isin(generated, torch.tensor(self.eos_ids)).any(1)

    def _write(self, scores: torch.Tensor, guided: torch.Tensor, active: torch.Tensor | None):
        """Scores with the active rows replaced by ``guided`` and padded columns set to −inf."""
        V = self.vocab_size
        if active is None and scores.shape[1] == V:
            return guided.to(scores.dtype)
        out = scores.clone()
        rows = slice(None) if active is None else active
        out[rows, :V] = guided.to(out.dtype)
        out[rows, V:] = -math.inf
        return out


def _copies_of_previous(lm: torch.Tensor, table_of_row: np.ndarray, states: np.ndarray,
                        priors: torch.Tensor) -> np.ndarray:
    """Bool [R]: row i has the same table, state, prior and LM scores as row i − 1."""
    same = np.zeros(len(states), dtype=bool)
    if len(states) > 1:
        equal = (lm[1:] == lm[:-1]).all(1) & (priors[1:] == priors[:-1]).all(1).to(lm.device)
        same[1:] = equal.cpu().numpy() & (table_of_row[1:] == table_of_row[:-1]) & \
            (states[1:] == states[:-1])
    return same


def _renamed(old_names: dict, old: str, new: str, value, where: str):
    """``value``, or the deprecated keyword ``old`` of ``where`` (DeprecationWarning)."""
    unknown = set(old_names) - {old}
    if unknown:
        raise TypeError(f"{where}() got unexpected keyword argument(s) {sorted(unknown)}")
    if old in old_names:
        warnings.warn(f"{where}({old}=...) is deprecated; use {new}=", DeprecationWarning,
                      stacklevel=3)
        if value is None:
            return old_names[old]
    return value


#: the largest guidance strength w: the guided log-scores are w · log p_hmm(α | ·) in float32,
#: whose ratios span at most ~10^2 nats, so a larger w gives the same argmax-like masks
#: (and w near 3.4e38 overflowed float32)
MAX_STRENGTH = 1e6


def check_strength(strength) -> float:
    """The guidance strength w as a float, or ConstraintError unless it is a finite number in
    [0, :data:`MAX_STRENGTH`]."""
    try:
        value = float(strength)
    except (TypeError, ValueError, OverflowError):
        raise ConstraintError(f"strength must be a number ≥ 0, got {strength!r}") from None
    if not math.isfinite(value) or not 0 <= value <= MAX_STRENGTH:
        raise ConstraintError(f"strength must be a finite number in [0, {MAX_STRENGTH:g}] (0 = "
                              f"logical masking, 1 = Ctrl-G), got {strength!r}")
    return value


def _check_hmm_eos(hmm, eos_ids: list[int]) -> None:
    """VocabularyMismatchError when the HMM's EOS-padding state emits a token that is not one of
    the generation's EOS ids: the HMM learnt where sentences end from samples padded with another
    token (e.g. an LM whose tokenizer conversion named another EOS), so its lookahead would
    score the end of every sentence wrongly."""
    config = getattr(hmm, "config", None) or {}
    pad_eos = config.get("eos_token_id") if config.get("eos_pad_state") is not None else None
    if pad_eos is not None and eos_ids and int(pad_eos) not in eos_ids:
        raise VocabularyMismatchError(
            f"the HMM's EOS-padding state emits token {pad_eos} (the EOS of the samples it was "
            f"distilled from) but this generation ends on EOS ids {eos_ids}; use an HMM distilled "
            f"with this tokenizer's EOS, or pass its EOS id as eos_token_id")


def _check_dfas(dfa, hmm) -> list:
    dfas = [dfa] if is_constraint(dfa) else list(dfa)
    if not dfas:
        raise ConstraintError("dfa must be a TokenDFA or a non-empty list of TokenDFAs")
    for i, d in enumerate(dfas):
        if not is_constraint(d):
            raise ConstraintError(f"dfa[{i}] is a {type(d).__name__}, not a TokenDFA")
        if d.vocab_size != dfas[0].vocab_size:
            raise VocabularyMismatchError(
                f"dfa[{i}] has vocabulary size {d.vocab_size} but dfa[0] has {dfas[0].vocab_size}")
        if hmm is not None and d.vocab_size != hmm.vocab_size:
            raise VocabularyMismatchError(
                f"dfa[{i}] has vocabulary size {d.vocab_size} but the HMM has {hmm.vocab_size}")
    return dfas


def _check_rows_match_dfas(prompts: torch.Tensor, per_dfa: int) -> None:
    """transformers expands each input into ``per_dfa`` consecutive identical rows; rows that
    share a DFA but differ reveal a batch whose size does not match the number of DFAs."""
    for lo in range(0, prompts.shape[0], per_dfa):
        for i in range(lo + 1, lo + per_dfa):
            if not torch.equal(prompts[lo], prompts[i]):
                raise ConstraintError(
                    f"rows {lo} and {i} share DFA {lo // per_dfa} but have different prompts: "
                    f"the number of DFAs ({prompts.shape[0] // per_dfa}) does not match the "
                    f"number of input rows; give one DFA per input row")


# ---------------------------------------------------------------------- helpers
@dataclass
class Generation:
    """One accepted output: decoded text, generated token ids (EOS included if it ended the
    generation) and its LM log-likelihood log p_lm(ids [+ suffix] | prompt)."""

    text: str
    token_ids: list[int]
    lm_log_likelihood: float = float("nan")
    extra: dict = field(default_factory=dict)


@torch.no_grad()
def lm_log_likelihood(model, prompt_ids: Sequence[int], candidates: Sequence[Sequence[int]],
                      batch_size: int = 16, contexts: ContextCache | None = None) -> list[float]:
    """log p_lm(candidate | prompt) for each candidate (sum of token log-probabilities). The prompt
    is encoded once and its cache shared by the candidates (:mod:`ctrlg.lm.shared_context`; models
    without a reusable cache re-encode prompt + candidate per row). With ``contexts`` (a
    :class:`ctrlg.lm.shared_context.ContextCache`) the prompt but its last token is looked up there
    (the context that sampling after the same prompt encoded) and that token runs before each
    candidate."""
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ConstraintError("lm_log_likelihood needs a non-empty prompt (at least a BOS token)")
    chunks = [[list(map(int, c)) for c in candidates[lo:lo + batch_size]]
              for lo in range(0, len(candidates), batch_size)]
    if not chunks:
        return []
    lead = None
    if contexts is not None and len(prompt) > 1:
        context, lead = contexts.get(model, prompt[:-1]), prompt[-1]
    else:
        context = SharedContext(model, prompt)
    scores: list[float] = []
    for chunk in chunks:
        scores.extend(_continuation_log_likelihoods(context, chunk, lead))
    return scores


def _continuation_log_likelihoods(context: SharedContext, chunk: list[list[int]],
                                  lead: int | None = None) -> list[float]:
    """Σ_j log p_lm(c_j | context [+ lead], c_<j) for each candidate c of ``chunk`` (0 for an
    empty one); ``lead``: a token that follows the context before every candidate."""
    scores = [0.0] * len(chunk)
    rows = [i for i, c in enumerate(chunk) if c]
    if not rows:
        return scores
    ids, mask, lengths = right_padded([([] if lead is None else [lead]) + chunk[i] for i in rows])
    # the first token's log-probability: the context's own next-token distribution, or (after a
    # lead token) the first scored position of the forward below
    first = context.next_log_probs[ids[:, 0]] if lead is None else torch.zeros(len(rows))
    later = torch.zeros(len(rows), 0)
    if max(lengths) > 1:
        logits = context.continuation_logits(ids[:, :-1], mask[:, :-1]).float().cpu()
        later = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0] * mask[:, 1:]
    for r, i in enumerate(rows):
        scores[i] = float(first[r]) + float(later[r].sum())
    return scores


def candidate_log_likelihoods(model, prompt_ids: Sequence[int], candidates: Sequence[Sequence[int]],
                              recorder: BeamLogLikelihoods | None = None, item: int = 0,
                              contexts: ContextCache | None = None) -> list[float]:
    """log p_lm(candidate | prompt) of each candidate: as summed during beam search by ``recorder``
    (input row ``item`` of its ``generate`` call) where it has it, else — and for every candidate
    without a recorder — by one second pass over the rest (:func:`lm_log_likelihood`)."""
    scores = [None if recorder is None else recorder.log_likelihood(item, c) for c in candidates]
    missing = [i for i, value in enumerate(scores) if value is None]
    if missing:
        passed = lm_log_likelihood(model, prompt_ids, [candidates[i] for i in missing],
                                   contexts=contexts)
        for i, value in zip(missing, passed):
            scores[i] = value
    return scores


def rerank(model, prompt_ids: Sequence[int], candidates: Sequence[Sequence[int]],
           suffix_ids: Sequence[int] | None = None) -> list[tuple[float, list[int]]]:
    """Candidates sorted by LM log-likelihood, best first: ``[(log p_lm, candidate), ...]``.
    With ``suffix_ids`` the score is log p_lm(candidate ⊕ suffix | prompt) (Ctrl-G §5)."""
    suffix = [int(t) for t in suffix_ids] if suffix_ids else []
    scores = lm_log_likelihood(model, prompt_ids, [list(c) + suffix for c in candidates])
    order = sorted(range(len(candidates)), key=lambda i: -scores[i])
    return [(scores[i], list(candidates[i])) for i in order]


def generate(model, tokenizer, prompt, constraint: TokenDFA, *, hmm=None, max_new_tokens: int = 32,
             min_new_tokens: int = 0, num_samples: int = 8, seed: int = 0, rank_by_lm: bool = True,
             mode: str = "ctrlg", suffix=None, num_beams: int = 1, do_sample: bool | None = None,
             eos_token_id=None, prior_head="auto", strength: float = 1.0, precision: str = "auto",
             contexts: ContextCache | None = None, horizon: int | None = None,
             max_region_states: int = MAX_REGION_STATES, first_horizon: int | None = None,
             **generate_kwargs) -> list[Generation]:
    """Generate with Ctrl-G guidance and return the accepted outputs (distinct token sequences),
    best LM log-likelihood first when ``rank_by_lm`` (else in generation order; the old keyword
    ``rerank=`` still works, deprecated: it shadowed :func:`rerank`).

    ``prompt``: a string (tokenised with ``tokenizer``; a string that already starts with one of
    the tokenizer's special tokens, e.g. a chat-templated prompt, is tokenised without adding
    special tokens again) or token ids. ``constraint``: a TokenDFA over the LM's token ids (or a
    CanonicalDFA, or a grammar constraint from ``dfa.grammar``).
    ``suffix``: text or ids that must follow (insertion). ``eos_token_id`` defaults to
    :func:`ctrlg.vocab.eos_token_ids` (the tokenizer's, then the model's). Sampling draws
    ``num_samples`` outputs (``do_sample`` defaults to ``num_beams == 1``); beam search returns
    ``num_samples`` beams of ``max(num_beams, num_samples)``. Extra keyword arguments go to
    ``model.generate`` (temperature, top_k, top_p, ...), whose warpers run after the guidance.
    ``seed`` seeds a fork of torch's RNG: the caller's global RNG state is left unchanged.
    ``prior_head``: a :class:`ctrlg.hmm.prior_head.PriorHead` reading the LM's features
    (:class:`ctrlg.guide.priors.HeadPrior`), ``None`` for the HMM's filtering prior, or ``"auto"`` (the
    head saved with the HMM, ``hmm.prior_head``, when it has one). ``strength``: guidance
    strength w (p_lm · p_hmm(α | ·)^w). ``precision``: of the guidance products
    (:class:`ConstraintLogitsProcessor`). ``contexts``: a
    :class:`ctrlg.lm.shared_context.ContextCache` where the prompt's encoding is looked up and kept
    (sampling and the rerank then share it, and so do later calls with the same prompt).
    ``horizon``: guide a lazy constraint (``dfa.lazy_json_schema``, ``dfa.lazy_regex``) without
    tables over the budget (:class:`ConstraintLogitsProcessor`, with ``max_region_states`` and
    ``first_horizon``; the HMM's filtering prior is used, ``prior_head`` is ignored).
    """
    if "rerank" in generate_kwargs:
        rank_by_lm = bool(_renamed({"rerank": generate_kwargs.pop("rerank")}, "rerank",
                                   "rank_by_lm", None, "generate"))
    if mode == "ctrlg" and hmm is None:
        raise ConstraintError("generate(mode='ctrlg') needs hmm=...; use mode='logical' without one")
    if not is_constraint(constraint):
        raise ConstraintError(
            f"the constraint must be one TokenDFA, got {type(constraint).__name__}; combine several "
            "with dfa.intersect / dfa.union, or give one per input row to ConstraintLogitsProcessor")
    check_count("num_samples", num_samples, minimum=1)
    check_count("num_beams", num_beams, minimum=1)
    check_count("max_new_tokens", max_new_tokens, minimum=1)
    check_seed(seed)
    if check_count("min_new_tokens", min_new_tokens) > max_new_tokens:
        raise ConstraintError(f"min_new_tokens={min_new_tokens} exceeds max_new_tokens={max_new_tokens}")
    _check_vocab_fits(model, tokenizer, hmm, constraint)
    prompt_ids = _prompt_ids(tokenizer, prompt)
    suffix_ids = None
    if suffix is not None:
        suffix_ids = tokenizer(suffix, add_special_tokens=False).input_ids if isinstance(suffix, str) \
            else [int(t) for t in suffix]
    eos_ids = eos_list(eos_token_id) if eos_token_id is not None else eos_token_ids(tokenizer, model)
    check_generation(model, prompt_ids, suffix_ids, max_new_tokens, generate_kwargs,
                     do_sample=num_beams == 1 if do_sample is None else do_sample,
                     num_beams=num_beams, num_samples=num_samples)
    _check_memory(model, len(prompt_ids), len(suffix_ids or []), max_new_tokens, num_samples,
                  num_beams, rank_by_lm)
    if isinstance(prior_head, str) and prior_head == "auto":
        prior_head = getattr(hmm, "prior_head", None) if horizon is None else None
    head_prior = (HeadPrior(prior_head, model, hidden_size=hmm.hidden_size)
                  if prior_head is not None and mode == "ctrlg" else None)
    try:
        proc = ConstraintLogitsProcessor(hmm, constraint, prompt_length=len(prompt_ids),
                                         max_new_tokens=max_new_tokens,
                                         min_new_tokens=min_new_tokens, eos_token_id=eos_ids or None,
                                         mode=mode, suffix_ids=suffix_ids, prior=head_prior,
                                         strength=strength, precision=precision, horizon=horizon,
                                         max_region_states=max_region_states,
                                         first_horizon=first_horizon)
        recorder = None
        if rank_by_lm and suffix_ids is None and records_lm_log_probs(
                model.generation_config, dict(generate_kwargs, num_beams=num_beams,
                                              do_sample=bool(do_sample))):
            recorder = BeamLogLikelihoods(len(prompt_ids), 1, eos_ids)
        processors = [proc] if recorder is None else [recorder, proc]
        output = _generate(model, processors, prompt_ids, eos_ids, max_new_tokens, min_new_tokens,
                           num_samples, num_beams, do_sample, seed, generate_kwargs, contexts)
    finally:
        if head_prior is not None:
            head_prior.remove()
    results = _accepted(output[:, len(prompt_ids):].tolist(), constraint, eos_ids, max_new_tokens,
                        tokenizer)
    if rank_by_lm and results:
        _rerank_in_place(model, prompt_ids, results, set(eos_ids), suffix_ids, recorder, contexts)
    return results


def _check_memory(model, prompt_length: int, suffix_length: int, max_new_tokens: int,
                  num_samples: int, num_beams: int, rank_by_lm: bool) -> None:
    """Refuse a request whose LM working set would not fit in memory (:mod:`ctrlg.memory`); the
    guide tables are checked when they are built."""
    rows = max(num_beams, num_samples)     # sequences decoded together (_generate)
    check_lm_fits(model, rows=rows, prompt_length=prompt_length, max_new_tokens=max_new_tokens,
                  vocab_size=lm_vocab_size(model), scored_rows=num_samples if rank_by_lm else 0,
                  suffix_length=suffix_length,
                  what=f"generate(num_samples={num_samples}, num_beams={num_beams}, "
                       f"max_new_tokens={max_new_tokens}) with a {prompt_length}-token prompt",
                  advice="ask for fewer samples or beams, fewer new tokens or a shorter prompt")


def _generate(model, processors, prompt_ids, eos_ids, max_new_tokens, min_new_tokens, num_samples,
              num_beams, do_sample, seed, generate_kwargs, contexts=None) -> torch.Tensor:
    """``model.generate`` with the processors, seeded on a fork of torch's RNG."""
    if do_sample is None:
        do_sample = num_beams == 1
    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt_ids], device=device)
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = eos_ids[0] if eos_ids else 0
    kwargs = dict(max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, do_sample=do_sample,
                  num_return_sequences=num_samples, logits_processor=list(processors),
                  attention_mask=torch.ones_like(input_ids), pad_token_id=pad,
                  eos_token_id=eos_ids or None)
    if num_beams > 1:
        kwargs["num_beams"] = max(num_beams, num_samples)
    elif not {"num_return_sequences", "past_key_values", "cache"} & set(generate_kwargs):
        # the prompt encoded once, its cache shared by the samples (ctrlg.lm.shared_context):
        # transformers would repeat it once per returned sequence and encode every copy
        shared = shared_prompt_inputs(model, prompt_ids, num_samples, contexts)
        if shared is not None:
            input_ids = shared.pop("input_ids")
            kwargs.update(shared)
    kwargs.update(generate_kwargs)
    # transformers samples from torch's global generator: seed a fork of it, restored on exit
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(seed))
        return model.generate(input_ids, **kwargs)


def _check_vocab_fits(model, tokenizer, hmm, constraint: TokenDFA) -> None:
    """The DFA's (and HMM's) vocabulary against the LM's width and the tokenizer's size (the rule
    of :func:`ctrlg.validation.check_vocab_width`)."""
    width = lm_vocab_size(model)
    size = len(tokenizer) if tokenizer is not None and hasattr(tokenizer, "__len__") else None
    if hmm is not None:
        check_vocab_width(hmm.vocab_size, width, tokenizer_size=size, what="HMM")
    check_vocab_width(constraint.vocab_size, width, tokenizer_size=size, what="DFA")


def _within_budget(dfa: TokenDFA, max_new_tokens: int) -> TokenDFA:
    """``dfa`` restricted to the states a ≤ ``max_new_tokens``-token accepted sequence visits (the
    same verdict on every generation); unchanged when nothing fits, so that the table's own
    satisfiability check reports it."""
    try:
        return restrict_to_budget(dfa, max_new_tokens)
    except UnsatisfiableConstraintError:
        return dfa


def _prompt_ids(tokenizer, prompt) -> list[int]:
    """Token ids of the prompt; special tokens are added only to a string that has none yet."""
    if isinstance(prompt, str):
        specials = [t for t in (getattr(tokenizer, "all_special_tokens", None) or []) if t]
        templated = any(prompt.startswith(t) for t in specials)
        prompt_ids = list(tokenizer(prompt, add_special_tokens=not templated).input_ids)
    else:
        prompt_ids = [int(t) for t in prompt]
    if not prompt_ids:
        raise ConstraintError("the prompt is empty; give at least a BOS token")
    return prompt_ids


def trim_at_eos(ids: Sequence[int], eos_ids) -> list[int]:
    """``ids`` up to and including the first EOS (all of ``ids`` when none)."""
    eos = set(eos_ids)
    out = []
    for tok in ids:
        out.append(int(tok))
        if tok in eos:
            break
    return out


def _accepted(rows: list[list[int]], constraint: TokenDFA, eos_ids: list[int], max_new_tokens: int,
              tokenizer) -> list[Generation]:
    """Distinct accepted generations (EOS included when it ended one), in generation order."""
    results: list[Generation] = []
    seen = set()
    eos_set = set(eos_ids)
    for row in rows:
        ids = trim_at_eos(row, eos_set)
        ended = bool(ids) and ids[-1] in eos_set
        if not ended and len(ids) < max_new_tokens:
            continue
        if not constraint.accepts(ids) or tuple(ids) in seen:
            continue
        seen.add(tuple(ids))
        body = ids[:-1] if ended else ids
        text = tokenizer.decode(body, skip_special_tokens=True) if tokenizer is not None else ""
        results.append(Generation(text=text, token_ids=ids))
    return results


def _rerank_in_place(model, prompt_ids, results: list[Generation], eos_set: set,
                     suffix_ids, recorder: BeamLogLikelihoods | None = None,
                     contexts: ContextCache | None = None) -> None:
    """Score each generation by log p_lm(ids [+ suffix] | prompt) and sort, best first; beams
    whose score ``recorder`` kept during the search (no suffix) skip the second LM pass."""
    bodies = [g.token_ids[:-1] if g.token_ids and g.token_ids[-1] in eos_set and suffix_ids
              else g.token_ids for g in results]
    scores = candidate_log_likelihoods(model, prompt_ids, [b + (suffix_ids or []) for b in bodies],
                                       recorder, contexts=contexts)
    for g, s in zip(results, scores):
        g.lm_log_likelihood = s
    results.sort(key=lambda g: -g.lm_log_likelihood)
