"""ReLM-style queries over a language model (Kuchnik et al., MLSys 2023): a regular language of
strings, a decision rule and a traversal (shortest path or sampling) over the LM's token tree.

* :mod:`ctrlg.relm.query` — :class:`Query`, :func:`search` (Dijkstra on −log p_lm),
  :func:`sample` (uniform prefix, then the LM restricted to the automaton), filters;
* :mod:`ctrlg.relm.edits` — the Levenshtein preprocessor (strings within edit distance k);
* ReLM's validation tasks (§4): :mod:`ctrlg.relm.memorization` (extraction verified offline,
  shortest path vs sampling), :mod:`ctrlg.relm.bias` (gender × profession, χ² test),
  :mod:`ctrlg.relm.toxicity` (prompted and unprompted insult extraction), and their figures
  (:mod:`ctrlg.relm.plots`).

May import: :mod:`ctrlg.dfa` (byte and token automata), :mod:`ctrlg.vocab`,
:mod:`ctrlg.validation`, :mod:`ctrlg.errors`. Nothing above it (no guide, HMM, sampler or task).
"""

from ctrlg.relm.query import Query, QueryResult, compile_query, exclude_words, sample, search

__all__ = ["Query", "QueryResult", "search", "sample", "exclude_words", "compile_query"]
