"""Context-free grammars as constraints: syntax readers, the recogniser, the regular
over-approximation that carries Ctrl-G's look-ahead, and the constraint object.

* :mod:`~ctrlg.dfa.cfg.grammar_ir` — the BNF grammar over regular terminals that every syntax becomes;
* :mod:`~ctrlg.dfa.cfg.lark_syntax`, :mod:`~ctrlg.dfa.cfg.gbnf_syntax` — Lark and GBNF readers;
* :mod:`~ctrlg.dfa.cfg.earley` — the byte-level Earley recogniser (terminals as byte DFAs);
* :mod:`~ctrlg.dfa.cfg.approximation` — the grammar unrolled to a nesting depth, as a byte DFA of a
  regular superset of its language;
* :mod:`~ctrlg.dfa.cfg.token_index` — per-terminal token tables for the exact masks;
* :mod:`~ctrlg.dfa.cfg.constraint` — :class:`GrammarConstraint`, what :func:`ctrlg.dfa.grammar` returns.

The exact budgeted masks live with the guide (:mod:`ctrlg.guide.grammar_masks`).

May import: the automata of :mod:`ctrlg.dfa` (byte DFAs, regex syntax, token DFAs, the vocabulary
trie) and :mod:`ctrlg.errors`. :func:`ctrlg.dfa.grammar` and :mod:`ctrlg.dfa.json_schema` build on it.
"""
