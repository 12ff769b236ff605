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
``max_nesting``. Where no depth gives a non-empty regex of that size (recursion the schema
requires, or a language that doubles per level), the exact grammar constraint of
:func:`ctrlg.dfa.json_schema` is returned instead (eager; ``recursion_depth=None`` always).
"""

from __future__ import annotations

import warnings

from ctrlg.dfa.grammar import grammar
from ctrlg.dfa.json_schema import WHITESPACE, _compile_fitting
from ctrlg.dfa.json_schema.frag import Alt, Ref, Rep, Seq, alt, rep, seq, to_grammar
from ctrlg.dfa.lazy import LazyTokenDFA, lazy_regex
from ctrlg.errors import RegexError, UnsupportedSchemaError

__all__ = ["lazy_json_schema", "unroll", "RECURSION_DEPTHS", "MAX_UNROLLED_CHARS"]

#: recursion depths tried in turn for a recursive schema (the first whose regex fits wins)
RECURSION_DEPTHS = (2, 1)
#: the largest unrolled regex accepted (characters)
MAX_UNROLLED_CHARS = 1_000_000


class _TooBig(Exception):
    pass


def unroll(frag, definitions: dict, depth: int, max_chars: int = MAX_UNROLLED_CHARS) -> str | None:
    """Regex text of the documents of ``frag`` whose recursive references nest at most
    ``depth`` deep (module docstring); ``None`` when that language is empty. Raises
    UnsupportedSchemaError when the text would exceed ``max_chars``."""
    memo: dict = {}

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
            except UnsupportedSchemaError:
                continue
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
