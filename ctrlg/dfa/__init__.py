"""Token-level deterministic finite automata: the core type, builders, boolean operations,
minimisation, the regex compiler and the context-free grammar constraint (:func:`grammar`).
See :class:`ctrlg.dfa.core.TokenDFA` for the representation. Sub-packages: :mod:`ctrlg.dfa.cfg`
(context-free grammars: IR, Lark / GBNF readers, Earley, the regular superset) and
:mod:`ctrlg.dfa.json_schema` (JSON Schema → regex, or → grammar when recursive).

May import: :mod:`ctrlg.vocab`, :mod:`ctrlg.validation`, :mod:`ctrlg.errors` (and, inside the
package, :mod:`ctrlg.dfa.cfg` for grammars). Nothing about HMMs, LMs, guides or tasks.
"""

from ctrlg.dfa.builders import (any_phrase, banned_phrases, banned_tokens, eos, exact, length, phrase,
                                starts_with, universal)
from ctrlg.dfa.core import DFABuilder, TokenClasses, TokenDFA, token_classes
from ctrlg.dfa.minimize import minimize
from ctrlg.dfa.ops import complement, concat, intersect, union
from ctrlg.dfa.grammar import grammar, lazy_grammar
from ctrlg.dfa.json_schema import json_schema, schema_to_regex
from ctrlg.dfa.json_schema.lazy import lazy_json_schema
from ctrlg.dfa.lazy import LazyTokenDFA, lazy_regex
from ctrlg.dfa.regex import regex
from ctrlg.dfa.strings import contains, contains_all, contains_any
from ctrlg.dfa.words import (commongen_constraint, count_words, inflections, keywords,
                             word_count)

__all__ = [
    "DFABuilder", "TokenDFA", "TokenClasses", "token_classes",
    "phrase", "any_phrase", "starts_with", "exact", "universal", "length", "eos",
    "banned_phrases", "banned_tokens", "word_count", "keywords", "inflections", "count_words",
    "commongen_constraint",
    "intersect", "union", "complement", "concat", "minimize",
    "regex", "json_schema", "schema_to_regex", "lazy_regex", "lazy_json_schema", "LazyTokenDFA", "grammar", "lazy_grammar", "contains", "contains_all", "contains_any",
]
