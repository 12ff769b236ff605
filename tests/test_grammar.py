"""Grammar constraints end to end: the Lark and GBNF readers (and their errors, which name the
construct and its line), the regular superset against the recogniser, the processor with
sampling, beam search, one constraint per row and insertion — every output parses with the
``lark`` library — and exact sampling from p_hmm(x | α) where the superset is exact."""

import itertools

import lark
import numpy as np
import pytest
import torch

from ctrlg import dfa
from ctrlg.dfa.bytes_dfa import Budget
from ctrlg.dfa.cfg import approximation
from ctrlg.dfa.cfg.approximation import regular_superset
from ctrlg.dfa.cfg.grammar_ir import reduce, with_ignored
from ctrlg.dfa.cfg.lark_syntax import from_lark
from ctrlg.dfa.vocab_trie import VocabTrie
from ctrlg.errors import (ConstraintError, GrammarError, UnsatisfiableConstraintError,
                          UnsupportedGrammarError)
from ctrlg.lm.hmm_lm import HMMForCausalLM
from ctrlg.sampler import ConstraintLogitsProcessor, generate
from ctrlg.dfa.cfg.examples import EXAMPLES as ALL
from helpers import random_hmm, trim_at_eos
from test_guide import generations, seq_prob
from test_sampler import chi_square_against, sample_with_hmm_lm
from tiny_bpe import tiny_bpe_tokenizer


@pytest.fixture(scope="module")
def tiny():
    return tiny_bpe_tokenizer()


@pytest.fixture(scope="module")
def compiled(tiny):
    return {name: dfa.grammar(text, tiny) for name, text in ALL.items()}


def lark_parsers(text):
    """Lark's default Earley parser and the every-split one (ctrlg's semantics)."""
    return [lark.Lark(text, parser="earley"), lark.Lark(text, parser="earley",
                                                        lexer="dynamic_complete")]


def assert_parses(text, outputs):
    parsers = lark_parsers(text)
    for out in outputs:
        for parser in parsers:
            parser.parse(out)          # raises on failure


# ------------------------------------------------------------------ readers and errors
@pytest.mark.parametrize("text, error, match", [
    ("start: A\nA: /(?<=a)b/", UnsupportedGrammarError, r"terminal A \(line 2\).*lookbehind"),
    ('start: "a"\n  | B\nB: /x+/s', UnsupportedGrammarError, r"B \(line 3\).*flag"),
    ("%declare FOO\nstart: FOO", UnsupportedGrammarError, r"FOO \(line 1\).*no pattern"),
    ("start: A\nA: /a*/", GrammarError, "zero-width"),
    ("start: x", GrammarError, "Rule 'x' used but not defined"),
    ("start: start", GrammarError, "generates no sentence"),
    ("", GrammarError, "empty"),
])
def test_lark_errors_name_the_construct_and_line(tiny, text, error, match):
    with pytest.raises(error, match=match):
        dfa.grammar(text, tiny)


def test_a_grammar_lark_accepts_is_read():
    """``","? [","]``: with ``keep_all_tokens`` Lark gave ``[","]`` a placeholder and refused
    the two expansions as "Rules defined twice"; Lark's own options read it (its language is
    unchanged: "(" then zero to two commas then an optional "12")."""
    text = 'start: "(" ","? [","] "12"?'
    lark.Lark(text, parser="earley")
    g = dfa.grammar(text, [b"(", b",", b"12", b""], eos_token_id=3)
    assert g.matches("(,,12") and g.matches("(") and not g.matches("(,,,")


def test_bad_arguments_are_clear_errors(tiny, monkeypatch):
    with pytest.raises(ConstraintError, match="syntax must be"):
        dfa.grammar('start: "a"', tiny, syntax="ebnf")
    with pytest.raises(ConstraintError, match="depth must be"):
        dfa.grammar('start: "a"', tiny, depth=0)
    # two kinds of bracket: the automaton doubles per level, past the (here small) budget
    monkeypatch.setattr(approximation, "SUPERSET_BUDGET", Budget(states=3_000, work=100_000))
    with pytest.raises(ConstraintError, match="use a smaller depth"):
        dfa.grammar('start: x\nx: "1" | "(" x ")" | "[" x "]"', tiny, depth=12)
    monkeypatch.undo()
    with pytest.raises(GrammarError, match="no rule 'root'"):
        dfa.grammar('start ::= "a"', tiny, syntax="gbnf")
    # the ambiguous 'x x' is a loop (x = α (α)*, α = "1" | "(" x ")"): only the parentheses
    # spend depth, so "auto" reaches its deepest level and the superset keeps the brackets
    # balanced there
    g = dfa.grammar('start: x\nx: "1" | "(" x ")" | x x', tiny)
    bnf = with_ignored(reduce(from_lark('start: x\nx: "1" | "(" x ")" | x x')))
    superset, _, _ = regular_superset(bnf, g.depth)
    assert g.depth == 12 and superset.fullmatch(b"(1)((1)1)") and not superset.fullmatch(b")1(")
    with pytest.raises(UnsupportedGrammarError, match="line 2: a token reference"):
        dfa.grammar('root ::= "a"\nx ::= <[1]>', tiny, syntax="gbnf")
    g = dfa.grammar(ALL["arithmetic"], tiny)
    with pytest.raises(ConstraintError, match="grammar cannot be combined"):
        dfa.intersect(g, dfa.length(1, 3, vocab_size=g.vocab_size))


GBNF_ARITHMETIC = r"""
# the arithmetic grammar, character by character
root   ::= sum
sum    ::= product (("+" | "-") product)*
product ::= atom (("*" | "/") atom)*
atom   ::= [0-9]+ | "(" sum ")"
"""


def test_gbnf_and_lark_accept_the_same_strings(tiny):
    lark_g = dfa.grammar(r"""
?start: sum
?sum: product | sum ("+" | "-") product
?product: atom | product ("*" | "/") atom
?atom: /[0-9]+/ | "(" sum ")"
""", tiny)
    gbnf_g = dfa.grammar(GBNF_ARITHMETIC, tiny, syntax="gbnf")
    for k in range(1, 6):
        for chars in itertools.product("(1+*)", repeat=k):
            s = "".join(chars)
            assert lark_g.matches(s) == gbnf_g.matches(s), s


def test_gbnf_repetition_classes_and_escapes(tiny):
    g = dfa.grammar(r'root ::= [a-c]{2,3} "\x21"? [^a-z\n] "-"', tiny, syntax="gbnf")
    assert g.matches("ab!X-") and g.matches("abcZ-") and not g.matches("a!X-")
    assert not g.matches("abcd-") and not g.matches("abca-")


@pytest.mark.parametrize("name", sorted(ALL))
def test_superset_contains_the_language_and_is_exact_within_its_depth(name):
    g = with_ignored(reduce(from_lark(ALL[name])))
    alphabet = {"arithmetic": "(1+) ", "sql": "SELCT*FROMa ,", "lists": "[a], ",
                "json": '[]{}"a:,1 '}[name]
    from ctrlg.dfa.cfg.earley import Recogniser
    rec = Recogniser(g)
    shallow, _, exact = regular_superset(g, 1)
    deep, _, _ = regular_superset(g, 4)
    for k in range(1, 6):
        for chars in itertools.product(alphabet, repeat=k):
            s = "".join(chars).encode()
            if rec.accepts(s):
                assert shallow.fullmatch(s) and deep.fullmatch(s), s
            elif exact:
                assert not shallow.fullmatch(s), s
    assert exact == (name == "sql")          # only the SQL subset has no self-embedding


def test_accepts_spells_sentences_in_every_encoding(tiny, compiled):
    g, eos = compiled["json"], tiny.eos_token_id
    text = '{"a": [1, {"b": null}]}'
    ids = tiny.encode(text, add_special_tokens=False)
    by_bytes = [tiny.convert_tokens_to_ids(tiny.convert_ids_to_tokens(t)) for t in ids]
    assert g.accepts(ids) and g.accepts(ids + [eos]) and g.accepts(by_bytes)
    assert not g.accepts(tiny.encode('{"a": [1}', add_special_tokens=False))
    assert g.matches(text) and not g.matches(text[:-1])


# ------------------------------------------------------------------ the processor
def _lm(hmm_seed, V, eos):
    return HMMForCausalLM.from_hmm(random_hmm(4, V, hmm_seed, concentration=0.3), prompt_length=1,
                                   eos_token_id=eos)


@pytest.mark.parametrize("mode", ["logical", "ctrlg"])
@pytest.mark.parametrize("name", sorted(ALL))
def test_sampling_outputs_parse_with_lark(tiny, compiled, name, mode):
    g, eos, V = compiled[name], tiny.eos_token_id, compiled[name].vocab_size
    hmm = random_hmm(4, V, 1) if mode == "ctrlg" else None
    out = generate(_lm(2, V, eos), tiny, [0], g, hmm=hmm, mode=mode, max_new_tokens=20,
                   num_samples=6, seed=3, rank_by_lm=False)
    assert out and all(g.accepts(x.token_ids) for x in out)
    assert_parses(ALL[name], [x.text for x in out])


@pytest.mark.parametrize("name", ["arithmetic", "json"])
def test_beam_search_outputs_parse_with_lark(tiny, compiled, name):
    g, eos, V = compiled[name], tiny.eos_token_id, compiled[name].vocab_size
    out = generate(_lm(4, V, eos), tiny, [0], g, hmm=random_hmm(4, V, 5), max_new_tokens=16,
                   num_samples=3, num_beams=3, seed=0)
    assert out and all(g.accepts(x.token_ids) for x in out)
    assert_parses(ALL[name], [x.text for x in out])


def test_one_constraint_per_row_mixing_grammars_and_a_dfa(tiny, compiled):
    eos, V, n = tiny.eos_token_id, compiled["json"].vocab_size, 14
    digits = dfa.regex(r"[0-9]+", tiny)
    constraints = [compiled["json"], compiled["arithmetic"], digits]
    proc = ConstraintLogitsProcessor(random_hmm(4, V, 7), constraints, prompt_length=1,
                                     max_new_tokens=n, eos_token_id=eos)
    ids = torch.tensor([[1], [2], [3]])
    torch.manual_seed(0)
    out = _lm(8, V, eos).generate(ids, do_sample=True, num_return_sequences=3, max_new_tokens=n,
                                  logits_processor=[proc], attention_mask=torch.ones_like(ids),
                                  pad_token_id=eos)
    for i, row in enumerate(out[:, 1:].tolist()):
        y = trim_at_eos(row, eos)
        assert constraints[i // 3].accepts(y), (i, tiny.decode(y))


def test_insertion_with_a_grammar_middle(tiny, compiled):
    g, eos, V = compiled["arithmetic"], tiny.eos_token_id, compiled["arithmetic"].vocab_size
    suffix = tiny.encode(" = 7", add_special_tokens=False)
    out = generate(_lm(9, V, eos), tiny, [0], g, hmm=random_hmm(4, V, 10), max_new_tokens=10,
                   suffix=suffix, num_samples=4, seed=1)
    assert out and all(g.accepts(x.token_ids) for x in out)
    assert_parses(ALL["arithmetic"], [x.text for x in out])


def test_budget_shorter_than_the_shortest_sentence_is_an_error(tiny):
    g = dfa.grammar('start: "SELECT " NAME " FROM " NAME\nNAME: /[a-z]+/', tiny)
    with pytest.raises(UnsatisfiableConstraintError, match="no sentence of at most "
                       "max_new_tokens=2"):
        ConstraintLogitsProcessor(None, g, mode="logical", max_new_tokens=2,
                                  eos_token_id=tiny.eos_token_id)
    with pytest.raises(ConstraintError, match="needs an EOS token"):
        ConstraintLogitsProcessor(None, dfa.grammar(ALL["arithmetic"], tiny), mode="logical",
                                  max_new_tokens=8, eos_token_id=None)


def test_hmm_as_lm_samples_exactly_from_the_conditional_where_the_superset_is_exact():
    """Tokens ``(``, ``)``, ``1``, ``)1`` and EOS; within 4 tokens nothing nests deeper than
    the superset's depth, so the tables are exact and the grammar's masks change nothing:
    sampling with the HMM as the LM must follow p_hmm(y | α) (χ² against enumeration)."""
    tokens = [b"(", b")", b"1", b")1"]
    eos, V, n = 4, 5, 4
    trie = VocabTrie.from_token_bytes(tokens + [b""], eos_token_id=eos)
    g = dfa.grammar('start: x\nx: item+\n?item: "1" | "(" x ")"', trie)
    assert g.depth >= 3
    hmm = random_hmm(3, V, seed=11)
    target = {y: seq_prob(hmm, y) for y in generations(V, n, 0, {eos}) if g.accepts(list(y))}
    Z = sum(target.values())
    samples = sample_with_hmm_lm(hmm, g, n, 3000, eos=eos, seed=4)
    assert chi_square_against(samples, {y: p / Z for y, p in target.items()}) > 1e-3


def test_masks_are_never_empty_along_sampled_paths(tiny, compiled):
    """Driving the processor with random logits: every row keeps a feasible token until EOS."""
    g, eos, V, n = compiled["lists"], tiny.eos_token_id, compiled["lists"].vocab_size, 12
    proc = ConstraintLogitsProcessor(None, g, mode="logical", prompt_length=1, max_new_tokens=n,
                                     eos_token_id=eos)
    gen = torch.Generator().manual_seed(0)
    ids = torch.zeros(4, 1, dtype=torch.long)
    for _ in range(n):
        out = proc(ids, torch.randn(4, V, generator=gen) * 3)
        done = (ids[:, 1:] == eos).any(1) if ids.shape[1] > 1 else torch.zeros(4, dtype=torch.bool)
        assert torch.isfinite(out[~done]).any(1).all()
        nxt = torch.multinomial(out.exp().nan_to_num(0) + 1e-30, 1, generator=gen)
        nxt[done] = eos
        ids = torch.cat([ids, nxt], 1)
    rows = [trim_at_eos(r, eos) for r in ids[:, 1:].tolist()]
    assert all(g.accepts(r) for r in rows)         # ended at EOS, or accepted at the budget
    texts = [tiny.decode(r[:-1] if r[-1] == eos else r) for r in rows]
    assert_parses(ALL["lists"], texts)
    assert np.mean([len(t) for t in texts]) > 2
