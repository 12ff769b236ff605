"""JSON Schema → regular expression → token DFA (the Outlines entry point, as a :class:`TokenDFA`).

``json_schema(schema, tokenizer, encodings=...)`` accepts the token sequences that spell a JSON
document produced by :func:`schema_to_regex` (optionally followed by EOS, exactly like
:func:`ctrlg.dfa.regex`). Every such document parses with ``json.loads`` and validates against
the schema (``jsonschema``); the converse does not hold — the regex fixes one layout:

* **property order** is the order of ``properties``; required properties always appear,
  optional ones may be left out; only declared properties are generated (also when
  ``additionalProperties`` is absent or true: a subset of the valid documents);
* **whitespace** between JSON tokens (after ``{ [ , :``, before ``} ] , :``) is the regex
  ``whitespace`` — default ``[ ]?`` (at most one space, the Outlines default); ``""`` gives
  compact JSON, ``[ \\n]*`` free layout (beware: an LM may then emit whitespace forever);
* **strings** are JSON strings without ``\\uXXXX`` escapes (any other escape allowed), control
  characters and U+007F–U+009F excluded; ``minLength``/``maxLength`` count characters
  (an escape is one character, as after decoding);
* **numbers** have no leading zeros; bounds make them regular as decimal-digit languages.

Supported subset (anything else raises :class:`~ctrlg.errors.UnsupportedSchemaError` naming
the keyword and its JSON path, e.g. ``#/properties/tags/uniqueItems``):

* ``type`` (one type or a list): ``object`` with ``properties`` / ``required`` /
  ``additionalProperties`` (false, true, or a schema when there are no ``properties``),
  ``string`` with ``minLength`` / ``maxLength`` / ``pattern`` (Python ``re.search`` semantics as
  ``jsonschema`` checks it; characters that would need escaping are removed from its classes) /
  ``format`` (date, time, date-time, uuid), ``integer`` with ``minimum`` / ``maximum`` /
  ``exclusiveMinimum`` / ``exclusiveMaximum``, ``number`` with integer-valued inclusive
  ``minimum`` / ``maximum`` (no exponent then), ``boolean``, ``null``,
  ``array`` with ``items`` / ``prefixItems`` / ``minItems`` / ``maxItems``;
* ``enum``, ``const``, ``anyOf``, a one-element ``allOf``, local non-recursive ``$ref``
  (``#/$defs/...``, ``#/definitions/...``), and the empty schema ``{}`` / ``true`` (any JSON value
  nested at most ``max_nesting`` levels);
* annotations (``title``, ``description``, ``default``, ``examples``, ``$schema``, ``$id``, ...)
  are ignored.

Cost: the regex is linear in the schema except for optional properties (quadratic in the number
of properties of one object) and ``{m,n}`` bounds (repeated copies); the DFA is
:func:`ctrlg.dfa.regex`'s.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ctrlg.dfa.regex import regex
from ctrlg.dfa.regex_syntax import Alternation, CharSet, Concat, Node, Repeat, parse
from ctrlg.errors import RegexError, SchemaError, UnsupportedSchemaError

__all__ = ["json_schema", "schema_to_regex", "WHITESPACE", "STRING_CHAR"]

WHITESPACE = r"[ ]?"
#: one character of a JSON string literal: an unescaped character or a two-character escape
STRING_CHAR = r'(?:[^"\\\x00-\x1f\x7f-\x9f]|\\["\\/bfnrt])'
_STRING = f'"{STRING_CHAR}*"'
_INTEGER = r"-?(?:0|[1-9][0-9]*)"
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_FORMATS = {
    "date": r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])",
    "time": r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
            r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
}
_FORMATS["date-time"] = _FORMATS["date"] + "T" + _FORMATS["time"]
_ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                "deprecated", "readOnly", "writeOnly", "$defs", "definitions"}
_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "number": {"minimum", "maximum"},
    "array": {"items", "prefixItems", "minItems", "maxItems"},
    "boolean": set(), "null": set(),
}
_TYPES = tuple(_KEYWORDS)
_SPECIAL = "\\.^$*+?{}[]|()-/"


def json_schema(schema, tokenizer, encodings: str = "all", *, whitespace: str = WHITESPACE,
                max_nesting: int = 2, **regex_kwargs):
    """Compile a JSON Schema into a :class:`~ctrlg.dfa.core.TokenDFA` (module docstring).

    Args:
        schema: a dict, a JSON string, ``True``, or a pydantic model class
            (``model_json_schema()`` is used).
        tokenizer: a :class:`ctrlg.Vocabulary`, a ``transformers`` tokenizer, a
            :class:`~ctrlg.dfa.vocab_trie.VocabTrie` or a list of token bytes (as
            :func:`ctrlg.dfa.regex`; canonical mode needs a tokenizer or a Vocabulary of one).
        encodings: ``"all"`` or ``"canonical"`` (see :func:`ctrlg.dfa.regex`).
        whitespace: regex of the whitespace allowed between JSON tokens.
        max_nesting: depth of arbitrary JSON values allowed where the schema is ``{}``.
        **regex_kwargs: ``eos_token_id``, ``vocab_size``, ``minimize`` of :func:`ctrlg.dfa.regex`.

    Raises:
        SchemaError: the schema is not valid JSON / not an object, or is contradictory.
        UnsupportedSchemaError: a keyword outside the supported subset (named with its path).
    """
    pattern = schema_to_regex(schema, whitespace=whitespace, max_nesting=max_nesting)
    return regex(pattern, tokenizer, encodings, **regex_kwargs)


def schema_to_regex(schema, *, whitespace: str = WHITESPACE, max_nesting: int = 2) -> str:
    """The regex (``ctrlg.dfa.regex_syntax`` syntax, full-match) of the documents generated for
    ``schema``."""
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
    return _Compiler(schema, ws, max_nesting).value(schema, "#", ())


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


def escape(text: str) -> str:
    """``text`` as a regex literal (ASCII punctuation and control characters escaped)."""
    out = []
    for ch in text:
        if ch in _SPECIAL:
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


class _Compiler:
    def __init__(self, root: dict, ws: str, max_nesting: int):
        self.root = root
        self.ws = ws
        self.max_nesting = max_nesting

    # ------------------------------------------------------------------ dispatch
    def value(self, schema, path: str, refs: tuple[str, ...]) -> str:
        if schema is True:
            schema = {}
        if schema is False:
            raise SchemaError(f"the schema at {path} is false: no value is allowed")
        if not isinstance(schema, dict):
            raise SchemaError(f"the schema at {path} must be an object or a boolean, got "
                              f"{type(schema).__name__}")
        if "$ref" in schema:
            return self.ref(schema, path, refs)
        if "allOf" in schema:
            parts = schema["allOf"]
            if not isinstance(parts, list) or len(parts) != 1:
                raise UnsupportedSchemaError(
                    f"'allOf' at {path}/allOf is supported with one subschema only")
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            merged = dict(parts[0]) if isinstance(parts[0], dict) else {}
            overlap = set(merged) & set(rest) - _ANNOTATIONS
            if overlap:
                raise UnsupportedSchemaError(
                    f"'allOf' at {path}/allOf repeats the keyword(s) {sorted(overlap)} of its "
                    f"parent; merge them into one schema")
            merged.update(rest)
            return self.value(merged, path, refs)
        if "anyOf" in schema:
            options = schema["anyOf"]
            if not isinstance(options, list) or not options:
                raise SchemaError(f"'anyOf' at {path}/anyOf must be a non-empty list")
            rest = {k: v for k, v in schema.items() if k not in _ANNOTATIONS and k != "anyOf"}
            if rest:
                raise UnsupportedSchemaError(
                    f"'anyOf' at {path} next to the keyword(s) {sorted(rest)}; move them into "
                    f"each alternative")
            return "(?:" + "|".join(self.value(opt, f"{path}/anyOf/{i}", refs)
                                    for i, opt in enumerate(options)) + ")"
        if "const" in schema or "enum" in schema:
            return self.enum(schema, path)
        kind = schema.get("type")
        if kind is None:
            self.check_keywords(schema, path, set())
            return self.anything(self.max_nesting)
        kinds = kind if isinstance(kind, list) else [kind]
        if not kinds or any(k not in _TYPES for k in kinds):
            raise SchemaError(f"'type' at {path}/type must be one of {list(_TYPES)} or a list "
                              f"of them, got {kind!r}")
        allowed = set().union(*(_KEYWORDS[k] for k in kinds))
        self.check_keywords(schema, path, allowed | {"type"})
        alts = [getattr(self, "t_" + k)(schema, path, refs) for k in kinds]
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    def check_keywords(self, schema: dict, path: str, allowed: set) -> None:
        for key in schema:
            if key not in allowed and key not in _ANNOTATIONS:
                kind = schema.get("type")
                where = f" for type {kind!r}" if kind is not None else ""
                raise UnsupportedSchemaError(
                    f"unsupported JSON Schema keyword {key!r}{where} at {path}/{key}; supported "
                    f"here: {sorted(allowed) or 'none'} (see ctrlg.dfa.json_schema)")

    def ref(self, schema: dict, path: str, refs: tuple[str, ...]) -> str:
        target = schema["$ref"]
        extra = {k for k in schema if k != "$ref" and k not in _ANNOTATIONS}
        if extra:
            raise UnsupportedSchemaError(
                f"'$ref' at {path} next to the keyword(s) {sorted(extra)} is not supported")
        if not isinstance(target, str) or not target.startswith("#"):
            raise UnsupportedSchemaError(
                f"'$ref' {target!r} at {path}/$ref: only local references '#/...' are supported")
        if target in refs:
            raise UnsupportedSchemaError(
                f"recursive '$ref' {target!r} at {path}/$ref: recursive schemas are not regular")
        node: Any = self.root
        for part in [p for p in target[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise SchemaError(f"'$ref' {target!r} at {path}/$ref does not resolve")
            node = node[part]
        return self.value(node, target, refs + (target,))

    # ------------------------------------------------------------------ scalars
    def enum(self, schema: dict, path: str) -> str:
        if "const" in schema:
            values, key = [schema["const"]], "const"
        else:
            values, key = schema["enum"], "enum"
            if not isinstance(values, list) or not values:
                raise SchemaError(f"'enum' at {path}/enum must be a non-empty list")
        self.check_keywords(schema, path, {key, "type"})
        kind = schema.get("type")
        if kind is not None:
            kinds = kind if isinstance(kind, list) else [kind]
            values = [v for v in values if any(_has_type(v, k) for k in kinds)]
            if not values:
                raise SchemaError(f"no value of '{key}' at {path}/{key} has type {kind!r}")
        literals = [self.literal(v) for v in values]
        return literals[0] if len(literals) == 1 else "(?:" + "|".join(literals) + ")"

    def literal(self, value) -> str:
        """The JSON text of ``value`` with the configured whitespace between its tokens."""
        ws = self.ws
        if isinstance(value, list):
            return rf"\[{ws}" + f"{ws},{ws}".join(self.literal(v) for v in value) + rf"{ws}\]"
        if isinstance(value, dict):
            pairs = [escape(json.dumps(str(k), ensure_ascii=False)) + f"{ws}:{ws}"
                     + self.literal(v) for k, v in value.items()]
            return rf"\{{{ws}" + f"{ws},{ws}".join(pairs) + rf"{ws}\}}"
        return escape(json.dumps(value, ensure_ascii=False))

    def t_null(self, schema, path, refs) -> str:
        return "null"

    def t_boolean(self, schema, path, refs) -> str:
        return "(?:true|false)"

    def t_string(self, schema, path, refs) -> str:
        lo = _count(schema, "minLength", path, 0)
        hi = _count(schema, "maxLength", path, None)
        if hi is not None and hi < lo:
            raise SchemaError(f"maxLength {hi} < minLength {lo} at {path}")
        if "format" in schema:
            fmt = schema["format"]
            if fmt not in _FORMATS:
                raise UnsupportedSchemaError(
                    f"unsupported string format {fmt!r} at {path}/format; supported: "
                    f"{sorted(_FORMATS)}")
            if "pattern" in schema or "minLength" in schema or "maxLength" in schema:
                raise UnsupportedSchemaError(
                    f"'format' together with pattern/minLength/maxLength at {path}")
            return f'"{_FORMATS[fmt]}"'
        if "pattern" in schema:
            if "minLength" in schema or "maxLength" in schema:
                raise UnsupportedSchemaError(
                    f"'pattern' together with minLength/maxLength at {path} is not supported; "
                    f"put the length into the pattern")
            return '"' + self.pattern(schema["pattern"], f"{path}/pattern") + '"'
        if lo == 0 and hi is None:
            return _STRING
        return f'"{STRING_CHAR}{{{lo},{"" if hi is None else hi}}}"'

    def pattern(self, pattern, path: str) -> str:
        if not isinstance(pattern, str):
            raise SchemaError(f"'pattern' at {path} must be a string")
        try:
            ast = parse(pattern)
        except RegexError as exc:
            raise UnsupportedSchemaError(f"'pattern' {pattern!r} at {path}: {exc}") from None
        body = _ast_to_regex(_restrict(ast))
        free = "[^\"\\\\\\x00-\\x1f\\x7f-\\x9f]*"
        start = "" if pattern.startswith(("^", "\\A")) else free
        end = "" if _anchored_end(pattern) else free
        return f"{start}(?:{body}){end}"

    def t_integer(self, schema, path, refs) -> str:
        lo, hi = -math.inf, math.inf
        for key in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
            if key in schema:
                v = schema[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise SchemaError(f"'{key}' at {path}/{key} must be a number, got {v!r}")
                if key == "minimum":
                    lo = max(lo, math.ceil(v))
                elif key == "exclusiveMinimum":
                    lo = max(lo, math.floor(v) + 1)
                elif key == "maximum":
                    hi = min(hi, math.floor(v))
                else:
                    hi = min(hi, math.ceil(v) - 1)
        if lo == -math.inf and hi == math.inf:
            return _INTEGER
        if lo > hi:
            raise SchemaError(f"no integer lies within the bounds at {path}")
        return _signed(None if lo == -math.inf else int(lo),
                       None if hi == math.inf else int(hi), fraction=False)

    def t_number(self, schema, path, refs) -> str:
        bounds = {}
        for key in ("minimum", "maximum"):
            if key in schema:
                v = schema[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise SchemaError(f"'{key}' at {path}/{key} must be a number, got {v!r}")
                if v != int(v):
                    raise UnsupportedSchemaError(
                        f"'{key}' {v!r} at {path}/{key}: number bounds must be integers")
                bounds[key] = int(v)
        if not bounds:
            return _NUMBER
        lo, hi = bounds.get("minimum"), bounds.get("maximum")
        if lo is not None and hi is not None and lo > hi:
            raise SchemaError(f"minimum {lo} > maximum {hi} at {path}")
        return _signed(lo, hi, fraction=True)

    # ------------------------------------------------------------------ containers
    def t_array(self, schema, path, refs) -> str:
        lo = _count(schema, "minItems", path, 0)
        hi = _count(schema, "maxItems", path, None)
        if hi is not None and hi < lo:
            raise SchemaError(f"maxItems {hi} < minItems {lo} at {path}")
        ws = self.ws
        prefix = schema.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise SchemaError(f"'prefixItems' at {path}/prefixItems must be a list")
        heads = [self.value(s, f"{path}/prefixItems/{i}", refs) for i, s in enumerate(prefix)]
        items = schema.get("items", {})
        if items is False:
            tail_item = None
        else:
            tail_item = self.value(items, f"{path}/items", refs)
        sep = f"{ws},{ws}"
        # element k (0-based) is heads[k] for k < len(heads), else tail_item
        alternatives = []
        max_count = hi
        if tail_item is None:
            max_count = len(heads) if hi is None else min(hi, len(heads))
        if max_count is not None and max_count < lo:
            raise SchemaError(f"the array at {path} cannot have {lo} items")
        # counts 1..len(heads) spelled out; beyond the heads, a repetition of the tail item
        for n in range(max(lo, 1), min(len(heads), max_count if max_count is not None
                                       else len(heads)) + 1):
            alternatives.append(sep.join(heads[:n]))
        if tail_item is not None and (max_count is None or max_count > len(heads)):
            extra_lo = max(lo - len(heads), 1)
            extra_hi = None if max_count is None else max_count - len(heads)
            rep = f"(?:{sep}{tail_item}){{{extra_lo - 1},{'' if extra_hi is None else extra_hi - 1}}}"
            alternatives.append(sep.join(heads + [tail_item]) + rep)
        body = "|".join(alternatives)
        if not alternatives:
            return rf"\[{ws}\]"
        inner = f"(?:{body})" if lo > 0 else f"(?:{body})?"
        return rf"\[{ws}{inner}{ws}\]"

    def t_object(self, schema, path, refs) -> str:
        ws = self.ws
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError(f"'properties' at {path}/properties must be an object")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(f"'required' at {path}/required must be a list of names")
        missing = [r for r in required if r not in props]
        if missing:
            raise UnsupportedSchemaError(
                f"required properties {missing} at {path}/required are not declared in "
                f"'properties'")
        extra = schema.get("additionalProperties", None)
        members = []
        for name, sub in props.items():
            key = escape(json.dumps(name, ensure_ascii=False))
            members.append((f"{key}{ws}:{ws}" + self.value(sub, f"{path}/properties/{name}",
                                                           refs), name in required))
        if not members:
            if extra is False:
                return rf"\{{{ws}\}}"
            if extra is None or extra is True:
                extra = {}
            value = self.value(extra, f"{path}/additionalProperties", refs) if extra != {} \
                else self.anything(self.max_nesting - 1)
            pair = f"{_STRING}{ws}:{ws}{value}"
            return rf"\{{{ws}(?:{pair}(?:{ws},{ws}{pair})*)?{ws}\}}"
        if isinstance(extra, dict) and extra:
            raise UnsupportedSchemaError(
                f"'additionalProperties' as a schema next to 'properties' at "
                f"{path}/additionalProperties is not supported; declare the properties")
        return rf"\{{{ws}{_members(members, f'{ws},{ws}')}{ws}\}}"

    def anything(self, depth: int) -> str:
        """Any JSON value with containers nested at most ``depth`` levels."""
        scalars = [_STRING, _NUMBER, "true", "false", "null"]
        if depth <= 0:
            return "(?:" + "|".join(scalars) + ")"
        ws = self.ws
        inner = self.anything(depth - 1)
        array = rf"\[{ws}(?:{inner}(?:{ws},{ws}{inner})*)?{ws}\]"
        pair = f"{_STRING}{ws}:{ws}{inner}"
        obj = rf"\{{{ws}(?:{pair}(?:{ws},{ws}{pair})*)?{ws}\}}"
        return "(?:" + "|".join(scalars + [array, obj]) + ")"


def _members(members: list[tuple[str, bool]], sep: str) -> str:
    """Regex of the properties in order, required ones present, separated by ``sep``:
    alternatives over which property comes first, then each later one optional (if not
    required) and prefixed by the separator."""
    def rest(i: int) -> str:
        return "".join(f"{sep}{m}" if req else f"(?:{sep}{m})?" for m, req in members[i:])

    alternatives = []
    for k, (m, req) in enumerate(members):
        alternatives.append(m + rest(k + 1))
        if req:
            break
    body = "(?:" + "|".join(alternatives) + ")"
    return body if any(req for _, req in members) else body + "?"


def _has_type(value, kind: str) -> bool:
    return {"null": value is None, "boolean": isinstance(value, bool),
            "integer": isinstance(value, int) and not isinstance(value, bool)
            or isinstance(value, float) and value.is_integer(),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool),
            "string": isinstance(value, str), "array": isinstance(value, list),
            "object": isinstance(value, dict)}.get(kind, False)


def _count(schema: dict, key: str, path: str, default):
    if key not in schema:
        return default
    v = schema[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise SchemaError(f"'{key}' at {path}/{key} must be a non-negative integer, got {v!r}")
    return v


# ---------------------------------------------------------------------- numbers
def _signed(lo: int | None, hi: int | None, fraction: bool) -> str:
    """Integers (or decimals without exponent when ``fraction``) in ``[lo, hi]`` (``None``:
    unbounded): a non-negative branch and a ``-`` branch over magnitudes."""
    alts = []
    if hi is None or hi >= 0:
        alts.append(_magnitude(max(lo, 0) if lo is not None else 0, hi, fraction))
    if lo is None or lo < 0:
        m_lo = 0 if hi is None or hi >= 0 else -hi
        m_hi = None if lo is None else -lo
        if not fraction:
            m_lo = max(m_lo, 1)   # no "-0" for integers
        if m_hi is None or m_lo <= m_hi:
            alts.append("-" + _magnitude(m_lo, m_hi, fraction))
    return "(?:" + "|".join(alts) + ")"


def _magnitude(lo: int, hi: int | None, fraction: bool) -> str:
    """Decimal magnitudes m with lo ≤ m ≤ hi (integers, or decimals ``n(.d+)?`` when
    ``fraction``: m ≥ lo iff its integer part n ≥ lo; m ≤ hi iff n < hi, or n = hi with
    only zeros after the point)."""
    if not fraction:
        return "(?:" + "|".join(_uint_range(lo, hi)) + ")"
    frac = r"(?:\.[0-9]+)?"
    if hi is None:
        return "(?:" + "|".join(_uint_range(lo, None)) + ")" + frac
    alts = [f"{hi}(?:\\.0+)?"]
    if lo <= hi - 1:
        alts.append("(?:" + "|".join(_uint_range(lo, hi - 1)) + ")" + frac)
    return "(?:" + "|".join(alts) + ")"


def _uint_range(lo: int, hi: int | None) -> list[str]:
    """Regex alternatives for the decimal integers in ``[lo, hi]`` (no leading zeros)."""
    out = []
    top = hi if hi is not None else 10 ** len(str(lo)) - 1
    for d in range(len(str(lo)), len(str(top)) + 1):
        a = max(lo, 10 ** (d - 1) if d > 1 else 0)
        b = min(top, 10 ** d - 1)
        if a <= b:
            out.extend(_same_length(str(a), str(b)))
    if hi is None:
        out.append(f"[1-9][0-9]{{{len(str(lo))},}}")
    return out


def _same_length(a: str, b: str) -> list[str]:
    n = len(a)
    if n == 1:
        return [a if a == b else f"[{a}-{b}]"]
    if a[0] == b[0]:
        return [a[0] + r for r in _same_length(a[1:], b[1:])]
    out = []
    first_lo, first_hi = int(a[0]), int(b[0])
    if a[1:] != "0" * (n - 1):
        out.extend(a[0] + r for r in _same_length(a[1:], "9" * (n - 1)))
        first_lo += 1
    tail = b[1:] != "9" * (n - 1)
    if tail:
        first_hi -= 1
    if first_lo <= first_hi:
        digit = str(first_lo) if first_lo == first_hi else f"[{first_lo}-{first_hi}]"
        out.append(f"{digit}[0-9]{{{n - 1}}}")
    if tail:
        out.extend(b[0] + r for r in _same_length("0" * (n - 1), b[1:]))
    return out


# ---------------------------------------------------------------------- pattern keyword
_FORBIDDEN = ((0x00, 0x1F), (ord('"'), ord('"')), (ord("\\"), ord("\\")), (0x7F, 0x9F))


def _restrict(node: Node) -> Node:
    """The AST with every character class minus the characters a JSON string literal would
    have to escape (so the literal's characters are the decoded string's)."""
    if isinstance(node, CharSet):
        out = []
        for lo, hi in node.ranges:
            pieces = [(lo, hi)]
            for f_lo, f_hi in _FORBIDDEN:
                nxt = []
                for a, b in pieces:
                    if b < f_lo or a > f_hi:
                        nxt.append((a, b))
                        continue
                    if a < f_lo:
                        nxt.append((a, f_lo - 1))
                    if b > f_hi:
                        nxt.append((f_hi + 1, b))
                pieces = nxt
            out.extend(pieces)
        return CharSet(tuple(out))
    if isinstance(node, Concat):
        return Concat(tuple(_restrict(n) for n in node.items))
    if isinstance(node, Alternation):
        return Alternation(tuple(_restrict(n) for n in node.items))
    if isinstance(node, Repeat):
        return Repeat(_restrict(node.item), node.min, node.max)
    raise TypeError(f"unknown regex node {node!r}")  # pragma: no cover


def _ast_to_regex(node: Node) -> str:
    if isinstance(node, CharSet):
        if not node.ranges:
            return "[^\\x00-\\U0010ffff]"
        if len(node.ranges) == 1 and node.ranges[0][0] == node.ranges[0][1]:
            return _cp(node.ranges[0][0])
        return "[" + "".join(_cp(lo) if lo == hi else f"{_cp(lo)}-{_cp(hi)}"
                             for lo, hi in node.ranges) + "]"
    if isinstance(node, Concat):
        return "".join(f"(?:{_ast_to_regex(n)})" if isinstance(n, Alternation)
                       else _ast_to_regex(n) for n in node.items)
    if isinstance(node, Alternation):
        return "(?:" + "|".join(_ast_to_regex(n) for n in node.items) + ")"
    if isinstance(node, Repeat):
        hi = "" if node.max is None else node.max
        return f"(?:{_ast_to_regex(node.item)}){{{node.min},{hi}}}"
    raise TypeError(f"unknown regex node {node!r}")  # pragma: no cover


def _cp(cp: int) -> str:
    return f"\\x{cp:02x}" if cp <= 0xFF else f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


def _anchored_end(pattern: str) -> bool:
    if pattern.endswith("\\Z"):
        return True
    if not pattern.endswith("$"):
        return False
    backslashes = len(pattern) - 1 - len(pattern[:-1].rstrip("\\"))
    return backslashes % 2 == 0
