"""The JSON Schema → regex (or grammar fragment) compiler: one method per kind of schema.

See :mod:`ctrlg.dfa.json_schema` for the language produced and which keywords are exact or a
subset. Every subschema is first *flattened* (:meth:`Compiler.flatten`): its draft-specific
keywords normalised, a top-level ``$ref`` resolved, ``allOf`` merged, sibling keywords
distributed into ``anyOf``/``oneOf`` alternatives and ``if``/``then`` merged; then it is compiled
by its type(s).
"""

from __future__ import annotations

import math
import re
from itertools import combinations
from typing import Any
from urllib.parse import unquote

from ctrlg.dfa.bytes_dfa import compile_bytes_dfa
from ctrlg.dfa.json_schema.frag import Ref, alt, is_text, rep, seq
from ctrlg.dfa.json_schema.merge import (ANNOTATIONS, KNOWN, TYPES, canonical, draft_of, facts,
                                         fails, merge, normalize, type_set)
from ctrlg.dfa.json_schema.numbers import Bounds, integer_range, multiples, number_range
from ctrlg.dfa.json_schema.strings import (FORMATS, STRING, escape, fit_length, disjoint,
                                           included, json_text,
                                           ast_to_regex, length_range, names_except, pattern_ast)
from ctrlg.dfa.regex_syntax import MAX_REPEAT, parse, positions, repeat_copies
from ctrlg.errors import SchemaError, UnsupportedSchemaError

__all__ = ["Compiler", "LARGE", "MAX_LENGTH"]

#: a fragment longer than this (characters of regex) is not copied again: arrays of such items
#: hold at most one of them beyond their prefix, objects without a required property list it
#: only as the first member
LARGE = 4000
#: an array's counter copies its item once per place: at most this many regex positions of
#: copies (:func:`regex_syntax.positions`), lowering ``maxItems`` if needed (a sound subset)
MAX_ITEM_POSITIONS = 2_000
#: a ``maxLength`` above this is lowered to it (a subset): a token automaton counting 255
#: characters takes ~13 s to build over SmolLM2's vocabulary, one counting 128 takes 0.35 s
MAX_LENGTH = 128
#: an exclusive bound of ±infinity is met by the numbers within ±FINITE_LIMIT (a subset)
FINITE_LIMIT = 10 ** 308
_NUMBER_KEYS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
_STRING_KEYS = {"minLength", "maxLength", "pattern", "format"}
_ARRAY_KEYS = {"items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains"}
_OBJECT_KEYS = {"properties", "required", "additionalProperties", "patternProperties",
                "minProperties", "maxProperties", "dependentRequired", "dependentSchemas",
                "propertyNames"}


def _positions(frag) -> int:
    """Regex positions of a fragment with counted repetitions expanded
    (:func:`regex_syntax.positions`; a recursive reference counts 1)."""
    if is_text(frag):
        return max(1, positions(parse(frag))) if frag else 1
    if isinstance(frag, Ref):
        return 1
    if hasattr(frag, "items"):
        return sum(_positions(x) for x in frag.items)
    return _positions(frag.item) * repeat_copies(frag.min, frag.max)


def _size(frag) -> int:
    """Characters of regex text in a fragment (a recursive reference counts 1)."""
    if is_text(frag):
        return len(frag)
    if isinstance(frag, Ref):
        return 1
    if hasattr(frag, "items"):
        return sum(_size(x) for x in frag.items)
    return _size(frag.item)


def _without_conditional(schema: dict) -> dict:
    """``schema`` without its ``if``/``then``/``else``."""
    return {k: v for k, v in schema.items() if k not in ("if", "then", "else")}


def _finite_bounds(s: dict, path: str) -> dict:
    """``s`` without its infinite numeric bounds, after checking them: a bound read as ±infinity
    (JSON text such as ``1e400`` overflows a double; Python's ``float("inf")``) that no finite
    number can meet (``minimum: inf``, ``maximum: -inf``, exclusive ones likewise) raises
    SchemaError — nothing satisfies it; one that every finite number meets
    (``minimum: -inf``, ``maximum: inf``) is no bound; an exclusive one (``exclusiveMaximum:
    inf``) becomes ``maximum: 10^308`` (:data:`FINITE_LIMIT`), since a document such as
    ``1e400`` would read as infinity and fail it: a subset (unless the inclusive bound is also
    given and finite: it decides; an infinite inclusive one, ``maximum: inf`` beside
    ``exclusiveMaximum: inf``, gives way to it). ``NaN`` (not a JSON number; Python's
    comparisons with it are all false) raises SchemaError for every numeric keyword."""
    for key in _NUMBER_KEYS:
        v = s.get(key)
        if isinstance(v, float) and math.isnan(v):
            raise SchemaError(f"'{key}' at {path}/{key} is NaN, which is not a JSON number; "
                              f"give a finite number")
    out = {}
    for k, v in s.items():
        if k in _NUMBER_KEYS - {"multipleOf"} and isinstance(v, float) and math.isinf(v):
            lower = k in ("minimum", "exclusiveMinimum")
            if (v > 0) == lower:
                raise SchemaError(
                    f"'{k}' at {path}/{k} is {v} (a JSON number beyond ±1.8e308 overflows to "
                    f"infinity): no finite number meets it (only a number that overflows "
                    f"itself, such as {'' if lower else '-'}1e400, would), so no value can be "
                    f"generated for the schema")
            if k.startswith("exclusive"):    # x < inf: a finite x, below 10^308 (a subset)
                k, v = ("minimum", -FINITE_LIMIT) if lower else ("maximum", FINITE_LIMIT)
                if not _finite_number(s.get(k)):     # a finite inclusive bound decides; an
                    out[k] = v                       # infinite one is dropped: this replaces it
            continue              # an infinite inclusive bound (-inf below, +inf above) is no bound
        out[k] = v
    return out


def _finite_number(value) -> bool:
    """Whether ``value`` is a number (not a bool) that is not ±infinity or NaN."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _check_json_value(value, path: str) -> None:
    """SchemaError when ``value`` (a ``const``/``enum`` value) holds NaN or ±infinity, which
    strict JSON cannot write (``json.dumps`` gives ``NaN`` / ``Infinity``)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise SchemaError(f"the value {value!r} at {path} cannot be written in strict JSON "
                          f"(NaN and infinities are not JSON numbers)")
    if isinstance(value, list):
        for i, v in enumerate(value):
            _check_json_value(v, f"{path}/{i}")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_json_value(v, f"{path}/{k}")


class Compiler:
    def __init__(self, root: dict, ws: str, max_nesting: int):
        self.root = root
        self.draft = draft_of(root)
        self.ws = ws
        self.sep = f"{ws},{ws}"
        self.max_nesting = max_nesting
        self.defs: dict[str, Any] = {}          # recursive $ref target → its fragment
        self.recursive: set[str] = set()
        self.cache: dict[str, str] = {}         # non-recursive $ref target → its regex
        self.pending: set[str] = set()          # targets compiled only in a changed form
        self.unknown: list[str] = []            # paths of ignored unknown keywords
        self.ids = self._collect_ids(root, "#")

    # ------------------------------------------------------------------ references
    def _collect_ids(self, node, path, out=None) -> dict:
        out = {} if out is None else out
        if isinstance(node, dict):
            for key in ("$id", "id", "$anchor"):
                v = node.get(key)
                if isinstance(v, str) and (key != "id" or not isinstance(node.get("type"), dict)):
                    name = v if key != "$anchor" else "#" + v
                    out.setdefault(name, path)
                    if "#" in name:
                        out.setdefault(name[name.index("#"):], path)
            for k, v in node.items():
                if k not in ("enum", "const", "examples", "default") and isinstance(v, (dict, list)):
                    self._collect_ids(v, f"{path}/{k}", out)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                self._collect_ids(v, f"{path}/{i}", out)
        return out

    def target_of(self, ref, path: str) -> str:
        """The JSON pointer (``#/...``) that ``$ref`` denotes."""
        if not isinstance(ref, str):
            raise SchemaError(f"'$ref' at {path}/$ref must be a string, got {ref!r}")
        if ref in self.ids and ref != self.ids[ref]:
            return self.ids[ref]
        root_id = self.root.get("$id", self.root.get("id"))
        if isinstance(root_id, str) and ref.startswith(root_id.split("#")[0]) and "#" in ref:
            ref = ref[ref.index("#"):]
        if not ref.startswith("#"):
            raise UnsupportedSchemaError(f"'$ref' {ref!r} at {path}/$ref: only local references "
                                         f"'#/...' (or to an '$id' in the schema) are supported")
        if ref in self.ids:
            return self.ids[ref]
        if ref not in ("#", "") and not ref.startswith("#/"):
            raise SchemaError(f"'$ref' {ref!r} at {path}/$ref does not resolve (no such anchor)")
        return ref

    def resolve(self, target: str, path: str):
        node: Any = self.root
        for part in [p for p in target[1:].split("/") if p]:
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                raise SchemaError(f"'$ref' {target!r} at {path}/$ref does not resolve")
        return node

    # ------------------------------------------------------------------ flattening
    def flatten(self, schema, path: str, refs: tuple) -> dict | Ref | None:
        """``schema`` as one normalised object without top-level ``$ref``/``allOf``/``if``
        (module docstring); a :class:`Ref` for a recursive reference; ``None`` for ``false``."""
        if schema is True:
            return {}
        if schema is False:
            return None
        if not isinstance(schema, dict):
            raise SchemaError(f"the schema at {path} must be an object or a boolean, got "
                              f"{type(schema).__name__}")
        s = normalize(schema, self.draft)
        if "$ref" in s:
            target = self.target_of(s["$ref"], path)
            rest = {k: v for k, v in s.items() if k != "$ref" and k not in ANNOTATIONS}
            if self.draft <= 7:
                rest = {}
            if target in refs or target in self.defs:
                if rest:
                    raise UnsupportedSchemaError(f"recursive '$ref' {target!r} at {path}/$ref "
                                                 f"next to the keyword(s) {sorted(rest)}")
                self.recursive.add(target)
                return Ref(target)
            node = self.resolve(target, path)
            inner = self.flatten(node, target, refs + (target,))
            if isinstance(inner, Ref) or inner is None:
                if rest and inner is not None:
                    raise UnsupportedSchemaError(f"recursive '$ref' at {path}/$ref next to "
                                                 f"the keyword(s) {sorted(rest)}")
                return inner
            inner = dict(inner)
            inner.setdefault("$ctrlg_ref", (target, refs + (target,)))
            if rest:
                inner.pop("$ctrlg_ref")
                inner = merge(inner, self.flatten(rest, path, refs) or {}, path)
            return inner
        if "allOf" in s:
            parts = s.pop("allOf")
            if not isinstance(parts, list) or not parts:
                raise SchemaError(f"'allOf' at {path}/allOf must be a non-empty list")
            out = self.flatten(s, path, refs)
            if isinstance(out, dict):
                out.pop("$ctrlg_ref", None)
            for i, part in enumerate(parts):
                # an if/then whose condition the members before it provably fail: its 'else'
                otherwise = self._else_if_fails(out, part, f"{path}/allOf/{i}", refs)
                out = self._merge_part(out, part if otherwise is None else otherwise,
                                       f"{path}/allOf/{i}", path, refs)
            return out
        if "if" in s:
            # the 'else' branch when the rest provably fails the condition (exact); otherwise
            # a subset: documents that satisfy the condition and 'then'
            rest = self.flatten(_without_conditional(s), path, refs)
            otherwise = self._else_if_fails(rest, s, path, refs)
            if otherwise is not None:
                return self.flatten(otherwise, path, refs)
            cond, then = s.pop("if"), s.pop("then", True)
            s.pop("else", None)
            return self.flatten({"allOf": [s, cond, then]}, path, refs)
        s.pop("then", None)
        s.pop("else", None)
        return s

    def _merge_part(self, out, part, part_path: str, path: str, refs: tuple):
        """``out`` merged with the flattened ``allOf`` member ``part``."""
        sub = self.flatten(part, part_path, refs)
        if sub is None:
            raise SchemaError(f"'allOf' at {part_path} is false: no value is allowed")
        if isinstance(sub, Ref) or isinstance(out, Ref):
            raise UnsupportedSchemaError(f"recursive '$ref' inside 'allOf' at {part_path}")
        sub = dict(sub)
        sub.pop("$ctrlg_ref", None)
        return merge(out, sub, f"{path}/allOf")

    def _else_if_fails(self, out, part, part_path: str, refs: tuple):
        """For a schema ``part`` with ``if``: ``part`` with its ``else`` in place of the
        condition and ``then`` when every document of ``out`` provably fails the condition
        (:func:`~ctrlg.dfa.json_schema.merge.fails`) — exactly what if/then/else means there —
        else None (flattening ``part`` then forces the condition, a subset). ``out`` is the rest
        of ``part`` itself, or, for an ``allOf`` member, the members merged before it. Typical of
        real schemas: one ``if``/``then`` per value of a discriminator; the first is forced, the
        others' conditions are then false."""
        if not isinstance(part, dict) or "if" not in part or not isinstance(out, dict):
            return None
        cond = self.flatten(part["if"], f"{part_path}/if", refs)
        if not isinstance(cond, dict) or not fails(facts(out), facts(cond)):
            return None
        return {"allOf": [_without_conditional(part), part.get("else", True)]}

    # ------------------------------------------------------------------ dispatch
    def value(self, schema, path: str, refs: tuple = ()):
        s = self.flatten(schema, path, refs)
        if s is None:
            raise SchemaError(f"the schema at {path} is false: no value is allowed")
        if isinstance(s, Ref):
            return s
        ref = s.pop("$ctrlg_ref", None)
        if ref is not None:
            target, refs = ref
            if target in self.cache:
                return self.cache[target]
            frag = self.compile(s, target, refs)
            if target in self.recursive and target not in self.defs:
                self.defs[target] = frag
                return Ref(target)
            if is_text(frag):
                self.cache[target] = frag
            return frag
        return self.compile(s, path, refs)

    def compile(self, s: dict, path: str, refs: tuple):
        for key in s:
            if key not in KNOWN and key not in ANNOTATIONS and not key.startswith("$ctrlg"):
                self.unknown.append(f"{path}/{key}")
        if "format" in s and isinstance(s["format"], str) and s["format"] not in FORMATS:
            self.unknown.append(f"{path}/format ({s['format']})")
        for key in ("anyOf", "oneOf"):
            if key in s:
                return self.alternatives(s, key, path, refs)
        if "not" in s:
            s = self.negation(s, path, refs)
        if "const" in s or "enum" in s:
            return self.enum(s, path, refs)
        kinds = self.kinds(s, path)
        alts = []
        for k in kinds:
            alts.append(getattr(self, "t_" + k)(s, path, refs))
        return alt(alts)

    def kinds(self, s: dict, path: str) -> list[str]:
        if "type" in s:
            kind = s["type"]
            kinds = kind if isinstance(kind, list) else [kind]
            if "any" in kinds:          # draft 3
                return ["any"]
            if not kinds or any(k not in TYPES for k in kinds):
                raise SchemaError(f"'type' at {path}/type must be one of {list(TYPES)} or a "
                                  f"list of them, got {kind!r}")
            if "number" in kinds and "integer" in kinds:
                kinds = [k for k in kinds if k != "integer"]
            return list(dict.fromkeys(kinds))
        # no type: generate the types the keywords constrain (a subset: any type is valid)
        keys = set(s)
        inferred = [k for k, ks in (("object", _OBJECT_KEYS), ("array", _ARRAY_KEYS),
                                    ("string", _STRING_KEYS), ("number", _NUMBER_KEYS))
                    if keys & ks]
        return inferred or ["any"]

    def t_any(self, s, path, refs):
        return self.anything(self.max_nesting)

    # ------------------------------------------------------------------ combinators
    def alternatives(self, s: dict, key: str, path: str, refs: tuple):
        options = s.pop(key)
        if not isinstance(options, list) or not options:
            raise SchemaError(f"'{key}' at {path}/{key} must be a non-empty list")
        rest = {k: v for k, v in s.items() if k not in ANNOTATIONS}
        branches = [{"allOf": [rest, o]} if rest else o for o in options]
        keep = list(range(len(branches)))
        contexts = [refs] * len(branches)
        if key == "oneOf":
            flat = []
            for i, b in enumerate(branches):
                try:
                    flat.append(self.flatten(b, f"{path}/oneOf/{i}", refs))
                except SchemaError:
                    flat.append(None)       # contradictory: never valid, excluded below
            fs = [facts(f) if isinstance(f, dict) else None for f in flat]
            # an object alternative leaves out a property that another one requires (a subset)
            for i, f in enumerate(fs):
                if f is None or not f.types <= {"object"}:
                    continue
                for j, g in enumerate(fs):
                    if j != i and g is not None and not fails(f, g):
                        names = sorted(g.required - f.required)
                        if names:
                            flat[i]["$ctrlg_forbid"] = list(flat[i].get("$ctrlg_forbid", [])) \
                                + [names[0]]
                            f.forbidden.add(names[0])

            def fails_all(i):
                return all(j == i or flat[j] is None or fs[j] is not None and fails(fs[i], fs[j])
                           for j in range(len(fs)))
            keep = [i for i in range(len(fs)) if fs[i] is not None and fails_all(i)]
            for i, f in enumerate(flat):
                if isinstance(f, dict) and "$ctrlg_forbid" in f:
                    branches[i] = dict(f)
                    marker = branches[i].pop("$ctrlg_ref", None)
                    if marker is not None:    # changed: not the target's own definition
                        contexts[i] = marker[1]
                        self.pending.add(marker[0])
            if not keep:
                raise UnsupportedSchemaError(
                    f"'oneOf' at {path}/oneOf: no alternative is provably disjoint from the "
                    f"others (a document valid for two would be invalid); use 'anyOf' if they "
                    f"may overlap")
        frags, first_error = [], None
        for i in keep:
            try:
                frags.append(self.value(branches[i], f"{path}/{key}/{i}", contexts[i]))
            except SchemaError as exc:     # an alternative we cannot express is left out
                first_error = first_error or exc
        if not frags:
            raise first_error
        return alt(frags)

    def negation(self, s: dict, path: str, refs: tuple) -> dict:
        s = dict(s)
        neg = self.flatten(s.pop("not"), f"{path}/not", refs)
        if neg is None:
            return s
        if isinstance(neg, Ref):
            raise UnsupportedSchemaError(f"'not' with a recursive '$ref' at {path}/not")
        neg = {k: v for k, v in neg.items() if k not in ANNOTATIONS and not k.startswith("$")}
        if not neg:
            raise SchemaError(f"'not' at {path}/not negates the empty schema: no value is allowed")
        if fails(facts(s), facts(neg)):
            return s
        if set(neg) == {"type"}:
            mine = type_set(s.get("type", list(TYPES)))
            left = [t for t in TYPES if t in mine - type_set(neg["type"]) and
                    not (t == "integer" and "number" in mine - type_set(neg["type"]))]
            if not left:
                raise SchemaError(f"'not' at {path}/not excludes every type allowed")
            s["type"] = left
            return s
        if set(neg) == {"required"} and isinstance(neg["required"], list):
            required = set(s.get("required", []))
            free = [n for n in neg["required"] if n not in required]
            if not free:
                raise SchemaError(f"'not' at {path}/not forbids properties that 'required' "
                                  f"demands: {neg['required']}")
            s["$ctrlg_forbid"] = list(s.get("$ctrlg_forbid", [])) + [free[0]]
            return s
        if "enum" in s or "const" in s:
            bad = {canonical(v) for v in ([neg["const"]] if "const" in neg else neg.get("enum", []))}
            if set(neg) <= {"enum", "const", "type"}:
                vals = [s["const"]] if "const" in s else s["enum"]
                s.pop("const", None)
                s["enum"] = [v for v in vals if canonical(v) not in bad]
                return s
        raise UnsupportedSchemaError(f"'not' at {path}/not: only negated types, required "
                                     f"properties, enum values or schemas disjoint from the "
                                     f"rest are supported")

    # ------------------------------------------------------------------ literals
    def enum(self, s: dict, path: str, refs: tuple):
        key = "const" if "const" in s else "enum"
        values = [s["const"]] if key == "const" else s["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError(f"'enum' at {path}/enum must be a non-empty list")
        for i, v in enumerate(values):
            _check_json_value(v, f"{path}/{key}" + (f"/{i}" if key == "enum" else ""))
        if "type" in s:
            kinds = s["type"] if isinstance(s["type"], list) else [s["type"]]
            values = [v for v in values if any(_has_type(v, k) for k in kinds)]
            if not values:
                raise SchemaError(f"no value of '{key}' at {path}/{key} has type {s['type']!r}")
        values = list({canonical(v): v for v in values}.values())
        rest = {k: v for k, v in s.items() if k in KNOWN and k not in ("enum", "const", "type")}
        if rest:  # other assertions: keep the values the rest of the schema generates
            others = self.compile({k: v for k, v in s.items() if k not in ("enum", "const")},
                                  path, refs)
            if not is_text(others):
                raise UnsupportedSchemaError(f"'{key}' next to a recursive schema at {path}")
            matcher = compile_bytes_dfa(f"(?:{others})")
            values = [v for v in values if any(
                matcher.fullmatch(json_text(v, separators=sep).encode())
                for sep in ((",", ":"), (", ", ": ")))]
            if not values:
                raise SchemaError(f"no value of '{key}' at {path}/{key} satisfies the other "
                                  f"keywords {sorted(rest)}")
        return alt([self.literal(v) for v in values])

    def literal(self, value) -> str:
        """The JSON text of ``value`` with the configured whitespace between its tokens."""
        ws = self.ws
        if isinstance(value, list):
            return rf"\[{ws}" + f"{ws},{ws}".join(self.literal(v) for v in value) + rf"{ws}\]"
        if isinstance(value, dict):
            pairs = [escape(json_text(str(k))) + f"{ws}:{ws}"
                     + self.literal(v) for k, v in value.items()]
            return rf"\{{{ws}" + f"{ws},{ws}".join(pairs) + rf"{ws}\}}"
        return escape(json_text(value))

    # ------------------------------------------------------------------ scalars
    def t_null(self, s, path, refs) -> str:
        return "null"

    def t_boolean(self, s, path, refs) -> str:
        return "(?:true|false)"

    def t_string(self, s, path, refs) -> str:
        lo = _count(s, "minLength", path, 0)
        hi = _count(s, "maxLength", path, None)
        if hi is not None and hi < lo:
            raise SchemaError(f"maxLength {hi} < minLength {lo} at {path}")
        if lo > MAX_REPEAT:
            raise UnsupportedSchemaError(f"minLength {lo} at {path}/minLength exceeds "
                                         f"{MAX_REPEAT} characters")
        if hi is not None and hi > MAX_LENGTH:
            hi = max(lo, MAX_LENGTH)   # a subset: shorter strings are valid too
        fmt = s.get("format")
        fmt = fmt if isinstance(fmt, str) and fmt in FORMATS else None
        if "pattern" in s:
            ast = pattern_ast(s["pattern"], f"{path}/pattern", escapable=True)
            if fmt is not None:       # both must hold: the one included in the other
                if included(parse(FORMATS[fmt]), ast):
                    ast = parse(FORMATS[fmt])
                elif not included(ast, parse(FORMATS[fmt])):
                    raise UnsupportedSchemaError(
                        f"'pattern' together with 'format' {fmt!r} at {path}/format: neither "
                        f"language includes the other")
        elif fmt is not None:
            ast = parse(FORMATS[fmt])
        else:
            return f'"{length_range(lo, hi)}"'
        fitted = fit_length(ast, lo, float("inf") if hi is None else hi)
        if fitted is None:
            what = "pattern" if "pattern" in s else "format"
            raise UnsupportedSchemaError(
                f"'{what}' at {path}/{what} with minLength {lo} / maxLength {hi}: no string of "
                f"the {what} was found within the length bounds")
        return '"' + ast_to_regex(fitted, json_escapes=True) + '"'

    def _bounds(self, s, path) -> Bounds:
        b = Bounds()
        for key in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
            if key in s:
                v = s[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise SchemaError(f"'{key}' at {path}/{key} must be a number, got {v!r}")
        s = _finite_bounds(s, path)
        for key, excl in (("minimum", False), ("exclusiveMinimum", True)):
            if key in s and (b.lo is None or s[key] > b.lo or s[key] == b.lo and excl):
                b.lo, b.lo_excl = s[key], excl
        for key, excl in (("maximum", False), ("exclusiveMaximum", True)):
            if key in s and (b.hi is None or s[key] < b.hi or s[key] == b.hi and excl):
                b.hi, b.hi_excl = s[key], excl
        if b.lo is not None and b.hi is not None and (b.lo > b.hi or b.lo == b.hi and
                                                      (b.lo_excl or b.hi_excl)):
            lo_key = "exclusiveMinimum" if b.lo_excl else "minimum"
            raise SchemaError(f"{lo_key} {b.lo!r} > maximum {b.hi!r} at {path}/{lo_key}: no "
                              f"number lies within the bounds")
        return b

    def t_integer(self, s, path, refs) -> str:
        b = self._bounds(s, path)
        if "multipleOf" in s:
            return multiples(s["multipleOf"], b, True, path)
        return integer_range(b, path)

    def t_number(self, s, path, refs) -> str:
        b = self._bounds(s, path)
        if "multipleOf" in s:
            return multiples(s["multipleOf"], b, False, path)
        return number_range(b, path)

    # ------------------------------------------------------------------ arrays
    def finite_values(self, schema, path, refs):
        """The values of an item schema when it is a small finite set (enum, const, boolean,
        null), else ``None``."""
        try:
            f = self.flatten(schema, path, refs)
        except SchemaError:
            return None
        if not isinstance(f, dict) or set(f) - ANNOTATIONS - {"type", "enum", "const",
                                                              "$ctrlg_ref"}:
            return None
        if "const" in f or "enum" in f:
            vals = [f["const"]] if "const" in f else f["enum"]
            if "type" in f:
                kinds = f["type"] if isinstance(f["type"], list) else [f["type"]]
                vals = [v for v in vals if any(_has_type(v, k) for k in kinds)]
            return list({canonical(v): v for v in vals}.values())
        kinds = f.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if kinds and set(kinds) <= {"boolean", "null"}:
            return [v for k in kinds for v in ([False, True] if k == "boolean" else [None])]
        return None

    def t_array(self, s, path, refs):
        lo = _count(s, "minItems", path, 0)
        hi = _count(s, "maxItems", path, None)
        if hi is not None and hi < lo:
            raise SchemaError(f"maxItems {hi} < minItems {lo} at {path}")
        ws, sep = self.ws, self.sep
        prefix = list(s.get("prefixItems", []))
        if not isinstance(prefix, list):
            raise SchemaError(f"'prefixItems' at {path}/prefixItems must be a list")
        items = s.get("items", True)
        if "contains" in s and s.get("minContains", 1) > 0:
            if s.get("minContains", 1) > 1 or "maxContains" in s:
                raise UnsupportedSchemaError(f"'minContains'/'maxContains' at {path}")
            # subset: the first item satisfies 'contains'
            first = prefix[0] if prefix else items
            prefix = [{"allOf": [first, s["contains"]]}] + prefix[1:]
            lo = max(lo, 1)
        if s.get("uniqueItems") is True and (hi is None or hi > 1):
            return self.unique_array(s, prefix, items, lo, hi, path, refs)
        heads = [self.value(x, f"{path}/prefixItems/{i}", refs) for i, x in enumerate(prefix)]
        tail = None if items is False else self.value(items, f"{path}/items", refs)
        max_count = hi
        if tail is None:
            max_count = len(heads) if hi is None else min(hi, len(heads))
        elif _size(tail) > LARGE:       # a subset: at most one item beyond the prefix
            cap = max(lo, len(heads) + 1)
            max_count = cap if max_count is None else min(max_count, cap)
        elif (max_count is not None and max_count - len(heads) > 1
              and _positions(tail) * (max_count - len(heads)) > MAX_ITEM_POSITIONS):
            # a subset: a counter copies the item once per place; keep the copies under
            # MAX_ITEM_POSITIONS regex positions (never below minItems)
            fit = max(1, MAX_ITEM_POSITIONS // _positions(tail))
            max_count = min(max_count, max(lo, len(heads) + fit))
        if max_count is not None and max_count < lo:
            raise SchemaError(f"the array at {path} cannot have {lo} items")
        alternatives = []
        for n in range(max(lo, 1), min(len(heads), max_count if max_count is not None
                                       else len(heads)) + 1):
            alternatives.append(seq(*_join(heads[:n], sep)))
        if tail is not None and (max_count is None or max_count > len(heads)):
            extra_lo = max(lo - len(heads), 1)
            extra_hi = None if max_count is None else max_count - len(heads)
            more = rep(seq(sep, tail), extra_lo - 1, None if extra_hi is None else extra_hi - 1)
            alternatives.append(seq(*_join(heads + [tail], sep), more))
        if not alternatives:
            return rf"\[{ws}\]"
        body = alt(alternatives)
        return seq(rf"\[{ws}", body if lo > 0 else rep(body, 0, 1), rf"{ws}\]")

    def unique_array(self, s, prefix, items, lo, hi, path, refs):
        """``uniqueItems``: items drawn without repetition from a finite item set, in the
        order of that set (a subset); otherwise arrays of at most one item (a subset)."""
        ws, sep = self.ws, self.sep
        values = None if prefix else self.finite_values(items, f"{path}/items", refs)
        if values is None:
            if lo > 1:
                raise UnsupportedSchemaError(
                    f"'uniqueItems' at {path}/uniqueItems with minItems {lo}: distinct items "
                    f"are only generated from a finite item set (enum, const, boolean)")
            return self.t_array({**s, "uniqueItems": False, "maxItems": 1}, path, refs)
        n = len(values)
        top = n if hi is None else min(hi, n)
        if lo > top:
            raise SchemaError(f"the array at {path} cannot have {lo} distinct items (only {n} "
                              f"values are allowed)")
        lits = [self.literal(v) for v in values]
        if lo <= 1 and top == n:     # every ordered subset: members-style, quadratic in n
            size = sum(len(x) for x in lits)
            firsts = range(n) if size * n <= 4 * LARGE else range(1)
            body = alt([seq(lits[k], *[rep(seq(sep, x), 0, 1) for x in lits[k + 1:]])
                        for k in firsts] + ([] if len(firsts) == n else [alt(lits)]))
            return seq(rf"\[{ws}", body if lo == 1 else rep(body, 0, 1), rf"{ws}\]")
        combos = [c for k in range(lo, top + 1) for c in combinations(range(n), k)]
        if len(combos) > 500:
            raise UnsupportedSchemaError(f"'uniqueItems' at {path}/uniqueItems: too many "
                                         f"subsets of {n} values with {lo}..{top} items")
        return alt([seq(rf"\[{ws}", *_join([lits[i] for i in c], sep), rf"{ws}\]")
                    for c in combos])

    # ------------------------------------------------------------------ objects
    def t_object(self, s, path, refs):
        ws, sep = self.ws, self.sep
        props = s.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError(f"'properties' at {path}/properties must be an object")
        props = dict(props)
        required = s.get("required", [])
        if isinstance(required, bool):      # draft 3's boolean 'required': not an assertion
            required = []
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(f"'required' at {path}/required must be a list of names")
        required = list(dict.fromkeys(required))
        extra = s.get("additionalProperties")
        patterns = s.get("patternProperties", {}) or {}
        forbidden = set(s.get("$ctrlg_forbid", []))
        # dependentRequired: exact when the property is required, else the property is left out
        deps = s.get("dependentRequired", {}) or {}
        deps_s = s.get("dependentSchemas", {}) or {}
        changed = True
        while changed:
            changed = False
            for name, names in deps.items():
                if name in required:
                    for d in names:
                        if d not in required:
                            required.append(d)
                            changed = True
        for name in list(deps) + list(deps_s):
            if name not in required:
                forbidden.add(name)
        for name, sub in deps_s.items():
            if name in required:      # exact: the dependent schema applies
                rest = dict(s)
                rest["dependentSchemas"] = {k: v for k, v in deps_s.items() if k != name}
                sub = self.flatten(sub, f"{path}/dependentSchemas/{_pointer(name)}", refs)
                if sub is None or isinstance(sub, Ref):
                    raise UnsupportedSchemaError(f"'dependentSchemas' at {path}/"
                                                 f"dependentSchemas/{_pointer(name)}")
                sub.pop("$ctrlg_ref", None)
                return self.compile(merge(rest, sub, path), path, refs)
        for name in required:
            if name in forbidden:
                raise SchemaError(f"required property {name!r} at {path}/required is also "
                                  f"excluded ('not')")
        # declared properties take the schemas of the patterns they match
        pattern_re = {}
        for pat in patterns:
            try:
                pattern_re[pat] = re.compile(pat)
            except re.error as exc:
                raise UnsupportedSchemaError(f"'patternProperties' pattern {pat!r} at "
                                             f"{path}/patternProperties: {exc}") from None
        for name in required:
            if name not in props:
                matched = [patterns[p] for p, r in pattern_re.items() if r.search(name)]
                if matched:
                    props[name] = True
                elif extra is False:
                    raise SchemaError(f"required property {name!r} at {path}/required is not "
                                      f"declared and additionalProperties is false")
                else:
                    props[name] = extra if isinstance(extra, (dict, bool)) else True
        for name in list(props):
            matched = [patterns[p] for p, r in pattern_re.items() if r.search(name)]
            if matched:
                props[name] = {"allOf": [props[name]] + matched}
        names_check = s.get("propertyNames")
        key_regex = None
        if names_check is not None and names_check is not True:
            key_regex = self.value({"allOf": [names_check, {"type": "string"}]},
                                   f"{path}/propertyNames", refs)
            matcher = compile_bytes_dfa(key_regex)
            for name in list(props):
                if not matcher.fullmatch(json_text(name).encode()):
                    if name in required:
                        raise SchemaError(f"required property {name!r} at {path}/required "
                                          f"does not satisfy 'propertyNames'")
                    forbidden.add(name)
        # members in the order of 'properties'; optional ones we cannot express are left out
        members = []
        for name, sub in props.items():
            if name in forbidden:
                continue
            key = escape(json_text(name))
            try:
                frag = self.value(sub, f"{path}/properties/{_pointer(name)}", refs)
            except SchemaError:     # an optional property we cannot (or may never) write
                if name in required:
                    raise
                continue
            members.append((seq(f"{key}{ws}:{ws}", frag), name in required))
        lo = _count(s, "minProperties", path, 0)
        hi = _count(s, "maxProperties", path, None)
        n_req = sum(r for _, r in members)
        if hi is not None and n_req > hi:
            raise SchemaError(f"maxProperties {hi} at {path}/maxProperties is below the "
                              f"{n_req} required properties")
        if hi is not None:          # a subset: the first optional ones that fit
            room = hi - n_req
            kept = []
            for m, r in members:
                if r or room > 0:
                    kept.append((m, r))
                    room -= 0 if r else 1
            members = kept
        # additional members: a map without declared properties, or a schema beside them
        pair = self.extra_pair(s, props, forbidden, patterns, pattern_re, key_regex, path, refs)
        n_all = len(members)
        promote = max(0, lo - n_req)
        if promote:                  # a subset: the first optional members become required
            out = []
            for m, r in members:
                if not r and promote:
                    r, promote = True, promote - 1
                out.append((m, r))
            members = out
        extra_lo = promote
        if extra_lo > 1 or extra_lo and pair is None:
            raise UnsupportedSchemaError(
                f"minProperties {lo} at {path}/minProperties exceeds the {n_all} declared "
                f"properties (distinct additional names are not generated)")
        extra_hi = None
        if hi is not None:
            extra_hi = max(0, hi - len(members))
            if extra_hi < extra_lo:
                raise SchemaError(f"the object at {path} cannot have between {lo} and {hi} "
                                  f"properties")
        items = [(m, 1 if r else 0, 1) for m, r in members]
        if pair is not None and extra_hi != 0:
            if _size(pair) > LARGE:
                extra_hi = 1 if extra_hi is None else min(extra_hi, 1)
            items.append((pair, extra_lo, extra_hi))
        return seq(rf"\{{{ws}", self.members(items), rf"{ws}\}}")

    def extra_pair(self, s, props, forbidden, patterns, pattern_re, key_regex, path, refs):
        """The regex of one additional member, or ``None`` when none is generated: names of
        ``patternProperties`` that no declared name matches (their value satisfying every
        pattern's schema), else names outside the declared ones for an
        ``additionalProperties`` schema, else any name for a map without properties."""
        ws, extra = self.ws, s.get("additionalProperties")
        taken = set(props) | forbidden
        names = value = None
        try:
            if patterns:
                # a name of pattern p also takes the schemas of the patterns it may match
                asts = {p: pattern_ast(p, f"{path}/patternProperties") for p in patterns}
                pairs = []
                for p in patterns:
                    if any(pattern_re[p].search(n) for n in taken) or key_regex is not None:
                        continue
                    overlapping = [patterns[q] for q in patterns
                                   if q == p or not disjoint(asts[p], asts[q])]
                    try:
                        v = self.value({"allOf": overlapping},
                                       f"{path}/patternProperties/{_pointer(p)}", refs)
                    except SchemaError:
                        continue
                    pairs.append(seq('"' + ast_to_regex(asts[p]) + '"', f"{ws}:{ws}", v))
                return alt(pairs) if pairs else None
            if extra is False:
                return None
            elif key_regex is not None:
                names = key_regex if not taken else None
            elif not taken:
                names = STRING
            elif isinstance(extra, dict) and extra:
                names = '"' + names_except(taken) + '"'
            if names is not None and value is None:
                value = (self.anything(self.max_nesting - 1) if extra in (None, True, {})
                         else self.value(extra, f"{path}/additionalProperties", refs))
        except SchemaError:      # additional members are optional: leave them out
            return None
        return None if names is None else seq(names, f"{ws}:{ws}", value)

    def members(self, items):
        """The members ``(fragment, min, max)`` in order with separators: exact around the
        first mandatory member (those before it are ``(m,)?``, those after ``(,m)?``);
        without one, an alternative per first member while that stays under :data:`LARGE`,
        else only the first member may come first (a subset)."""
        sep = self.sep
        if not items:
            return ""

        def after(i):
            return [rep(seq(sep, f), a, b) for f, a, b in items[i:]]

        def head(k):
            f, a, b = items[k]
            return seq(f, rep(seq(sep, f), max(a - 1, 0), None if b is None else b - 1))

        first = next((k for k, (_, a, _) in enumerate(items) if a >= 1), None)
        if first is not None:
            before = [rep(seq(f, sep), a, b) for f, a, b in items[:first]]
            return seq(*before, head(first), *after(first + 1))
        total = sum(_size(f) for f, _, _ in items)
        firsts = range(len(items)) if total * len(items) <= 4 * LARGE else range(1)
        return rep(alt([seq(head(k), *after(k + 1)) for k in firsts]), 0, 1)

    def anything(self, depth: int) -> str:
        """Any JSON value with containers nested at most ``depth`` levels."""
        scalars = [STRING, r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?",
                   "true", "false", "null"]
        if depth <= 0:
            return "(?:" + "|".join(scalars) + ")"
        ws = self.ws
        inner = self.anything(depth - 1)
        array = rf"\[{ws}(?:{inner}(?:{ws},{ws}{inner})*)?{ws}\]"
        pair = f"{STRING}{ws}:{ws}{inner}"
        obj = rf"\{{{ws}(?:{pair}(?:{ws},{ws}{pair})*)?{ws}\}}"
        return "(?:" + "|".join(scalars + [array, obj]) + ")"


def _join(frags, sep):
    out = []
    for i, f in enumerate(frags):
        if i:
            out.append(sep)
        out.append(f)
    return out


def _pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


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
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise SchemaError(f"'{key}' at {path}/{key} must be a non-negative integer, got {v!r}")
    return v
