"""ctrlg.dfa.cfg.lazy_nesting: the sentences nesting at most n levels deep, built on demand, have
exactly the eager ``nesting_subset``'s language — the minimal DFA of every state the lazy
automaton can reach equals the eager one's — on the example grammars and on random grammars
with self-embedding, and nothing is built before the first row is asked for."""

import random

import numpy as np
import pytest

from ctrlg.dfa.bytes_dfa import ByteDFA, minimize
from ctrlg.dfa.cfg.approximation import _same_dfa, nesting_subset
from ctrlg.dfa.cfg.constraint import prepared_bnf
from ctrlg.dfa.cfg.examples import EXAMPLES
from ctrlg.dfa.cfg.lazy_nesting import LazyNesting, lazy_nesting_subset
from ctrlg.dfa.grammar import _read
from ctrlg.dfa.lazy import DEAD
from ctrlg.errors import ConstraintError, GrammarError, RegexError
import ctrlg.dfa.lazy as lazy_module


def _bnf(text):
    g, what = _read(text, "lark", None, "auto")
    return prepared_bnf(g, what)


def explored(lazy) -> ByteDFA:
    """Every state of the lazy byte automaton reachable from its initial one, as a ByteDFA."""
    order, index, rows = [lazy.initial], {lazy.initial: 1}, []
    while len(rows) < len(order):
        row = lazy.row(order[len(rows)]).copy()
        for t in np.unique(row[row != DEAD]).tolist():
            if t not in index:
                index[t] = len(order) + 1
                order.append(t)
        rows.append(row)
    table = np.zeros((len(order) + 1, 256), dtype=np.int32)
    accepting = np.zeros(len(order) + 1, dtype=bool)
    for k, (q, row) in enumerate(zip(order, rows), start=1):
        table[k] = [index[int(t)] if t != DEAD else 0 for t in row]
        accepting[k] = lazy.accepting[q]
    return ByteDFA(table=table, accepting=accepting, initial=1 if lazy.initial != DEAD else 0)


def assert_same_as_eager(bnf, levels):
    eager = minimize(nesting_subset(bnf, levels))
    lazy = minimize(explored(lazy_nesting_subset(bnf, levels)))
    assert _same_dfa(eager, lazy), (levels, eager.num_states, lazy.num_states)
    return eager.num_states


@pytest.mark.parametrize("name", sorted(EXAMPLES))
@pytest.mark.parametrize("levels", [0, 1, 2, 3])
def test_the_example_grammars_nest_as_the_eager_subset(name, levels):
    assert_same_as_eager(_bnf(EXAMPLES[name]), levels)


def _random_grammar(rng: random.Random) -> str:
    """Two or three rules over "a", "b", "(", ")" and the nonterminals, at least one reference
    strictly inside a body (self-embedding), loops and alternatives mixed in."""
    names = ["start", "x"]
    symbols = ['"a"', '"b"', '"("', '")"']

    def body(depth):
        items = []
        for _ in range(rng.randint(1, 4)):
            roll = rng.random()
            if roll < 0.35:
                items.append(rng.choice(names))
            elif roll < 0.45 and depth == 0:
                items.append(f"({body(1)})" + rng.choice(["*", "+", "?"]))
            else:
                items.append(rng.choice(symbols))
        return " ".join(items)

    rules = []
    for name in names:
        bodies = [body(0) for _ in range(rng.randint(1, 3))]
        bodies.append(rng.choice(symbols))                       # a base case
        rules.append(f"{name}: " + " | ".join(bodies))
    rules.append(f'start_embed: "(" {names[-1]} ")"')
    rules[0] += " | start_embed"
    return "\n".join(rules) + "\n"


def test_random_self_embedding_grammars_nest_as_the_eager_subset(monkeypatch):
    """Random grammars at 0 and 1 levels. Skipped: those the eager construction refuses (its
    budget), and those whose whole lazy automaton (every state, not only a generation's path)
    passes 20,000 states: without minimisation the subsets of an ambiguous grammar's expanded
    NFA can be many more than the minimal DFA's states."""
    monkeypatch.setattr(lazy_module, "MAX_LAZY_STATES", 20_000)
    rng = random.Random(7)
    checked = 0
    for _ in range(24):
        text = _random_grammar(rng)
        try:
            bnf = _bnf(text)
            for levels in (0, 1):
                assert_same_as_eager(bnf, levels)
        except (ConstraintError, GrammarError, RegexError):
            continue
        checked += 1
    assert checked >= 18


def test_nothing_is_built_before_the_first_row_and_depth_costs_nothing_up_front():
    """The JSON example at 6 levels (the eager automaton: thousands of states) and at 60: the
    compile expands a handful of NFA states; reading a few rows adds a few DFA states."""
    bnf = _bnf(EXAMPLES["json"])
    for levels in (6, 60):
        lazy = lazy_nesting_subset(bnf, levels)
        assert lazy.num_states <= 3
        q = lazy.run_bytes(lazy.initial, b'{"a": [1, {"b": [true, null]}]}')
        assert lazy.accepting[q]
        assert lazy.num_states < 200
    for levels in (2, 3):       # brackets n + 1 deep: the top value's and n inside it
        lazy, eager = lazy_nesting_subset(bnf, levels), nesting_subset(bnf, levels)
        for depth in range(1, 6):
            text = b"[" * depth + b"]" * depth
            q, r = lazy.run_bytes(lazy.initial, text), eager.initial
            for byte in text:
                r = eager.table[r, byte]
            assert bool(lazy.accepting[q]) == bool(eager.accepting[r]) == (depth <= levels + 1)


def test_the_states_built_on_demand_leave_the_garbage_collector_nothing_to_scan():
    """A walk adds thousands of NFA states; each one's edges and ε-targets are tuples of
    numbers (untracked once the collector has seen them), and a deferred fragment costs no
    container, so the walk adds fewer tracked objects than two per state (lists were two per
    state, and their full collections took hundreds of milliseconds a step)."""
    import gc

    lazy = lazy_nesting_subset(_bnf(EXAMPLES["json"]), 6)
    gc.collect()
    before = len(gc.get_objects())
    q = lazy.run_bytes(lazy.initial, b'{"a": [1, {"b": [true, null, "x"]}], "c": {"d": 2.5}}')
    assert lazy.accepting[q]
    gc.collect()
    gc.collect()            # a tuple of tuples is untracked once its items are
    added = len(gc.get_objects()) - before
    nfa = lazy._nfa
    built = [s for s in range(len(nfa.edges)) if nfa.edges[s] is not None]
    assert len(built) > 1000
    for s in built:
        assert type(nfa.edges[s]) is tuple and type(nfa.eps[s]) is tuple, s
        assert not gc.is_tracked(nfa.edges[s]) and not gc.is_tracked(nfa.eps[s]), s
    assert added < 2 * len(built), (added, len(built))


def test_an_automaton_past_the_state_bound_names_max_nesting(monkeypatch):
    monkeypatch.setattr(lazy_module, "MAX_LAZY_STATES", 6)
    lazy = lazy_nesting_subset(_bnf(EXAMPLES["json"]), 4)
    with pytest.raises(RegexError, match="max_nesting"):
        lazy.run_bytes(lazy.initial, b'[[[{"a": [1, 2]}]]]')


def test_lazy_grammar_builds_either_automaton_with_the_same_masks():
    """``nesting_automaton``: on demand (the default) and minimal give the same mask at every
    state along the JSON samples' walks over a tiny BPE vocabulary; a bad value is refused."""
    from ctrlg import dfa
    from ctrlg.dfa.cfg.examples import SAMPLES
    from tiny_bpe import tiny_bpe_tokenizer

    tok = tiny_bpe_tokenizer()
    both = [dfa.lazy_grammar(EXAMPLES["lists"], tok, max_nesting=2, warn=False,
                             nesting_automaton=kind) for kind in ("on_demand", "minimal")]
    steps = 0
    for text in SAMPLES["lists"]:
        states = [d.initial for d in both]
        for token in tok.encode(text, add_special_tokens=False):
            masks = [d.mask(q) for d, q in zip(both, states)]
            assert np.array_equal(masks[0], masks[1])
            states = [d.step(q, token) for d, q in zip(both, states)]
            steps += 1
    assert steps > 10
    with pytest.raises(ConstraintError, match="nesting_automaton"):
        dfa.lazy_grammar(EXAMPLES["lists"], tok, max_nesting=2, nesting_automaton="eager")


def test_the_keys_are_the_eager_unrollers():
    """The lazy unrolling walks the eager Unroller's keys: the start key at n + 1 levels."""
    bnf = _bnf(EXAMPLES["arithmetic"])
    lazy = LazyNesting(bnf, 2)
    assert lazy.levels == 3 and lazy.root == lazy.key(bnf.start, 3)
    assert lazy.root in lazy.nonempty
