"""The guide: everything between a constraint and the processor's scores, in one package.

Read it top down (the processor, :class:`ctrlg.sampler.ConstraintLogitsProcessor`, sits on top):

* :mod:`~ctrlg.guide.masks` — the one interface the processor sees: per constraint, a regular
  token automaton A with its tables, and the exact next-token mask under the remaining budget,
  advanced token by token (plain DFA, canonical filter, grammar);
* :mod:`~ctrlg.guide.feasibility` — ``F_r(s)``: exact feasibility of a token DFA within r tokens
  (all that logical masking needs);
* :mod:`~ctrlg.guide.tables` — Ctrl-G's backward tables ``W_r(s, z)`` over A and the HMM
  (:class:`GuideTables`, :func:`build_tables`, :func:`forward_update`);
* :mod:`~ctrlg.guide.token_weights` — per-token queries P(v | x≤t), P(v, α | x≤t) off the tables;
* :mod:`~ctrlg.guide.horizon` — a lazy automaton without tables: exact budget masks decided per
  state, and the HMM's estimate over a bounded lookahead horizon (``horizon=`` of the processor);
* :mod:`~ctrlg.guide.canonical_masks`, :mod:`~ctrlg.guide.grammar_masks` — the exact masks of
  the canonical filter and of context-free grammars;
* :mod:`~ctrlg.guide.guidance` — the pure function p ∝ p_lm · p_hmm(α | x≤t, v)^w;
* :mod:`~ctrlg.guide.row_state` — per-row DFA states, mask cursors and priors across beam
  reorderings;
* :mod:`~ctrlg.guide.priors` — where each row's prior over the HMM's hidden state comes from.

The package itself exports the backward tables' API (:mod:`ctrlg.guide.tables`).

May import: :mod:`ctrlg.dfa` (automata, the canonical filter, grammar constraints),
:mod:`ctrlg.kernels`, :mod:`ctrlg.vocab`, :mod:`ctrlg.validation`, :mod:`ctrlg.memory`, :mod:`ctrlg.errors`. The HMM
reaches it as an argument (parameters as tensors), never as an import; nothing above it (sampler,
lm, tasks) is imported.
"""

from ctrlg.guide import tables
from ctrlg.guide.tables import (BLOCK_LETTER, PRECISIONS, RATIO_FLOOR_GAP, GuideTables,
                                backward_step_reference, build_tables, forward_update,
                                resolve_precision)

__all__ = [*tables.__all__, "BLOCK_LETTER", "PRECISIONS"]
