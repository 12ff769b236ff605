"""JSON Schema → regex → :class:`~ctrlg.dfa.lazy.LazyTokenDFA`: the compile of
:func:`ctrlg.dfa.json_schema` without the up-front automaton (logical masking).

The documents are exactly :func:`~ctrlg.dfa.json_schema`'s (the same regex from the same
compiler, :func:`~ctrlg.dfa.json_schema._compile`); only the automaton is built on demand
(:mod:`ctrlg.dfa.lazy`): compile = the schema's regex, its parse and the Thompson NFA's
initial ε-closure (:mod:`ctrlg.dfa.lazy_nfa`), and the rest of the NFA, each state's byte rows
and token mask the first time a generation reaches it. When the regex or its NFA is
over a size limit, arbitrary values (``{}``) nest one level less at a time, as in the eager path.

A recursive schema (a ``$ref`` to a schema being compiled) is, with ``recursion_depth=k``
(default :data:`RECURSION_DEPTHS`, the deepest whose regex has at most
:data:`MAX_UNROLLED_CHARS` characters), *unrolled*: each reference is replaced by its
definition up to ``k`` references deep, and a reference deeper than that by the empty language
(alternatives holding it are dropped, optional repetitions of it vanish). That is a **sound
subset** — the documents whose recursive values nest at most ``k`` levels — like ``{}``'s
``max_nesting``. Where that regex passes :data:`MAX_UNROLLED_CHARS` (a language that doubles
per level), the schema's grammar is unrolled on demand instead: the documents whose
self-embedded references nest at most :data:`GRAMMAR_LEVELS_PER_DEPTH` · ``k`` grammar levels
(:mod:`ctrlg.dfa.cfg.lazy_nesting`; the NFA of a level is built when the subset construction
first reaches it, so nesting adds nothing built up front: the compile is the schema compiler's
and the parse of the grammar's regex pieces). Where no depth gives a non-empty language (recursion the schema
requires), the exact grammar constraint of :func:`ctrlg.dfa.json_schema` is returned instead
(eager; ``recursion_depth=None`` always).
"""

from __future__ import annotations

import warnings

from ctrlg.dfa.cfg.grammar_ir import reduce
from ctrlg.dfa.cfg.lazy_nesting import lazy_nesting_subset
from ctrlg.dfa.grammar import grammar
from ctrlg.dfa.json_schema import WHITESPACE, _compile_fitting
from ctrlg.dfa.json_schema.frag import Alt, Ref, Rep, Seq, alt, rep, seq, to_grammar
from ctrlg.dfa.lazy import DEAD, LazyTokenDFA, lazy_regex
from ctrlg.dfa.vocab_trie import vocab_trie
from ctrlg.errors import GrammarError, RegexError, UnsupportedSchemaError

__all__ = ["lazy_json_schema", "unroll", "RECURSION_DEPTHS", "MAX_UNROLLED_CHARS",
           "GRAMMAR_LEVELS_PER_DEPTH"]

#: recursion depths tried in turn for a recursive schema (the first with a document wins: its
#: unrolled regex when that fits MAX_UNROLLED_CHARS, else the grammar nested on demand)
RECURSION_DEPTHS = (2, 1)
#: the largest unrolled regex accepted (characters)
MAX_UNROLLED_CHARS = 1_000_000
#: grammar nesting levels per recursion depth when a schema nests on demand: a recursive value
#: sits inside its container's brackets and the container inside its parent's (an array of
#: nodes in a node: two self-embedded levels per level of the document); on a tree of nodes
#: this accepts the same documents as unrolling ``depth`` references deep (tests/test_lazy_dfa.py)
GRAMMAR_LEVELS_PER_DEPTH = 2


class _TooBig(Exception):
    pass


def unroll(frag, definitions: dict, depth: int, max_chars: int | None = None) -> str | None:
    """Regex text of the documents of ``frag`` whose recursive references nest at most
    ``depth`` deep (module docstring); ``None`` when that language is empty. Raises
    UnsupportedSchemaError when the text would exceed ``max_chars`` (default
    :data:`MAX_UNROLLED_CHARS`)."""
    memo: dict = {}
    if max_chars is None:
        max_chars = MAX_UNROLLED_CHARS

    def go(f, d):
        if isinstance(f, str):
            out = f
        elif isinstance(f, Ref):
            if d >= depth:
                return None
            key = (f.name, d)
            if key not in memo:
                memo[key] = go(definitions[f.name], d + 1)
            out = memo[key]
        elif isinstance(f, Seq):
            parts = [go(x, d) for x in f.items]
            out = None if any(p is None for p in parts) else seq(*parts)
        elif isinstance(f, Alt):
            parts = [p for p in (go(x, d) for x in f.items) if p is not None]
            out = alt(parts) if parts else None
        elif isinstance(f, Rep):
            p = go(f.item, d)
            out = ("" if f.min == 0 else None) if p is None else rep(p, f.min, f.max)
        else:  # pragma: no cover - the compiler builds only the fragments above
            raise TypeError(f"unknown fragment {f!r}")
        if out is not None and len(out) > max_chars:
            raise _TooBig
        return out
    try:
        return go(frag, 0)
    except _TooBig:
        raise UnsupportedSchemaError(f"the recursive schema unrolled {depth} deep has a regex of "
                                     f"more than {max_chars:,} characters") from None


def _nesting_on_demand(frag, definitions: dict, depth: int, tokenizer, kwargs: dict):
    """The documents of the schema's grammar (:func:`~ctrlg.dfa.json_schema.frag.to_grammar`)
    whose self-embedded references nest at most ``GRAMMAR_LEVELS_PER_DEPTH · depth`` levels, as
    a lazy automaton whose NFA is unrolled as the subset construction reaches it
    (:func:`~ctrlg.dfa.cfg.lazy_nesting.lazy_nesting_subset`); None when no document nests
    within them."""
    try:
        g = reduce(to_grammar(frag, definitions))
    except GrammarError:
        return None
    rows = lazy_nesting_subset(g, GRAMMAR_LEVELS_PER_DEPTH * depth)
    if rows.initial == DEAD:
        return None
    return LazyTokenDFA(rows, vocab_trie(tokenizer), what="schema",
                        **{k: v for k, v in kwargs.items() if k in ("eos_token_id", "vocab_size")})


def lazy_json_schema(schema, tokenizer, *, whitespace: str = WHITESPACE, max_nesting: int = 2,
                     warn: bool = True, recursion_depth=RECURSION_DEPTHS, **kwargs
                     ) -> LazyTokenDFA:
    """The documents of :func:`ctrlg.dfa.json_schema` (``encodings="all"``) as a
    :class:`~ctrlg.dfa.lazy.LazyTokenDFA` (a grammar constraint when ``$ref`` recurses).

    Args: as :func:`ctrlg.dfa.json_schema`; ``recursion_depth``: an int, a sequence of depths
    tried in turn, or None (module docstring); ``kwargs``: ``eos_token_id``, ``vocab_size``
    (``depth`` for a grammar)."""
    frag, defs, d = _compile_fitting(
        schema, whitespace, max_nesting, warn,
        lambda frag: lazy_regex(frag, tokenizer, what="schema",
                                **{k: v for k, v in kwargs.items()
                                   if k in ("eos_token_id", "vocab_size")}))
    if d is not None:
        return d
    if recursion_depth is not None:
        depths = (recursion_depth,) if isinstance(recursion_depth, int) else recursion_depth
        for depth in depths:
            try:
                text = unroll(frag, defs, int(depth))
            except UnsupportedSchemaError:        # the regex doubles per level: on demand
                d = _nesting_on_demand(frag, defs, int(depth), tokenizer, kwargs)
                if d is None:
                    continue
                if warn:
                    warnings.warn(f"JSON Schema: recursive '$ref' nesting at most "
                                  f"{GRAMMAR_LEVELS_PER_DEPTH * depth} grammar levels deep, "
                                  f"built on demand (a subset of the valid documents)",
                                  stacklevel=2)
                return d
            if text is None:
                break            # deeper never helps less: the recursion is required
            try:
                d = lazy_regex(text, tokenizer, what="schema",
                               **{k: v for k, v in kwargs.items()
                                  if k in ("eos_token_id", "vocab_size")})
            except RegexError:
                continue
            if warn:
                warnings.warn(f"JSON Schema: recursive '$ref' unrolled {depth} deep (a subset "
                              f"of the valid documents)", stacklevel=2)
            return d
    keep = {k: v for k, v in kwargs.items() if k in ("eos_token_id", "vocab_size", "depth")}
    return grammar(to_grammar(frag, defs), tokenizer, **keep)
