"""JSON Schema features of real-world schemas (drafts 4 to 2020-12): unknown keywords, formats,
``anyOf``/``oneOf`` beside siblings, ``allOf`` merging, ``patternProperties``, dependencies,
``uniqueItems``, ``pattern`` with lengths, undeclared required properties, number bounds,
``multipleOf``, ``if``/``then``, ``not``, ``propertyNames``, ``$id`` references and recursive
``$ref`` (a grammar constraint). Every document sampled from the compiled automaton validates
with ``jsonschema`` (the schema's draft, formats checked where jsonschema can); bad schemas give
errors naming the keyword and its JSON path."""

import json
import re
import warnings

import numpy as np
import pytest

from ctrlg import dfa
from ctrlg.dfa.cfg.earley import DEAD
from ctrlg.dfa.bytes_dfa import compile_bytes_dfa
from ctrlg.dfa.json_schema import schema_to_grammar, schema_to_regex
from ctrlg.dfa.vocab_trie import VocabTrie
from ctrlg.errors import SchemaError, UnsupportedSchemaError
from test_json_schema import sample_strings

jsonschema = pytest.importorskip("jsonschema")

D4 = "http://json-schema.org/draft-04/schema#"
D7 = "http://json-schema.org/draft-07/schema#"
CASES = {
    "unknown_keywords": {
        "type": "object", "self": {"vendor": "x"}, "id": "thing", "_format": "y",
        "x-kubernetes-preserve-unknown-fields": True, "recommended": ["a"],
        "properties": {"a": {"type": "array", "format": "table", "items": {"type": "integer"},
                             "maxItems": 3}},
        "required": ["a"]},
    "formats": {"type": "object", "required": list("abcdefghijkl"), "properties": {
        k: {"type": "string", "format": f} for k, f in zip("abcdefghijkl", [
            "uri", "uri-reference", "email", "hostname", "ipv4", "ipv6", "byte", "date-time",
            "date", "time", "duration", "uuid"])}},
    "anyof_beside_type": {"type": ["string", "integer"],
                          "anyOf": [{"type": "string", "maxLength": 3}, {"minimum": 5}]},
    "oneof_disjoint": {"oneOf": [{"type": "string"}, {"type": "integer"},
                                 {"type": "object", "properties": {"k": {"const": "a"}},
                                  "required": ["k"]}]},
    "oneof_discriminator": {"type": "object", "oneOf": [
        {"properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
         "required": ["kind", "r"]},
        {"properties": {"kind": {"const": "square"}, "side": {"type": "integer"}},
         "required": ["kind"]}]},
    "oneof_enum_beside_typed_properties": {   # the alternatives narrow the parent's typed properties
        "type": "object", "additionalProperties": False,
        "properties": {"grant": {"type": "string"}, "response": {"type": "string"}},
        "oneOf": [{"properties": {"grant": {"enum": ["code"]}, "response": {"enum": ["c"]}},
                   "required": ["grant"]},
                  {"properties": {"grant": {"enum": ["token"]}, "response": {"enum": ["t"]}},
                   "required": ["grant"]}]},
    "if_then_per_discriminator": {   # one if/then per value of "kind", inside allOf
        "type": "object", "properties": {"kind": {"enum": ["a", "b", "c"]}}, "required": ["kind"],
        "allOf": [
            {"if": {"properties": {"kind": {"const": "a"}}},
             "then": {"properties": {"kind": {"const": "a"}, "name": {"type": "string", "maxLength": 3}},
                      "required": ["name"], "additionalProperties": False}},
            {"if": {"properties": {"kind": {"const": "b"}}},
             "then": {"properties": {"kind": {"const": "b"}, "pkg": {"type": "integer"}},
                      "required": ["pkg"], "additionalProperties": False},
             "else": {"properties": {"tag": {"type": "boolean"}}}}]},
    "if_false_takes_else": {   # the condition contradicts the rest: 'else' must hold
        "type": "object", "properties": {"k": {"const": 1}}, "required": ["k"],
        "if": {"properties": {"k": {"const": 2}}, "required": ["k"]},
        "then": {"properties": {"k": {"const": 2}}},
        "else": {"properties": {"z": {"type": "integer", "minimum": 5}}, "required": ["z"]}},
    "pattern_with_min_length_only": {"type": "string", "pattern": "^[a-z_.]+$", "minLength": 3},
    "oneof_overlapping_subset": {"oneOf": [{"type": "string", "maxLength": 2},
                                           {"type": "integer", "minimum": 0},
                                           {"type": "integer", "maximum": 5}]},
    "oneof_required_sets": {"type": "object", "properties": {
        "r": {"type": "number"}, "w": {"type": "number"}, "h": {"type": "number"}},
        "oneOf": [{"required": ["r"]}, {"required": ["w", "h"]}]},
    "oneof_nested_anyof": {"oneOf": [
        {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "null"}]},
        {"type": "object", "properties": {"id": {"type": "string", "maxLength": 2}}}]},
    "allof_several": {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"properties": {"b": {"type": "string", "maxLength": 3}}, "required": ["b"]},
        {"properties": {"a": {"minimum": 3, "maximum": 7}}}]},
    "allof_closed": {"allOf": [
        {"properties": {"a": {"type": "integer"}}, "additionalProperties": False},
        {"properties": {"b": {"type": "string"}}}], "type": "object"},
    "pattern_properties": {
        "type": "object", "properties": {"x_a": {"type": "integer"}},
        "patternProperties": {"^x_": {"minimum": 0}, "^y_[a-z]{1,3}$": {"type": "boolean"}},
        "additionalProperties": False},
    "additional_schema": {"type": "object", "properties": {"a": {"type": "string"}},
                          "additionalProperties": {"type": "integer"}, "maxProperties": 3},
    "dependencies_d7": {"$schema": D7, "type": "object",
                        "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                       "c": {"type": "null"}, "d": {"type": "boolean"}},
                        "required": ["a"],
                        "dependencies": {"a": ["b"], "c": {"required": ["d"]},
                                         "d": {"properties": {"b": {"maxLength": 1}}}}},
    "dependent_2020": {"type": "object", "properties": {"a": {"type": "integer"}},
                       "required": ["a"], "dependentRequired": {"a": ["z"]},
                       "dependentSchemas": {"a": {"properties": {"a": {"maximum": 3}}}}},
    "unique_enum": {"type": "array", "items": {"enum": ["r", "g", "b"]}, "uniqueItems": True},
    "unique_bool_counts": {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True,
                           "minItems": 2},
    "unique_strings": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    "pattern_lengths": {"type": "object", "required": ["a", "b", "c"], "properties": {
        "a": {"type": "string", "pattern": "^[a-z]+$", "minLength": 3, "maxLength": 6},
        "b": {"type": "string", "pattern": "ab", "minLength": 3, "maxLength": 4},
        "c": {"type": "string", "format": "date", "maxLength": 20}}},
    "pattern_and_format": {"type": "string", "format": "ipv4", "pattern": "^[0-9.]+$"},
    "draft3_required": {"$schema": "http://json-schema.org/draft-03/schema#", "type": "object",
                        "properties": {"a": {"type": "integer", "required": True},
                                       "b": {"type": "string", "format": "regex"}}},
    "required_undeclared": {"type": "object", "properties": {"a": {"type": "integer"}},
                            "required": ["a", "b"]},
    "min_max_properties": {"type": "object", "properties": {k: {"type": "null"} for k in "abcd"},
                           "minProperties": 2, "maxProperties": 3},
    "number_bounds": {"type": "array", "prefixItems": [
        {"type": "number", "exclusiveMinimum": 0, "maximum": 1.5},
        {"type": "number", "minimum": 0.1, "maximum": 0.35},
        {"type": "number", "exclusiveMinimum": -2, "exclusiveMaximum": 2}],
        "minItems": 3, "items": False},
    "multiple_of": {"type": "array", "prefixItems": [
        {"type": "integer", "multipleOf": 7, "minimum": 10},
        {"type": "number", "multipleOf": 0.25, "maximum": 2},
        {"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 1}],
        "minItems": 3, "items": False},
    "draft4_exclusive": {"$schema": D4, "type": "integer", "minimum": 0,
                         "exclusiveMinimum": True, "maximum": 3, "exclusiveMaximum": False},
    "tuple_d7": {"$schema": D7, "type": "array", "items": [{"type": "integer"}, {"type": "string"}],
                 "additionalItems": False},
    "if_then_else": {"type": "object", "required": ["kind"],
                     "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
                     "if": {"properties": {"kind": {"const": "a"}}},
                     "then": {"required": ["n"]}, "else": {"properties": {"n": {"maximum": 0}}}},
    "enum_any_value": {"enum": [{"a": [1, 2]}, [None, True], "x", 3.5]},
    "contains": {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5},
                 "maxItems": 3},
    "not_required": {"type": "object", "properties": {"a": {"type": "null"},
                                                      "b": {"type": "null"}},
                     "not": {"required": ["a"]}},
    "not_type": {"type": ["string", "null"], "not": {"type": "null"}},
    "property_names": {"type": "object", "propertyNames": {"pattern": "^[a-z]{1,4}$"},
                       "additionalProperties": {"type": "integer"}},
    "id_refs_d4": {"$schema": D4, "id": "http://x.org/s.json",
                   "definitions": {"p": {"type": "integer", "maximum": 5}},
                   "type": "object", "required": ["a", "b"],
                   "properties": {"a": {"$ref": "#/definitions/p"},
                                  "b": {"$ref": "http://x.org/s.json#/definitions/p"}}},
    "ref_siblings_d7": {"$schema": D7, "definitions": {"s": {"type": "string"}},
                        "properties": {"a": {"$ref": "#/definitions/s", "maxLength": 2}},
                        "required": ["a"]},
    "unevaluated": {"type": "object", "properties": {"a": {"type": "integer"}},
                    "unevaluatedProperties": False, "required": ["a"]},
    "long_arrays": {"type": "object", "required": ["ids", "notes"], "properties": {
        "ids": {"type": "array", "items": {"type": "string", "pattern": "^[a-f0-9]{24}$"},
                "minItems": 2, "maxItems": 1000},
        "notes": {"type": "array", "maxItems": 500, "items": {
            "type": "object", "required": ["text"],
            "properties": {"text": {"type": "string", "maxLength": 1024}}}}}},
}


def validator(schema):
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def sampled(schema, num=20, whitespace=r"[ ]?"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pattern = schema_to_regex(schema, whitespace=whitespace)
    return sample_strings(compile_bytes_dfa(pattern), np.random.default_rng(0), num=num,
                          max_len=400)


@pytest.mark.parametrize("name", list(CASES))
def test_sampled_documents_validate(name):
    schema = CASES[name]
    docs = sampled(schema)
    assert len(docs) >= 5, docs
    check = validator(schema)
    for doc in docs:
        errors = [e.message for e in check.iter_errors(json.loads(doc))]
        assert not errors, (doc, errors)


def test_subsets_still_cover_the_intended_documents():
    def matches(name, text, ws=""):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return re.fullmatch(schema_to_regex(CASES[name], whitespace=ws), text) is not None
    assert matches("oneof_discriminator", '{"kind":"square","side":2}')
    assert matches("oneof_enum_beside_typed_properties", '{"grant":"token","response":"t"}')
    assert matches("oneof_enum_beside_typed_properties", '{"grant":"code"}')
    assert not matches("oneof_enum_beside_typed_properties", '{"grant":"code","response":"t"}')
    assert matches("if_then_per_discriminator", '{"kind":"a","name":"xy"}')
    assert not matches("if_then_per_discriminator", '{"kind":"a"}')          # then: name required
    assert matches("if_false_takes_else", '{"k":1,"z":7}')
    assert not matches("if_false_takes_else", '{"k":1}')                       # else: z required
    assert matches("pattern_with_min_length_only", '"a_c.' + "x" * 50 + '"')   # no upper bound
    assert not matches("pattern_with_min_length_only", '"ab"')
    assert matches("oneof_overlapping_subset", '"ab"')
    assert not matches("oneof_overlapping_subset", "3")      # valid for both integer branches
    assert matches("oneof_required_sets", '{"r":1}') and matches("oneof_required_sets",
                                                                '{"w":1,"h":2}')
    assert not matches("oneof_required_sets", '{"r":1,"w":1,"h":2}')   # valid for both
    assert matches("pattern_properties", '{"x_a":3,"y_ab":true}')
    assert not matches("pattern_properties", '{"x_a":-1}')
    assert matches("additional_schema", '{"a":"s","zz":3}')
    assert not matches("additional_schema", '{"a":"s","a":3}')
    assert matches("unique_enum", '["r","b"]') and not matches("unique_enum", '["r","r"]')
    assert matches("required_undeclared", '{"a":1,"b":[true]}')
    assert matches("draft4_exclusive", "1") and not matches("draft4_exclusive", "0")
    assert matches("dependent_2020", '{"a":3,"z":null}') and not matches("dependent_2020",
                                                                         '{"a":4,"z":null}')
    # maxItems lowered so the counters stay small, never below minItems
    hex24 = '"' + "a" * 24 + '"'
    assert matches("long_arrays", '{"ids":[%s],"notes":[]}' % ",".join([hex24] * 70))
    assert not matches("long_arrays", '{"ids":[%s],"notes":[]}' % ",".join([hex24] * 200))
    assert not matches("long_arrays", '{"ids":[%s],"notes":[]}' % hex24)
    assert matches("long_arrays", '{"ids":[%s,%s],"notes":[{"text":"x"},{"text":"y"}]}'
                   % (hex24, hex24))


def test_unknown_keywords_are_listed_in_one_warning():
    with pytest.warns(UserWarning, match=r"#/self.*#/_format.*#/x-kubernetes"):
        schema_to_regex(CASES["unknown_keywords"])


TREE = {"$defs": {"node": {
    "type": "object", "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 9},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
    "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}


def test_recursive_ref_gives_a_grammar_whose_documents_validate():
    chars = [bytes([c]) for c in range(32, 127)]
    vocab = VocabTrie.from_token_bytes(chars + [b'{"v":', b""], eos_token_id=len(chars) + 1)
    g = dfa.json_schema(TREE, vocab, whitespace="")
    assert type(g).__name__ == "GrammarConstraint"
    doc = '{"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]}'
    assert g.matches(doc) and not g.matches('{"v":1,"kids":[{"v":12}]}')
    assert not g.matches('{"v":1,"kids":[{"v":2},{"v":2},{"v":2}]}')
    assert g.accepts([len(chars)] + [chars.index(bytes([c])) for c in b'0}'] + [len(chars) + 1])
    # uniform random walks over characters that keep the document completable
    rng = np.random.default_rng(0)
    rec = g.recogniser
    alphabet = sorted(set(b'{}[]:,"vkids0123456789'))
    check = validator(TREE)
    done = 0
    for _ in range(16):
        state, text = rec.start(), b""
        while len(text) < 120:
            if state.accepting and rng.random() < 0.3:
                break
            steps = [(c, rec.feed(state, bytes([c]))) for c in alphabet]
            steps = [(c, t) for c, t in steps if t is not DEAD]
            if not steps:
                break
            c, state = steps[int(rng.integers(len(steps)))]
            text += bytes([c])
        if state.accepting:
            check.validate(json.loads(text))
            done += 1
    assert done >= 6
    with pytest.raises(UnsupportedSchemaError, match="recursive"):
        schema_to_regex(TREE)
    assert schema_to_grammar(TREE).nonterminals


BAD = [
    ({"type": "object", "properties": {"a": {"type": "number", "minimum": 3, "maximum": 2}},
      "required": ["a"]}, SchemaError, "minimum 3 > maximum 2 at #/properties/a/minimum"),
    ({"type": "object", "properties": {"a": {"type": "integer", "enum": ["x", "y"]}},
      "required": ["a"]}, SchemaError, "no value of 'enum' at #/properties/a/enum"),
    ({"allOf": [{"type": "string"}, {"type": "null"}]}, SchemaError, "'allOf' at #/allOf"),
    ({"type": "array", "items": {"type": "object"}, "uniqueItems": True, "minItems": 3},
     UnsupportedSchemaError, "'uniqueItems' at #/uniqueItems"),
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]},
     UnsupportedSchemaError, "'oneOf' at #/oneOf"),
    ({"type": "object", "required": ["a"], "additionalProperties": False}, SchemaError,
     "required property 'a' at #/required"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]{5}$",
                                             "maxLength": 3}}, "required": ["a"]},
     UnsupportedSchemaError, "'pattern' at #/properties/a/pattern"),
    ({"properties": {"a": {"$ref": "other.json#/x"}}, "required": ["a"]},
     UnsupportedSchemaError, "'\\$ref' 'other.json#/x' at #/properties/a/\\$ref"),
    ({"type": "integer", "multipleOf": 0}, SchemaError, "'multipleOf' at #/multipleOf"),
    ({"type": "object", "minProperties": 3, "properties": {"a": {}}}, UnsupportedSchemaError,
     "minProperties 3 at #/minProperties"),
]


@pytest.mark.parametrize("schema, cls, message", BAD)
def test_bad_schemas_name_the_keyword_and_path(schema, cls, message):
    with pytest.raises(cls, match=message):
        schema_to_regex(schema, warn=False)


def test_arbitrary_values_nest_less_when_the_automaton_is_too_large(monkeypatch):
    """Where ``{}`` values make the document's regex too large, they nest less deeply (a sound
    subset, with a warning) instead of the schema being refused."""
    import importlib

    js = importlib.import_module("ctrlg.dfa.json_schema")
    schema = {"type": "object", "required": ["a", "b", "c"],
              "properties": {"a": {}, "b": {}, "c": {"instanceof": "function"}}}
    monkeypatch.setattr(js, "MAX_REGEX_CHARS", 6_000)
    with pytest.raises(UnsupportedSchemaError, match="max_regex_chars"):
        js.schema_to_regex(schema, warn=False)
    vocab = [bytes([b]) for b in range(32, 127)] + [b"<eos>"]
    trie = VocabTrie.from_token_bytes(vocab, eos_token_id=len(vocab) - 1)
    with pytest.warns(UserWarning, match="nest at most 1 deep"):
        d = dfa.json_schema(schema, trie, warn=False, whitespace="")

    def accepts(text):
        return d.accepts([b - 32 for b in text.encode()] + [len(vocab) - 1])

    assert accepts('{"a":[1],"b":{"k":null},"c":"x"}')          # depth 1
    assert not accepts('{"a":[[1]],"b":1,"c":2}')                # depth 2: left out
    check = validator(schema)
    pattern = js.schema_to_regex(schema, whitespace="", max_nesting=1, warn=False)
    docs = sample_strings(compile_bytes_dfa(pattern), np.random.default_rng(0), num=20,
                          max_len=200)
    assert len(docs) >= 5
    for doc in docs:
        if all(32 <= b < 127 for b in doc.encode()):
            assert d.accepts([b - 32 for b in doc.encode()] + [len(vocab) - 1]), doc
        assert not list(check.iter_errors(json.loads(doc))), doc
