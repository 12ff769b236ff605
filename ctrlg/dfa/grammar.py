"""Context-free grammar → constraint over a tokenizer's vocabulary (``dfa.grammar``).

``grammar(text, tokenizer, syntax="lark")`` reads a Lark (:mod:`ctrlg.dfa.cfg.lark_syntax`) or GBNF
(:mod:`ctrlg.dfa.cfg.gbnf_syntax`) grammar, or takes a :class:`~ctrlg.dfa.cfg.grammar_ir.Grammar` built
by another compiler (e.g. one emitted from a JSON Schema), and returns a
:class:`~ctrlg.dfa.cfg.constraint.GrammarConstraint`: every token sequence whose bytes form a
sentence, optionally followed by EOS. The processor, ``ctrlg.generate``, beam search, insertion
and per-row batching accept it wherever they accept a :class:`~ctrlg.dfa.core.TokenDFA`: Ctrl-G's
tables are built over the regular superset ``R_d`` (the grammar unrolled to nesting depth d,
:mod:`ctrlg.dfa.cfg.approximation`) and the grammar's exact masks under the remaining budget
(:mod:`ctrlg.guide.grammar_masks`) are applied after, renormalised. See docs/grammar.md.

``lazy_grammar(...)`` takes the same arguments and returns, for a grammar whose language is
regular as written (its only recursion is loops: ``x*``, ``x+``, ``a: a "," b | b``; no
self-embedding such as parentheses inside parentheses), a
:class:`~ctrlg.dfa.lazy.LazyTokenDFA` over the grammar's minimal byte DFA: no token automaton is
built before the first mask, each state's mask is one walk of the vocabulary trie on first use
(what ``dfa.lazy_json_schema`` does for a schema). A self-embedding grammar gets the
Earley-driven constraint: a :class:`~ctrlg.dfa.cfg.constraint.GrammarConstraint` of the same
language as :func:`grammar`'s, whose regular superset is the one-level ``R_1`` that the
regularity test has already built (unless ``depth`` is given) and whose token index computes
each terminal's runs when a mask first needs them — a compile in tens of milliseconds, the
exact masks from the Earley recogniser. With ``max_nesting=n`` it gets instead the lazy
automaton of the sentences nesting at most n levels deep (a subset of the language, with a
warning: what ``lazy_json_schema`` does for a recursive ``$ref``), built on demand too
(:mod:`ctrlg.dfa.cfg.lazy_nesting`: the unrolled grammar's references expanded when the subset
construction first reaches them).
"""

from __future__ import annotations

import warnings

from ctrlg.dfa.cfg.approximation import nesting_subset, regular_superset
from ctrlg.dfa.cfg.constraint import GrammarConstraint, prepared_bnf
from ctrlg.dfa.cfg.gbnf_syntax import from_gbnf
from ctrlg.dfa.cfg.grammar_ir import Grammar
from ctrlg.dfa.cfg.lark_syntax import from_lark
from ctrlg.dfa.cfg.lazy_nesting import lazy_nesting_subset
from ctrlg.dfa.lazy import LazyByteDFA, LazyTokenDFA
from ctrlg.dfa.regex_index import AUTO
from ctrlg.dfa.vocab_trie import vocab_trie
from ctrlg.errors import ConstraintError

__all__ = ["grammar", "lazy_grammar", "SYNTAXES", "NESTING_AUTOMATA"]

SYNTAXES = ("lark", "gbnf")
#: how ``lazy_grammar(max_nesting=n)`` builds the nesting-bounded automaton
NESTING_AUTOMATA = ("on_demand", "minimal")


def grammar(text: str | Grammar, tokenizer, *, syntax: str = "lark", start: str | None = None,
            eos_token_id=AUTO, vocab_size: int | None = None,
            depth: int | str = "auto") -> GrammarConstraint:
    """Compile a context-free grammar into a constraint over the vocabulary.

    Args:
        text: Lark or GBNF grammar text, or a :class:`~ctrlg.dfa.cfg.grammar_ir.Grammar`.
        tokenizer: a ``transformers`` tokenizer, a :class:`ctrlg.Vocabulary`, a
            :class:`~ctrlg.dfa.vocab_trie.VocabTrie` or a list of token bytes.
        syntax: ``"lark"`` (rules, terminals as strings and regexes, ``?rule``, ``|``, ``*``,
            ``+``, ``?``, ``[ ]``, ``%import``, ``%ignore``) or ``"gbnf"`` (llama.cpp's).
        start: the start rule (default ``"start"`` for Lark, ``"root"`` for GBNF).
        eos_token_id: EOS allowed after a sentence; default the tokenizer's.
        vocab_size: V (default the tokenizer's size); larger when the LM's output is padded.
        depth: nesting depth d of the regular superset that carries Ctrl-G's look-ahead, or
            ``"auto"`` (the deepest d ≤ 12 whose byte automaton stays ≤ 1,024 states and
            within the construction's budget, :mod:`ctrlg.dfa.cfg.approximation`).

    Raises:
        GrammarError / UnsupportedGrammarError: invalid grammar, or a construct outside the
            supported subset (named, with its line).
        UnsatisfiableConstraintError: no token sequence spells a sentence.
        ConstraintError: bad ``syntax`` or ``depth``, or a depth whose superset exceeds the
            construction's budget (fixed before it starts: bounded time and memory).
    """
    g, what = _read(text, syntax, start, depth)
    return GrammarConstraint(g, vocab_trie(tokenizer), eos_token_id=eos_token_id,
                             vocab_size=vocab_size, depth=depth, what=what)


def lazy_grammar(text: str | Grammar, tokenizer, *, syntax: str = "lark", start: str | None = None,
                 eos_token_id=AUTO, vocab_size: int | None = None, depth: int | str = "auto",
                 max_nesting: int | None = None, warn: bool = True,
                 nesting_automaton: str = "on_demand") -> LazyTokenDFA | GrammarConstraint:
    """:func:`grammar`'s constraint, built lazily where the grammar is regular as written
    (module docstring): a :class:`~ctrlg.dfa.lazy.LazyTokenDFA` of the same token sequences
    (every encoding of every sentence, then EOS), whose masks are computed on first use.

    A self-embedding grammar gets a :class:`GrammarConstraint` of :func:`grammar`'s language
    (exact masks from the Earley recogniser) built lazily: its regular superset, which carries
    Ctrl-G's look-ahead, is ``R_1`` (the grammar unrolled one level, already built to test
    regularity) unless ``depth`` is an int, and its token index runs each terminal over the
    vocabulary when a mask first needs it (module docstring). Unless ``max_nesting`` = n ≥ 0
    is given: then the lazy automaton of its
    sentences with at most n self-embedded levels (parentheses n deep in the arithmetic example;
    :func:`~ctrlg.dfa.cfg.approximation.nesting_subset`), a subset of the language, announced
    by a warning unless ``warn=False``. ``nesting_automaton``: ``"on_demand"`` (default) builds
    that automaton's rows as masks first need them (:mod:`ctrlg.dfa.cfg.lazy_nesting`: a
    compile in milliseconds at any depth, the construction spread over the first visits to
    each state); ``"minimal"`` compiles its minimal byte DFA first
    (:func:`~ctrlg.dfa.cfg.approximation.nesting_subset`: the same language, seconds for JSON
    six levels deep, whose automaton doubles per level, then only trie walks in the masks).
    Otherwise the same arguments and errors as :func:`grammar`; a bad ``max_nesting`` or
    ``nesting_automaton`` is a ConstraintError."""
    g, what = _read(text, syntax, start, depth)
    if max_nesting is not None and (isinstance(max_nesting, bool) or not isinstance(max_nesting, int)
                                    or max_nesting < 0):
        raise ConstraintError(f"max_nesting must be None or an int ≥ 0, got {max_nesting!r}")
    if nesting_automaton not in NESTING_AUTOMATA:
        raise ConstraintError(f"nesting_automaton must be one of {NESTING_AUTOMATA}, got "
                              f"{nesting_automaton!r}")
    trie = vocab_trie(tokenizer)
    bnf = prepared_bnf(g, what)
    byte_dfa, _, exact = regular_superset(bnf, 1)
    if exact:
        return LazyTokenDFA(LazyByteDFA.complete(byte_dfa), trie, eos_token_id=eos_token_id,
                            vocab_size=vocab_size, what=what)
    if max_nesting is None:
        superset = (byte_dfa, 1, exact) if depth == "auto" else regular_superset(bnf, depth)
        return GrammarConstraint.over_superset(g, bnf, superset, trie, eos_token_id=eos_token_id,
                                               vocab_size=vocab_size, what=what)
    if warn:
        warnings.warn(f"{what}: sentences nesting more than {max_nesting} levels deep are "
                      f"refused (max_nesting={max_nesting}: a subset of the language)",
                      stacklevel=2)
    rows = lazy_nesting_subset(bnf, max_nesting) if nesting_automaton == "on_demand" \
        else LazyByteDFA.complete(nesting_subset(bnf, max_nesting))
    return LazyTokenDFA(rows, trie, eos_token_id=eos_token_id, vocab_size=vocab_size, what=what)


def _read(text: str | Grammar, syntax: str, start: str | None, depth) -> tuple[Grammar, str]:
    """(the grammar, a description for messages), with ``syntax`` and ``depth`` checked."""
    if isinstance(text, Grammar):
        g, what = text, f"grammar (start {text.nonterminals[text.start]!r})"
    elif syntax == "lark":
        g, what = from_lark(text, start or "start"), "Lark grammar"
    elif syntax == "gbnf":
        g, what = from_gbnf(text, start or "root"), "GBNF grammar"
    else:
        raise ConstraintError(f"syntax must be one of {SYNTAXES}, got {syntax!r}")
    if depth != "auto" and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise ConstraintError(f"depth must be an int ≥ 1 or 'auto', got {depth!r}")
    return g, what
