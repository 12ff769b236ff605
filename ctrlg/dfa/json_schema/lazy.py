"""JSON Schema → regex → :class:`~ctrlg.dfa.lazy.LazyTokenDFA`: the compile of
:func:`ctrlg.dfa.json_schema` without the up-front automaton (logical masking).

The documents are exactly :func:`~ctrlg.dfa.json_schema`'s (the same regex from the same
compiler, :func:`~ctrlg.dfa.json_schema._compile`); only the automaton is built on demand
(:mod:`ctrlg.dfa.lazy`): compile = the schema's regex + its Thompson NFA, and each state's
byte rows and token mask the first time a generation reaches it. A recursive schema still gives
:func:`ctrlg.dfa.grammar`'s grammar constraint (eager). When the regex or its NFA is over a
size limit, arbitrary values (``{}``) nest one level less at a time, as in the eager path.
"""

from __future__ import annotations

import warnings

from ctrlg.dfa.grammar import grammar
from ctrlg.dfa.json_schema import WHITESPACE, _compile, _TooLarge
from ctrlg.dfa.json_schema.frag import is_text, to_grammar
from ctrlg.dfa.lazy import LazyTokenDFA, lazy_regex
from ctrlg.errors import RegexError, UnsupportedSchemaError

__all__ = ["lazy_json_schema"]


def lazy_json_schema(schema, tokenizer, *, whitespace: str = WHITESPACE, max_nesting: int = 2,
                     warn: bool = True, **kwargs) -> LazyTokenDFA:
    """The documents of :func:`ctrlg.dfa.json_schema` (``encodings="all"``) as a
    :class:`~ctrlg.dfa.lazy.LazyTokenDFA` (a grammar constraint when ``$ref`` recurses).

    Args: as :func:`ctrlg.dfa.json_schema`; ``kwargs``: ``eos_token_id``, ``vocab_size``
    (``depth`` for a grammar)."""
    nesting = max_nesting
    while True:
        try:
            frag, defs = _compile(schema, whitespace, nesting, warn and nesting == max_nesting)
            if not is_text(frag):
                break
            try:
                d = lazy_regex(frag, tokenizer, what="schema",
                               **{k: v for k, v in kwargs.items()
                                  if k in ("eos_token_id", "vocab_size")})
            except RegexError as exc:
                raise _TooLarge(f"the schema at # compiles to a regex of {len(frag):,} "
                                f"characters whose automaton is too large: {exc}") from None
        except _TooLarge as exc:
            if not isinstance(nesting, int) or nesting <= 0:
                raise UnsupportedSchemaError(str(exc)) from None
            nesting -= 1
            continue
        if nesting != max_nesting:
            warnings.warn(f"JSON Schema: the automaton was too large with values of '{{}}' "
                          f"nested {max_nesting} deep; they nest at most {nesting} deep "
                          f"(a subset of the valid documents)", stacklevel=2)
        return d
    keep = {k: v for k, v in kwargs.items() if k in ("eos_token_id", "vocab_size", "depth")}
    return grammar(to_grammar(frag, defs), tokenizer, **keep)
