"""A small run of the fuzz campaign (benchmarks/fuzz_campaign.py; the full campaign is 10,000
cases): every guided output is accepted by its constraint, and the campaign does catch a broken
processor."""

import numpy as np
import pytest

from benchmarks.fuzz_campaign import accepted, run_campaign, satisfiable
from ctrlg import dfa


def test_small_campaign_has_no_violations():
    summary = run_campaign(cases=60, seed=2024)
    assert summary["cases"] == 60
    assert summary["violations"] == 0, summary["first_violations"][:3]
    assert summary["outputs_checked"] > 60
    assert set(summary["by_decoder"]) == {"sample", "beam", "random_logits"}


def test_campaign_catches_a_processor_that_does_not_guide(monkeypatch):
    from ctrlg.sampler import ConstraintLogitsProcessor

    monkeypatch.setattr(ConstraintLogitsProcessor, "__call__", lambda self, ids, scores: scores)
    summary = run_campaign(cases=30, seed=5)
    assert summary["violations"] > 0


def test_oracle_semantics_on_a_hand_checked_constraint():
    V, eos = 3, 2
    d = dfa.intersect(dfa.phrase([1], V), dfa.eos(eos, V, required=True))
    assert accepted(d, [1, 2, 0, 0], eos) and not accepted(d, [0, 0, 0], eos)
    assert satisfiable(d, 2, 0, eos) and not satisfiable(d, 1, 0, eos)
    assert not satisfiable(d, 2, 2, eos)          # EOS forbidden before 2 tokens, budget 2
    assert satisfiable(dfa.length(3, 3, vocab_size=V), 3, 0, None)
    assert not satisfiable(dfa.length(4, 4, vocab_size=V), 3, 0, None)


def test_new_constraint_kinds_join_with_their_own_vocabulary(monkeypatch):
    """A kind registered later (here: regexes over a digit vocabulary, as a JSON Schema or a
    grammar kind would over its own) is drawn, and the enumeration oracle agrees with the DFA
    programme."""
    from benchmarks import fuzz_campaign as fc

    digits = [b"0", b"1", b"12", b"-", b""]
    monkeypatch.setitem(fc.VOCABULARIES, "digits", digits)
    monkeypatch.setattr(fc, "LEAF_KINDS", dict(fc.LEAF_KINDS))
    fc.register_leaf("number", lambda rng, V, eos: dfa.regex(
        str(rng.choice(["-?[0-9]+", "1[0-9]?", "(12)+"])), digits, eos_token_id=len(digits) - 1),
        vocabulary="digits", weight=20)
    summary = run_campaign(cases=40, seed=3)
    assert summary["violations"] == 0, summary["first_violations"][:3]
    assert any(fc.run_case(s).get("constraint", "").find("number") >= 0 for s in range(3, 43))
    for seed in range(30):
        d = fc._random_dense(np.random.default_rng(seed), 3)
        for n, m, eos in ((1, 0, 2), (3, 1, 2), (2, 0, None)):
            assert satisfiable(d, n, m, eos) == fc._satisfiable_by_enumeration(d, n, m, eos)


def _seeds_over(vocabulary, count, start=0):
    from benchmarks import fuzz_campaign as fc

    seeds = (s for s in range(start, start + 10_000)
             if fc.pick_vocabulary(np.random.default_rng(s).random()) == vocabulary)
    return [next(seeds) for _ in range(count)]


@pytest.mark.parametrize("vocabulary, kind", [("grammar", "grammar"), ("json", "json_schema")])
def test_grammar_and_json_schema_kinds_are_drawn_and_checked(vocabulary, kind):
    """Cases over the grammar / JSON vocabulary draw their kind, mostly as the whole constraint,
    and every output passes both ctrlg's ``accepts`` and the kind's own oracle (lark's Earley
    parser; json.loads + jsonschema)."""
    from benchmarks import fuzz_campaign as fc

    results = [fc.run_case(s) for s in _seeds_over(vocabulary, 8)]
    assert all(r["violation"] is None for r in results), [r for r in results if r["violation"]]
    whole = [r for r in results if r["op"] == "leaf" and r["kinds"] == [kind]]
    assert len(whole) >= 3
    assert sum(r.get("outputs", 0) for r in whole) > 0


def test_kind_oracles_catch_outputs_outside_the_language(monkeypatch):
    """With a processor that does not guide and ctrlg's own verdict switched off, the lark and
    jsonschema oracles alone still reject the outputs (so they check something)."""
    from benchmarks import fuzz_campaign as fc
    from ctrlg.sampler import ConstraintLogitsProcessor

    monkeypatch.setattr(ConstraintLogitsProcessor, "__call__", lambda self, ids, scores: scores)
    monkeypatch.setattr(fc, "accepted", lambda constraint, tokens, eos: True)
    for vocabulary in ("grammar", "json"):
        caught = [r for r in map(fc.run_case, _seeds_over(vocabulary, 12))
                  if "outside the language" in (r["violation"] or "")]
        assert caught, vocabulary
    rng = np.random.default_rng(0)
    *_, check = fc._grammar_leaf(rng)
    assert isinstance(check(b"zz"), bool) and not check(b"zz")
    *_, check = fc._json_schema_leaf(np.random.default_rng(1))
    assert not check(b"{") and not check(b"\xff")


def test_summary_counts_cases_per_kind():
    summary = run_campaign(cases=12, seed=2024)
    assert set(summary["by_kind"]) >= {"grammar", "json_schema", "regex", "phrase"}
    assert sum(k["cases"] for k in summary["by_kind"].values()) >= 12


def test_edge_kinds_are_drawn_and_checked():
    """Cases over the edge vocabulary draw the regex / Lark / GBNF edge generators as the whole
    constraint (outputs checked by re, lark and the equivalent re pattern); JSON edge schemas
    join the JSON cases; every generator's oracle rejects bytes outside its language."""
    from benchmarks import fuzz_campaign as fc

    results = [fc.run_case(s) for s in _seeds_over("edge", 6)]
    assert all(r["violation"] is None for r in results), [r for r in results if r["violation"]]
    for kind in ("regex_edge", "grammar_edge", "gbnf_edge", "json_edge"):
        *_, check = fc.LEAF_KINDS[kind].build(np.random.default_rng(7), None, None)
        assert not check(b"\xff")                      # not UTF-8: outside every language


def test_round5_kinds_compare_with_their_references_both_ways(monkeypatch):
    """Cases over the round-5 vocabulary (surrogates as characters, Unicode case folding,
    empty and ambiguous grammar rules) pass; and the enumerated comparison catches a
    constraint that folds case in ASCII only (rejects what lark accepts) and one that accepts
    a surrogate's bytes (accepts what re rejects)."""
    from benchmarks import fuzz_campaign as fc

    results = [fc.run_case(s) for s in _seeds_over("round5", 8)]
    assert all(r["violation"] is None for r in results), [r for r in results if r["violation"]]
    assert {k for r in results for k in r.get("kinds", ())} >= {"round5_regex", "round5_grammar"}
    eos = len(fc.R5_TOKENS) - 1
    ascii_only = dfa.grammar('start: "k" | "K"', fc.R5_TOKENS, eos_token_id=eos)
    from lark import Lark
    from lark.exceptions import LarkError

    lark_reads = fc._accepts_if_no_error(
        Lark('start: "k"i', parser="earley", lexer="dynamic_complete").parse, (LarkError,))
    with pytest.raises(AssertionError, match="ctrlg rejects"):            # the Kelvin sign
        fc._r5_compare(np.random.default_rng(0), ascii_only, lark_reads, eos, "ascii folding")
    surrogate = fc.R5_TOKENS.index(b"\xed\xa0\x80")
    table = np.full((3, len(fc.R5_TOKENS)), 2)
    table[0, 0], table[1, surrogate], table[1, eos] = 1, 1, 1          # a (ED A0 80)*
    lax = dfa.TokenDFA.from_dense(table, np.array([False, True, False]), 0)
    strict = fc._accepts_if_no_error(lambda t: None if t == "a" else 1 / 0, (ZeroDivisionError,))
    with pytest.raises(AssertionError, match="ctrlg accepts"):
        fc._r5_compare(np.random.default_rng(0), lax, strict, eos, "surrogate bytes")


def test_a_case_past_its_timeout_is_a_violation_and_the_next_case_runs(monkeypatch):
    """--case-timeout: a case that never answers (a numba loop ignores signals) is killed in
    its worker process and counted; the next case gets a fresh worker."""
    import time

    from benchmarks import fuzz_campaign as fc

    real = fc._run_case
    monkeypatch.setattr(fc, "_run_case",
                        lambda seed: time.sleep(60) if seed == 1 else real(seed))
    monkeypatch.setattr(fc, "CASE_TIMEOUT", 3.0)
    monkeypatch.setattr(fc, "_WORKER", None)
    try:
        summary = run_campaign(cases=3, seed=0)
    finally:
        if fc._WORKER is not None:
            fc._WORKER.stop()
            fc._WORKER = None
    assert summary["violations"] == 1
    assert summary["first_violations"][0]["violation"] == "no answer in 3 s"
    assert summary["first_violations"][0]["seed"] == 1


def test_shards_merge_into_the_summary_of_one_run():
    from benchmarks.fuzz_campaign import merge_summaries

    whole = run_campaign(cases=8, seed=40)
    merged = merge_summaries([run_campaign(cases=5, seed=40), run_campaign(cases=3, seed=45)])
    for key in ("cases", "violations", "outputs_checked", "unsatisfiable_cases", "by_decoder",
                "by_top_operation", "edge_refusals"):
        assert merged[key] == whole[key], key
    assert {k: v for k, v in merged["by_kind"].items() if v.get("cases")} == \
        {k: v for k, v in whole["by_kind"].items() if v["cases"]}
    assert [s["cases"] for s in merged["shards"]] == [5, 3]
