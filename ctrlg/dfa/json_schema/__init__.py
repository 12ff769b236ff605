"""JSON Schema → regular expression → token DFA; a grammar constraint when ``$ref`` recurses.

``json_schema(schema, tokenizer, encodings=...)`` accepts the token sequences that spell a JSON
document of the language described below (optionally followed by EOS, exactly like
:func:`ctrlg.dfa.regex`). **Every accepted document parses with** ``json.loads`` **and validates
against the schema** (``jsonschema``, the draft named by ``$schema``); the converse does not hold.
Where a keyword cannot be expressed exactly, the compiler generates a *sound subset* — some
valid documents, never an invalid one — and refuses (:class:`~ctrlg.errors.UnsupportedSchemaError`,
naming the keyword and its JSON path such as ``#/properties/tags/uniqueItems``) only when it
finds no subset. Contradictions (``minimum`` > ``maximum``, an ``enum`` no value of which has
the ``type``, ``allOf`` members of disjoint types) raise :class:`~ctrlg.errors.SchemaError`
with the path.

Layout (fixed): properties in the order of ``properties``; whitespace between JSON tokens is
the regex ``whitespace`` (default ``[ ]?``; ``""`` compact); strings without ``\\uXXXX``
escapes, control or U+007F–U+009F characters; numbers without leading zeros.

Reading (drafts 4, 6, 7, 2019-09, 2020-12, by ``$schema``; default 2020-12): unknown keywords
are annotations and ignored (listed in one ``warnings.warn``); ``id``/``$id``/``$anchor``,
``definitions``/``$defs``; ``$ref`` siblings ignored up to draft 7 and applied after;
draft-4 boolean exclusive bounds; ``items`` as an array (= ``prefixItems``) with
``additionalItems``; ``dependencies`` = ``dependentRequired`` + ``dependentSchemas``;
``unevaluatedProperties``/``unevaluatedItems`` act as ``additionalProperties``/``items`` when
those are absent (the compiler generates evaluated members only).

Exact keywords: ``type``, ``enum``/``const`` (any JSON value; with other keywords, the values
the rest of the schema generates), ``properties``, ``required`` (also undeclared names: their
value follows ``patternProperties``/``additionalProperties``), ``additionalProperties: false``,
``items``/``prefixItems``/``minItems``/``maxItems``, ``minLength``/``maxLength``, ``pattern``
(``re.search`` semantics), integer bounds (any, exclusive too), number bounds with integer
inclusive values, ``anyOf`` (siblings distributed into each alternative), ``allOf`` (merged,
:mod:`~ctrlg.dfa.json_schema.merge`), ``oneOf`` with pairwise disjoint alternatives,
``dependentRequired``/``dependentSchemas`` of a required property, local ``$ref``.

Subsets (documented choices): optional properties may only appear in order, and only declared
ones unless ``additionalProperties`` is a schema (names outside the declared ones) or there are
no ``properties`` (a map); an optional property whose schema cannot be expressed is left out;
``patternProperties`` apply to declared names, and add names of patterns no declared name
matches; ``minProperties`` makes the first optional properties required, ``maxProperties``
keeps the first ones that fit; ``oneOf`` keeps the alternatives provably disjoint from all
others (:func:`~ctrlg.dfa.json_schema.merge.fails`); ``if``/``then`` generates documents of
``if`` ∧ ``then`` (``else`` only when the rest provably fails ``if``); ``not`` of types,
required names, enum values or a disjoint schema; ``dependentRequired``/``dependentSchemas`` of
an optional property leave that property out; ``pattern``/``format`` with length bounds keep
the pattern's strings whose length fits (:func:`~ctrlg.dfa.json_schema.strings.fit_length`);
``format`` (date, time, date-time, uuid, email, hostname, ipv4, ipv6, uri, uri-reference, byte,
duration, json-pointer, ...: regexes of valid values; unknown formats are annotations);
fractional/exclusive number bounds rounded inwards; ``multipleOf`` as up to 1,000 multiples;
``uniqueItems`` as distinct values of a finite item set in its order, else at most one item;
``contains`` satisfied by the first item; ``propertyNames`` checked on declared names;
``maxLength`` above 128 lowered to 128 (the token automaton of a 255-character
counter takes seconds to build); containers and repeated members whose regex is longer than
:data:`~ctrlg.dfa.json_schema.compiler.LARGE` are not copied (arrays of at most one such item
beyond the prefix; without a required property, only the first optional one may open an
object), which keeps Kubernetes-size schemas linear; ``{}`` is any value nested at most
``max_nesting`` levels.

Recursion: a ``$ref`` that refers to a schema being compiled makes the result a context-free
grammar: each recursive target becomes a nonterminal, every regex piece a terminal
(:mod:`~ctrlg.dfa.json_schema.frag`), and ``json_schema`` returns
:func:`ctrlg.dfa.grammar`'s :class:`~ctrlg.dfa.cfg.constraint.GrammarConstraint` (accepted wherever a
DFA is; ``schema_to_regex`` refuses such schemas, ``schema_to_grammar`` gives the grammar).

Cost: the regex is linear in the schema except for optional members without a required one
(quadratic while small) and ``{m,n}`` bounds (repeated copies in the automaton); the DFA is
:func:`ctrlg.dfa.regex`'s.
"""

from __future__ import annotations

import json
import warnings

from ctrlg.dfa.grammar import grammar
from ctrlg.dfa.json_schema.compiler import Compiler
from ctrlg.dfa.json_schema.frag import Alt, Ref, Rep, Seq, is_text, to_grammar
from ctrlg.dfa.json_schema.strings import STRING_CHAR, escape
from ctrlg.dfa.minimize import minimize as minimize_dfa
from ctrlg.dfa.regex import regex
from ctrlg.dfa.regex_syntax import parse
from ctrlg.errors import RegexError, SchemaError, UnsupportedSchemaError

__all__ = ["json_schema", "schema_to_regex", "schema_to_grammar", "WHITESPACE", "STRING_CHAR",
           "escape", "MAX_REGEX_CHARS", "AUTO_MINIMIZE_STATES"]

WHITESPACE = r"[ ]?"
#: a regex longer than this is refused (its automaton would have too many states)
MAX_REGEX_CHARS = 2_000_000
#: ``minimize="auto"`` minimises token DFAs of at most this many states (the byte DFA they come
#: from is minimal already; minimising thousands of token states costs tens of seconds)
AUTO_MINIMIZE_STATES = 1500


def json_schema(schema, tokenizer, encodings: str = "all", *, whitespace: str = WHITESPACE,
                max_nesting: int = 2, warn: bool = True, **regex_kwargs):
    """Compile a JSON Schema into a :class:`~ctrlg.dfa.core.TokenDFA` (module docstring), or a
    :class:`~ctrlg.dfa.cfg.constraint.GrammarConstraint` when a ``$ref`` recurses.

    Args:
        schema: a dict, a JSON string, ``True``, or a pydantic model class
            (``model_json_schema()`` is used).
        tokenizer: a :class:`ctrlg.Vocabulary`, a ``transformers`` tokenizer, a
            :class:`~ctrlg.dfa.vocab_trie.VocabTrie` or a list of token bytes (as
            :func:`ctrlg.dfa.regex`; canonical mode needs a tokenizer or a Vocabulary of one).
        encodings: ``"all"`` or ``"canonical"`` (see :func:`ctrlg.dfa.regex`; a recursive schema
            gives a grammar constraint, which is ``"all"`` only).
        whitespace: regex of the whitespace allowed between JSON tokens.
        max_nesting: depth of arbitrary JSON values allowed where the schema is ``{}`` (lowered
            one level at a time, with a warning, while the document's regex or automaton is
            over a size limit: a sound subset).
        warn: list the ignored unknown keywords in a ``warnings.warn``.
        **regex_kwargs: ``eos_token_id``, ``vocab_size``, ``minimize`` of :func:`ctrlg.dfa.regex`
            (``eos_token_id``, ``vocab_size``, ``depth`` of :func:`ctrlg.dfa.grammar`);
            ``minimize="auto"`` (default) minimises DFAs of at most
            :data:`AUTO_MINIMIZE_STATES` states.

    Raises:
        SchemaError: the schema is not valid JSON / not an object, or is contradictory.
        UnsupportedSchemaError: a keyword for which no sound subset is found (named with its
            path).
    """
    minimize = regex_kwargs.pop("minimize", "auto")
    frag, defs, d = _compile_fitting(
        schema, whitespace, max_nesting, warn,
        lambda frag: regex(frag, tokenizer, encodings, minimize=minimize is True,
                           max_positions=None, **regex_kwargs))
    if d is not None:
        if minimize == "auto" and encodings == "all" and d.num_states <= AUTO_MINIMIZE_STATES:
            d = minimize_dfa(d)
        return d
    if encodings != "all":
        raise UnsupportedSchemaError("a recursive schema compiles to a grammar constraint, "
                                     "which supports encodings='all' only")
    kwargs = {k: v for k, v in regex_kwargs.items() if k in ("eos_token_id", "vocab_size",
                                                              "depth")}
    return grammar(to_grammar(frag, defs), tokenizer, **kwargs)


def schema_to_regex(schema, *, whitespace: str = WHITESPACE, max_nesting: int = 2,
                    warn: bool = True) -> str:
    """The regex (``ctrlg.dfa.regex_syntax`` syntax, full-match) of the documents generated for
    ``schema``; UnsupportedSchemaError for a recursive schema (see :func:`schema_to_grammar`)."""
    try:
        frag, _ = _compile(schema, whitespace, max_nesting, warn)
    except _TooLarge as exc:
        raise UnsupportedSchemaError(str(exc)) from None
    if not is_text(frag):
        raise UnsupportedSchemaError("the schema has a recursive '$ref': its documents are not "
                                     "a regular language; use schema_to_grammar or "
                                     "dfa.json_schema (a grammar constraint)")
    return frag


def schema_to_grammar(schema, *, whitespace: str = WHITESPACE, max_nesting: int = 2,
                      warn: bool = True):
    """The :class:`~ctrlg.dfa.cfg.grammar_ir.Grammar` of the documents generated for ``schema``
    (its terminals are regexes; a single terminal when the schema is not recursive)."""
    frag, defs = _compile(schema, whitespace, max_nesting, warn)
    return to_grammar(frag, defs)


def _compile_fitting(schema, whitespace, max_nesting, warn, build):
    """``(frag, defs, build(frag))`` for the schema compiled with arbitrary values (``{}``)
    nested at most ``max_nesting`` deep, lowered one level at a time (with a warning) while the
    regex or ``build``'s automaton of it is over a size limit (``_TooLarge`` or
    :class:`~ctrlg.errors.RegexError`): a sound subset. The third item is None when ``frag`` is
    not text (a recursive schema: nothing is built). UnsupportedSchemaError when even nesting 0
    is too large. Shared by :func:`json_schema` and
    :func:`ctrlg.dfa.json_schema.lazy.lazy_json_schema` (its warning points at their caller)."""
    nesting = max_nesting
    while True:
        try:
            frag, defs = _compile(schema, whitespace, nesting, warn and nesting == max_nesting)
            if not is_text(frag):
                return frag, defs, None
            try:
                d = build(frag)
            except RegexError as exc:     # the automaton of the whole document is too large
                raise _TooLarge(f"the schema at # compiles to a regex of {len(frag):,} "
                                f"characters whose automaton is too large: {exc}") from None
        except _TooLarge as exc:
            if not isinstance(nesting, int) or nesting <= 0:
                raise UnsupportedSchemaError(str(exc)) from None
            nesting -= 1              # a sound subset: arbitrary values ({}) nest less deeply
            continue
        if nesting != max_nesting:
            warnings.warn(f"JSON Schema: the automaton was too large with values of '{{}}' "
                          f"nested {max_nesting} deep; they nest at most {nesting} deep "
                          f"(a subset of the valid documents)", stacklevel=3)
        return frag, defs, d


def _undefined_refs(frag, defs: dict):
    """``(target, where)`` for each :class:`Ref` in ``frag`` or ``defs`` with no definition: a
    cycle of bare references such as ``{"$ref": "#"}`` (nothing was compiled for it)."""

    stack = [(frag, "#")] + [(f, name) for name, f in defs.items()]
    while stack:
        node, where = stack.pop()
        if isinstance(node, Ref):
            if node.name not in defs:
                yield node.name, where
        elif isinstance(node, (Seq, Alt)):
            stack.extend((x, where) for x in node.items)
        elif isinstance(node, Rep):
            stack.append((node.item, where))


def _compile(schema, whitespace, max_nesting, warn):
    schema = _load(schema)
    if not isinstance(whitespace, str):
        raise SchemaError(f"whitespace must be a regex string, got {type(whitespace).__name__}")
    if whitespace:
        try:
            parse(whitespace)
        except RegexError as exc:
            raise SchemaError(f"whitespace {whitespace!r} is not a valid regex: {exc}") from None
    if not isinstance(max_nesting, int) or max_nesting < 0:
        raise SchemaError(f"max_nesting must be a non-negative int, got {max_nesting!r}")
    ws = f"(?:{whitespace})" if whitespace else ""
    compiler = Compiler(schema, ws, max_nesting)
    try:
        frag = compiler.value(schema, "#")
        for target in sorted(compiler.pending):   # recursive targets still undefined
            if target in compiler.recursive and target not in compiler.defs:
                compiler.value({"$ref": target}, "#")
    except RecursionError:
        raise UnsupportedSchemaError("the schema nests too deeply to compile") from None
    for name, where in _undefined_refs(frag, compiler.defs):
        raise SchemaError(f"'$ref' {name!r} (reached from {where}) only refers to itself through "
                          f"other references, with no keyword in between: it describes no "
                          f"value, and a validator following it would recurse forever")
    if is_text(frag) and len(frag) > MAX_REGEX_CHARS:
        raise _TooLarge(
            f"the schema's regex has {len(frag):,} characters, over max_regex_chars="
            f"{MAX_REGEX_CHARS:,}: its automaton would have too many states")
    if warn and compiler.unknown:
        shown = ", ".join(compiler.unknown[:12]) + (" ..." if len(compiler.unknown) > 12 else "")
        warnings.warn(f"JSON Schema: ignored {len(compiler.unknown)} unknown keyword(s) "
                      f"(annotations): {shown}", stacklevel=3)
    return frag, compiler.defs


class _TooLarge(UnsupportedSchemaError):
    """The document's regex or automaton is over a size limit (json_schema backs off)."""


def _load(schema):
    if hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"the schema string is not valid JSON: {exc}") from None
    if schema is True:
        return {}
    if not isinstance(schema, dict):
        raise SchemaError(f"a JSON Schema must be an object (dict) or true, got "
                          f"{type(schema).__name__}: {schema!r:.80}")
    return schema
