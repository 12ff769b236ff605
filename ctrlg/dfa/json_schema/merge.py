"""Reading JSON Schema drafts 4 to 2020-12 into one form, ``allOf`` merging, and the disjointness
test behind ``oneOf``.

* :func:`draft_of` reads ``$schema`` (default 2020-12); :func:`normalize` rewrites one schema
  object's draft-specific keywords into the 2020-12 ones: draft-4 boolean
  ``exclusiveMinimum``/``exclusiveMaximum`` become numbers, ``items`` as an array becomes
  ``prefixItems`` (with ``additionalItems`` as ``items``), ``dependencies`` splits into
  ``dependentRequired`` / ``dependentSchemas``, ``unevaluatedProperties``/``unevaluatedItems``
  stand for ``additionalProperties``/``items`` where those are absent (every property or item the
  compiler generates is then evaluated).
* :func:`merge` is the intersection of two schema objects (``allOf``) as one object: types
  intersect (``integer`` within ``number``), bounds tighten, ``required`` and ``properties`` unite
  (a property in both becomes ``{"allOf": [a, b]}``), ``enum``/``const`` intersect, and each
  side's ``additionalProperties`` is carried into the properties and patterns of the other side
  that it governs. Exact; a pair it cannot express as one object (two different ``pattern``\\ s,
  two ``not``) raises :class:`~ctrlg.errors.UnsupportedSchemaError`, and contradictions (disjoint
  types or values) raise :class:`~ctrlg.errors.SchemaError`.
* :func:`fails` decides conservatively that no document valid for one schema validates another
  (different types, disjoint values, a required property whose constant differs, a property
  one side requires and the other never has). ``oneOf`` keeps the alternatives that fail every
  other one: exact when all alternatives are pairwise disjoint, a subset otherwise.
"""

from __future__ import annotations

import json
import math
import re

from ctrlg.errors import SchemaError, UnsupportedSchemaError

__all__ = ["draft_of", "normalize", "merge", "facts", "fails", "canonical", "ANNOTATIONS",
           "KNOWN", "TYPES"]

TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")
ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "id", "$comment",
               "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "$anchor",
               "contentMediaType", "contentEncoding", "contentSchema", "$vocabulary",
               "$dynamicAnchor", "$recursiveAnchor", "format"}
KNOWN = {"type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
         "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
         "uniqueItems", "maxProperties", "minProperties", "required", "dependentRequired",
         "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas",
         "prefixItems", "items", "contains", "minContains", "maxContains", "properties",
         "patternProperties", "additionalProperties", "propertyNames", "$ref",
         "additionalItems", "dependencies", "unevaluatedProperties", "unevaluatedItems"}
_ALL_TYPES = frozenset({"null", "boolean", "integer", "number", "string", "array", "object"})


def draft_of(root) -> int:
    """The draft number of ``$schema``: 3, 4, 6, 7, 2019 or 2020 (default)."""
    uri = root.get("$schema", "") if isinstance(root, dict) else ""
    for key, draft in (("draft-04", 4), ("draft-03", 3), ("draft-06", 6), ("draft-07", 7),
                       ("2019-09", 2019), ("2020-12", 2020)):
        if key in str(uri):
            return draft
    return 2020


def normalize(schema: dict, draft: int) -> dict:
    """``schema`` with draft-specific keywords rewritten (module docstring)."""
    s = dict(schema)
    if draft == 3:        # property-level boolean 'required', 'divisibleBy', 'extends'
        props = s.get("properties")
        if isinstance(props, dict):
            names = [n for n, sub in props.items() if isinstance(sub, dict)
                     and sub.get("required") is True]
            if names:
                s["required"] = names
        if isinstance(s.get("required"), bool):
            s.pop("required")
        if "divisibleBy" in s:
            s["multipleOf"] = s.pop("divisibleBy")
        if "extends" in s:
            ext = s.pop("extends")
            s["allOf"] = ext if isinstance(ext, list) else [ext]
    if draft <= 4:
        for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if isinstance(s.get(key), bool):
                flag = s.pop(key)
                if flag and bound in s:
                    s[key] = s.pop(bound)
    if isinstance(s.get("items"), list):
        s["prefixItems"] = s.pop("items")
        if "additionalItems" in s:
            s["items"] = s.pop("additionalItems")
    else:
        s.pop("additionalItems", None)      # ignored unless items is an array
    if "dependencies" in s:
        deps = s.pop("dependencies")
        if isinstance(deps, dict):
            req = dict(s.get("dependentRequired", {}))
            sch = dict(s.get("dependentSchemas", {}))
            for name, dep in deps.items():
                (req if isinstance(dep, list) else sch)[name] = dep
            if req:
                s["dependentRequired"] = req
            if sch:
                s["dependentSchemas"] = sch
    if "unevaluatedProperties" in s:
        s.setdefault("additionalProperties", s.pop("unevaluatedProperties"))
    if "unevaluatedItems" in s:
        u = s.pop("unevaluatedItems")
        if "items" not in s:
            s["items"] = u
    return s


def canonical(value) -> str:
    """A key for JSON equality (``1 == 1.0``; ``true`` ≠ ``1``)."""
    def norm(v):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, list):
            return [norm(x) for x in v]
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        return v
    return json.dumps(norm(value), sort_keys=True)


def type_set(kind) -> set[str]:
    kinds = kind if isinstance(kind, list) else [kind]
    out = set()
    for k in kinds:
        out |= {"integer", "number"} if k == "number" else {k}
    return out


def _types_back(types: set[str]) -> list[str]:
    out = [t for t in TYPES if t in types and t != "integer"]
    if "integer" in types and "number" not in types:
        out.append("integer")
    return out


def _both(a, b):
    return {"allOf": [a, b]}


def merge(a: dict, b: dict, path: str) -> dict:
    """The intersection of schema objects ``a`` and ``b`` as one object (module docstring)."""
    out = dict(a)
    for key, vb in b.items():
        if key not in out:
            out[key] = vb
            continue
        va = out[key]
        if va == vb:
            continue
        if key == "type":
            types = type_set(va) & type_set(vb)
            if not types:
                raise SchemaError(f"'allOf' at {path} requires types {va!r} and {vb!r} at once: "
                                  f"no value has both")
            kinds = _types_back(types)
            out[key] = kinds[0] if len(kinds) == 1 else kinds
        elif key in ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties",
                     "minContains"):
            out[key] = max(va, vb)
        elif key in ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties",
                     "maxContains"):
            out[key] = min(va, vb)
        elif key == "uniqueItems":
            out[key] = bool(va) or bool(vb)
        elif key == "required":
            out[key] = list(dict.fromkeys(list(va) + list(vb)))
        elif key in ("enum", "const"):
            pass  # intersected below
        elif key == "multipleOf":
            if all(isinstance(v, int) or float(v).is_integer() for v in (va, vb)):
                out[key] = math.lcm(int(va), int(vb))
            else:
                raise UnsupportedSchemaError(f"two different 'multipleOf' ({va!r}, {vb!r}) "
                                             f"under 'allOf' at {path}")
        elif key in ("properties", "patternProperties", "dependentSchemas"):
            merged = dict(va)
            for name, sub in vb.items():
                merged[name] = _both(merged[name], sub) if name in merged else sub
            out[key] = merged
        elif key == "dependentRequired":
            merged = dict(va)
            for name, names in vb.items():
                merged[name] = list(dict.fromkeys(list(merged.get(name, [])) + list(names)))
            out[key] = merged
        elif key in ("additionalProperties", "items", "contains", "propertyNames"):
            out[key] = _both(va, vb)
        elif key == "prefixItems":
            n = max(len(va), len(vb))
            tail_a, tail_b = a.get("items", True), b.get("items", True)
            out[key] = [_both(va[i] if i < len(va) else tail_a, vb[i] if i < len(vb) else tail_b)
                        for i in range(n)]
        elif key in ("anyOf", "oneOf"):
            if len(va) * len(vb) > 64:
                raise UnsupportedSchemaError(f"two '{key}' of {len(va)} and {len(vb)} "
                                             f"alternatives under 'allOf' at {path}")
            out[key] = [_both(x, y) for x in va for y in vb]
        elif key in ANNOTATIONS or key not in KNOWN:
            continue
        else:
            raise UnsupportedSchemaError(f"two different {key!r} ({va!r:.60}, {vb!r:.60}) under "
                                         f"'allOf' at {path}: their intersection is not supported")
    values = None
    for side in (a, b):
        for key in ("const", "enum"):
            if key in side:
                vs = [side[key]] if key == "const" else list(side[key])
                values = vs if values is None else [v for v in values
                                                     if canonical(v) in {canonical(x) for x in vs}]
    if values is not None:
        out.pop("const", None)
        if not values:
            raise SchemaError(f"'allOf' at {path}: no value of 'enum'/'const' satisfies every "
                              f"member")
        out["enum"] = values
    # additionalProperties of one side governs the other side's extra properties and patterns
    for this, other in ((a, b), (b, a)):
        extra = this.get("additionalProperties")
        if extra is None or extra is True or extra == {}:
            continue
        mine = set(this.get("properties", {}))
        for name in other.get("properties", {}):
            if name not in mine and not _matches_any(name, this.get("patternProperties", {})):
                out["properties"] = dict(out["properties"])
                out["properties"][name] = _both(out["properties"][name], extra)
        for pat in other.get("patternProperties", {}):
            if pat not in this.get("patternProperties", {}):
                out["patternProperties"] = dict(out["patternProperties"])
                out["patternProperties"][pat] = _both(out["patternProperties"][pat], extra)
    return out


def _matches_any(name: str, patterns) -> bool:
    for pat in patterns:
        try:
            if re.search(pat, name):
                return True
        except re.error:
            return True     # conservatively: it might match
    return False


# ---------------------------------------------------------------------- oneOf disjointness
class Facts:
    """What every valid document of a schema satisfies (a conservative summary)."""

    def __init__(self):
        self.types: frozenset = _ALL_TYPES
        self.values: dict | None = None       # canonical → value, when finite
        self.interval = (-math.inf, math.inf)
        self.required: set = set()
        self.prop_values: dict = {}           # property → canonical set (finite)
        self.declared: set = set()
        self.closed = False                   # no property beyond the declared ones
        self.never_extra = False              # the compiler generates only declared ones
        self.forbidden: set = set()           # names the compiler never generates


def _value_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or isinstance(v, float) and v.is_integer():
        return "integer"
    if isinstance(v, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(v)]


def facts(schema) -> Facts:
    f = Facts()
    if not isinstance(schema, dict):
        return f
    if "type" in schema:
        f.types = frozenset(type_set(schema["type"]))
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            f.types &= frozenset().union(*(facts(a).types for a in schema[key]))
    vals = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(vals, list):
        f.values = {canonical(v): v for v in vals if _value_type(v) in f.types}
        f.types = frozenset(_value_type(v) for v in f.values.values())
    lo = max([schema[k] for k in ("minimum", "exclusiveMinimum") if _is_num(schema.get(k))],
             default=-math.inf)
    hi = min([schema[k] for k in ("maximum", "exclusiveMaximum") if _is_num(schema.get(k))],
             default=math.inf)
    f.interval = (lo, hi)
    props = schema.get("properties", {}) if isinstance(schema.get("properties"), dict) else {}
    f.required = set(r for r in schema.get("required", []) if isinstance(r, str))
    f.declared = set(props) | f.required
    for name, sub in props.items():
        values = _finite_values(sub)
        if values is not None:
            f.prop_values[name] = values
    extra = schema.get("additionalProperties")
    f.closed = extra is False and not schema.get("patternProperties")
    f.forbidden = set(schema.get("$ctrlg_forbid", []))
    f.never_extra = f.closed or (bool(props) and extra in (None, True, {})
                                 and not schema.get("patternProperties"))
    return f


def _finite_values(schema) -> set | None:
    """A finite set of canonical values that includes every value valid for ``schema``, from its
    ``const``/``enum`` and those of its ``allOf`` members (intersected: a value must satisfy all),
    or None when none of them is finite. Cost: linear in the values."""
    if not isinstance(schema, dict):
        return None
    sets = []
    vals = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(vals, list):
        sets.append({canonical(v) for v in vals})
    members = schema.get("allOf")
    for member in members if isinstance(members, list) else ():
        inner = _finite_values(member)
        if inner is not None:
            sets.append(inner)
    return set.intersection(*sets) if sets else None


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def fails(fi: Facts, fj: Facts) -> bool:
    """True when no document valid for ``i`` (and generated by the compiler) validates ``j``."""
    if not fi.types & fj.types:
        return True
    if fi.values is not None:
        return all(_value_type(v) not in fj.types
                   or fj.values is not None and c not in fj.values
                   or _is_num(v) and not fj.interval[0] <= v <= fj.interval[1]
                   for c, v in fi.values.items())
    if fi.types <= {"integer", "number"}:
        if fi.interval[1] < fj.interval[0] or fj.interval[1] < fi.interval[0]:
            return True
    if fi.types <= {"object"}:
        for p in fi.required:
            if p in fi.prop_values and p in fj.prop_values and \
                    not fi.prop_values[p] & fj.prop_values[p]:
                return True
            if fj.closed and p not in fj.declared:
                return True
        if any(p in fi.forbidden or fi.never_extra and p not in fi.declared
               for p in fj.required):
            return True
    return False
