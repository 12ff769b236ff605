"""dfa.lazy_grammar: a grammar whose language is regular as written becomes a lazy token
automaton with exactly the eager constraint's language (every state's mask against the eager
token DFA's live successors, by a walk over the product of the two automata), whose sampled and
guided outputs parse with ``lark``; a self-embedding grammar gets the Earley-driven constraint
(superset R_1, token index runs on first use; its masks are checked against brute force in
test_grammar_masks), or the eager superset's when ``depth`` is given."""

import numpy as np
import pytest

from ctrlg import dfa
from ctrlg.dfa.cfg.constraint import GrammarConstraint
from ctrlg.dfa.cfg.examples import EXAMPLES
from ctrlg.dfa.lazy import DEAD, LazyTokenDFA
from ctrlg.errors import ConstraintError, GrammarError
from ctrlg.sampler import generate
from helpers import random_hmm
from test_grammar import _lm, assert_parses
from tiny_bpe import tiny_bpe_tokenizer

REGULAR = {
    "sql": EXAMPLES["sql"],
    "left loop": 'start: items\nitems: items "," item | item\nitem: /[a-c]+/ | "the " ITEM\n'
                 'ITEM: "cat" | "hat"\n',
    "optional and counted": 'start: "a"? ("b" | "cd")~2..3 /[0-9]{1,2}/ "!"\n',
}
GBNF_REGULAR = 'root ::= "at " [0-9]{1,2} (":" [0-5] [0-9])? " " ("am" | "pm")'


@pytest.fixture(scope="module")
def tiny():
    return tiny_bpe_tokenizer()


def live_states(token_dfa, V: int) -> np.ndarray:
    """The eager DFA's states from which an accepting state is reachable (a fixpoint)."""
    S = token_dfa.num_states
    table = np.array([[token_dfa.step(q, v) for v in range(V)] for q in range(S)])
    live = np.array([bool(token_dfa.accepting[q]) for q in range(S)])
    while True:
        grown = live | live[table].any(1)
        if (grown == live).all():
            return live
        live = grown


def assert_same_language(lazy: LazyTokenDFA, eager: GrammarConstraint, V: int, limit: int = 400):
    """Over every pair (lazy state, eager state) reachable together (up to ``limit`` pairs):
    the same acceptance, and a token is in the lazy mask iff the eager DFA's successor is live."""
    live = live_states(eager.dfa, V)
    seen, todo = set(), [(lazy.initial, eager.dfa.initial)]
    while todo and len(seen) < limit:
        q, r = todo.pop()
        if (q, r) in seen:
            continue
        seen.add((q, r))
        assert lazy.is_accepting(q) == bool(eager.dfa.accepting[r])
        mask = lazy.mask(q)[:V]
        for v in range(V):
            r2 = eager.dfa.step(r, v)
            assert bool(mask[v]) == bool(live[r2]), (q, r, v)
            if mask[v]:
                q2 = lazy.step(q, v)
                assert q2 != DEAD
                todo.append((q2, r2))
    assert len(seen) > 5


@pytest.mark.parametrize("name", sorted(REGULAR))
def test_a_regular_grammar_is_lazy_with_the_eager_language(tiny, name):
    lazy = dfa.lazy_grammar(REGULAR[name], tiny)
    assert isinstance(lazy, LazyTokenDFA)
    eager = dfa.grammar(REGULAR[name], tiny)
    assert eager.exact
    assert_same_language(lazy, eager, eager.vocab_size)


def test_gbnf_goes_through_the_same_lazy_path(tiny):
    lazy = dfa.lazy_grammar(GBNF_REGULAR, tiny, syntax="gbnf")
    assert isinstance(lazy, LazyTokenDFA)
    ids = tiny.encode("at 7:05 pm", add_special_tokens=False)
    assert lazy.accepts(ids) and not lazy.accepts(tiny.encode("at 7:65 pm", add_special_tokens=False))
    assert_same_language(lazy, dfa.grammar(GBNF_REGULAR, tiny, syntax="gbnf"), len(tiny))


@pytest.mark.parametrize("name", ["arithmetic", "lists", "json"])
def test_a_self_embedding_grammar_with_a_depth_gets_that_superset(tiny, name):
    g = dfa.lazy_grammar(EXAMPLES[name], tiny, depth=2)
    assert isinstance(g, GrammarConstraint) and g.depth == 2 and not g.exact


@pytest.mark.parametrize("name", ["arithmetic", "lists", "json"])
def test_a_self_embedding_grammar_is_earley_driven_with_runs_on_first_use(tiny, name):
    """The default: superset R_1, no terminal run over the vocabulary before the first mask;
    the first mask computes the runs it needs (those of the terminals a sentence starts with),
    and the constraint's language is the eager one's (the same Earley recogniser; every token
    sequence of up to 2 tokens over the sample sentence's tokens and a few others)."""
    import itertools

    from ctrlg.dfa.cfg.examples import SAMPLES
    from ctrlg.guide.feasibility import Feasibility
    from ctrlg.guide.masks import token_mask

    g = dfa.lazy_grammar(EXAMPLES[name], tiny)
    eager = dfa.grammar(EXAMPLES[name], tiny)
    assert isinstance(g, GrammarConstraint) and (g.depth, g.exact) == (1, False)
    assert not g.index._start_runs and not g.index._state_runs
    assert g.index.vocabulary is eager.index.vocabulary         # built once per vocabulary
    assert all(a is b for a, b in zip(g.recogniser.dfas, eager.recogniser.dfas))
    eos = tiny.eos_token_id
    masks = token_mask(g, Feasibility(g.dfa, 8, eos_token_id=eos))
    first = masks.allowed(masks.start(), g.dfa.initial, 8)
    eager_masks = token_mask(eager, Feasibility(eager.dfa, 8, eos_token_id=eos))
    assert first.tolist() == eager_masks.allowed(eager_masks.start(), eager.dfa.initial, 8).tolist()
    assert 0 < len(g.index._start_runs) <= len(g.recogniser.dfas)
    sample = tiny.encode(SAMPLES[name][0], add_special_tokens=False)
    tokens = sorted(set(sample) | set(range(12)) | {eos})
    assert g.accepts(sample) and g.accepts(sample + [eos])
    for seq in itertools.chain(((t,) for t in tokens), itertools.product(tokens, repeat=2)):
        assert g.accepts(list(seq)) == eager.accepts(list(seq)), seq


@pytest.mark.parametrize("mode", ["logical", "ctrlg"])
@pytest.mark.parametrize("text, budget", [(REGULAR["left loop"], 12),      # a lazy automaton
                                          (EXAMPLES["arithmetic"], 14)])   # Earley-driven
def test_guided_outputs_of_the_lazy_grammar_parse_with_lark(tiny, mode, text, budget):
    g = dfa.lazy_grammar(text, tiny)
    V, eos = len(tiny), tiny.eos_token_id
    out = generate(_lm(2, V, eos), tiny, [0], g, hmm=random_hmm(4, V, 1) if mode == "ctrlg" else None,
                   mode=mode, max_new_tokens=budget, num_samples=6, seed=3, rank_by_lm=False)
    assert out and all(g.accepts(x.token_ids) for x in out)
    assert_parses(text, [x.text for x in out])


def test_bad_input_is_the_eager_path_s_error(tiny):
    with pytest.raises(ConstraintError, match="syntax"):
        dfa.lazy_grammar(EXAMPLES["sql"], tiny, syntax="ebnf")
    with pytest.raises(ConstraintError, match="depth"):
        dfa.lazy_grammar(EXAMPLES["sql"], tiny, depth=0)
    with pytest.raises(GrammarError):
        dfa.lazy_grammar("start: x", tiny)


def _paren_depth(s: str, brackets: str = "()") -> int:
    depth = best = 0
    for ch in s:
        depth += {brackets[0]: 1, brackets[1]: -1}.get(ch, 0)
        best = max(best, depth)
    return best


@pytest.mark.parametrize("levels", [0, 1, 2])
def test_max_nesting_is_the_language_cut_at_that_depth(tiny, levels):
    """Over every string of up to 7 characters of "(1+)": the lazy automaton with max_nesting =
    n accepts exactly the arithmetic sentences (Lark's recogniser) with parentheses ≤ n deep."""
    import itertools

    from ctrlg.dfa.cfg.earley import Recogniser

    with pytest.warns(UserWarning, match=f"more than {levels} levels"):
        lazy = dfa.lazy_grammar(EXAMPLES["arithmetic"], tiny, max_nesting=levels)
    assert isinstance(lazy, LazyTokenDFA)
    rec = Recogniser(dfa.grammar(EXAMPLES["arithmetic"], tiny, depth=1).bnf)
    for k in range(1, 8):
        for chars in itertools.product("(1+)", repeat=k):
            s = "".join(chars)
            expected = rec.accepts(s.encode()) and _paren_depth(s) <= levels
            assert lazy.accepts(tiny.encode(s, add_special_tokens=False)) == expected, s


def test_nested_outputs_parse_with_lark_and_stay_within_the_depth(tiny):
    g = dfa.lazy_grammar(EXAMPLES["lists"], tiny, max_nesting=2, warn=False)
    V, eos = len(tiny), tiny.eos_token_id
    out = generate(_lm(2, V, eos), tiny, [0], g, hmm=random_hmm(4, V, 1), max_new_tokens=14,
                   num_samples=6, seed=3, rank_by_lm=False)
    assert out and all(g.accepts(x.token_ids) for x in out)
    assert_parses(EXAMPLES["lists"], [x.text for x in out])
    assert all(_paren_depth(x.text, "[]") <= 3 for x in out)    # the list and 2 levels inside


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2"])
def test_a_bad_max_nesting_is_a_clear_error(tiny, bad):
    with pytest.raises(ConstraintError, match="max_nesting"):
        dfa.lazy_grammar(EXAMPLES["lists"], tiny, max_nesting=bad)


def test_a_regular_grammar_ignores_max_nesting_without_a_warning(tiny, recwarn):
    assert isinstance(dfa.lazy_grammar(EXAMPLES["sql"], tiny, max_nesting=0), LazyTokenDFA)
    assert not [w for w in recwarn if "levels deep" in str(w.message)]


def test_a_complete_lazy_byte_dfa_runs_as_its_dfa():
    """LazyByteDFA.complete: every row known, states that cannot accept merged into dead; on
    every string of up to 4 bytes over the DFA's alphabet and one byte outside it, the lazy run
    is dead exactly where the DFA's run cannot reach acceptance, and accepts where it does."""
    import itertools

    from ctrlg.dfa.bytes_dfa import ByteDFA
    from ctrlg.dfa.lazy import LazyByteDFA

    # states: 0 dead, 1 initial, 2 after "a", 3 accepting after "ab", 4 a trap that is not 0
    table = np.zeros((5, 256), dtype=np.int32)
    table[1, ord("a")], table[1, ord("c")] = 2, 4
    table[2, ord("b")], table[2, ord("a")] = 3, 2
    table[3, ord("a")] = 2
    table[4, :] = 4
    byte_dfa = ByteDFA(table=table, accepting=np.array([False, False, False, True, False]), initial=1)
    live = byte_dfa.live()
    lazy = LazyByteDFA.complete(byte_dfa)
    assert lazy.computed.all() and lazy.num_states == byte_dfa.num_states + 1
    for n in range(5):
        for word in itertools.product(b"abcx", repeat=n):
            data = bytes(word)
            q, d = lazy.run_bytes(lazy.initial, data), byte_dfa.run(data)
            assert (q == DEAD) == (not live[d]), data
            assert bool(lazy.accepting[q]) == bool(byte_dfa.accepting[d]), data
