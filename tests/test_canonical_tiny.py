"""Canonical-encoding DFAs checked exhaustively on a tiny byte-level BPE tokenizer (GPT-2
pre-tokenizer, ~360 tokens), where loops over large character classes stay small enough to
enumerate: every token sequence of up to a few tokens that spells a matching string is accepted
iff it is the tokenizer's own encoding, every matching string up to a length bound has its
encoding accepted, and longer sampled strings and sampled paths agree with ``encode``. Also the
merge-rank pair test of :mod:`ctrlg.dfa.bpe_merges` against BPE on every pair of tokens."""

import itertools
import re

import numpy as np
import pytest
from test_canonical import _sample_strings, sample_path
from tiny_bpe import tiny_bpe_tokenizer

from ctrlg import dfa
from ctrlg.dfa.bpe_merges import MergeTables, loop_transition_bound, right_context_classes
from ctrlg.dfa.canonical import is_canonical, pair_checker


@pytest.fixture(scope="module")
def tok():
    return tiny_bpe_tokenizer()


# (pattern, alphabet for exhaustive strings, max string length); the first ones loop over large
# classes: every letter token, or letters, digits and punctuation together
PATTERNS = [
    (r"[a-z]+( [a-z]+)*", "aeht ", 5),
    (r"[a-z]+", "aehtn", 4),
    (r"[a-z0-9.]+@[a-z]+\.(com|org)", None, 0),
    (r'\{"[a-z]+": ("[a-z ]*"|[0-9]+)\}', None, 0),
    (r"[a-z]+(, [a-z]+)*\.", "aeht, .", 5),
    (r"[^\n]*", "at 1.\"", 4),
    (r"[A-Za-z0-9_]+", "aThe1_", 4),
    (r" ?[a-z]+ [a-z]+", "ath ", 5),
    (r"(the|a) [a-z]+s?", None, 0),
    (r"[0-9]+(\.[0-9]+)?", "012.", 5),
    (r"\s*[a-z]+\s*", " \nat", 4),
    (r"(the|at|a)+!?", "thea!", 6),
    (r"[a-z]{2,4}@[a-z]{2,4}", "at@", 6),
]


def _matching_strings(pattern, alphabet, max_len):
    for n in range(1, max_len + 1):
        for chars in itertools.product(alphabet, repeat=n):
            s = "".join(chars)
            if re.fullmatch(pattern, s):
                yield s


def _live_moves(d, eos):
    """``moves(state) -> (tokens, successors)``: the non-EOS tokens keeping ``d`` live (dense
    rows: the vocabulary is tiny)."""
    live = d.live_states()
    not_eos = np.arange(d.vocab_size) != eos

    def moves(s):
        row = d.successors(s)
        tokens = np.flatnonzero(live[row] & not_eos)
        return tokens, row[tokens]
    return moves


def _distance_to_acceptance(d, eos):
    """Fewest non-EOS tokens from each state to an accepting one (large if none)."""
    table = np.delete(d.dense(), eos, axis=1)
    dist = np.where(d.accepting, 0, 10**9)
    for _ in range(d.num_states):
        new = np.minimum(dist, dist[table].min(axis=1) + 1)
        if np.array_equal(new, dist):
            break
        dist = new
    return dist


def _sequences(d, max_len, eos, cap):
    """Token sequences of at most ``max_len`` tokens (no EOS) that ``d`` accepts (depth-first,
    only through prefixes that can still be completed in time; at most ``cap``)."""
    moves = _live_moves(d, eos)
    dist = _distance_to_acceptance(d, eos)
    out, stack = [], [(d.initial, ())]
    while stack and len(out) < cap:
        s, seq = stack.pop()
        if seq and d.is_accepting(s):
            out.append(list(seq))
        budget = max_len - len(seq) - 1
        if budget >= 0:
            tokens, nxt = moves(s)
            ok = dist[nxt] <= budget
            stack.extend((n, seq + (t,)) for t, n in zip(tokens[ok].tolist(), nxt[ok].tolist()))
    return out


def _shortest(d, eos):
    """Number of tokens (no EOS) of the shortest accepted non-empty sequence (breadth-first)."""
    moves = _live_moves(d, eos)
    level, n = {d.initial}, 0
    while n == 0 or not any(d.is_accepting(s) for s in level):
        level = {int(x) for s in level for x in moves(s)[1].tolist()}
        n += 1
        assert level and n < 50
    return n


@pytest.mark.parametrize("pattern, alphabet, max_len", PATTERNS)
def test_exactly_the_canonical_encodings(tok, pattern, alphabet, max_len):
    eos = tok.eos_token_id
    d_can = dfa.regex(pattern, tok, encodings="canonical")
    d_all = dfa.regex(pattern, tok, encodings="all")
    # every spelling of up to (shortest + 1) tokens: accepted by the canonical DFA iff canonical
    spellings = _sequences(d_all, _shortest(d_all, eos) + 1, eos, cap=4_000)
    verdicts = [is_canonical(seq, tok) for seq in spellings]
    assert any(verdicts) and not all(verdicts), pattern   # both kinds are exercised
    for seq, canonical in zip(spellings, verdicts):
        assert d_can.accepts(seq) == canonical, (pattern, tok.convert_ids_to_tokens(seq))
    # every matching string up to a length bound, and sampled longer ones
    rng = np.random.default_rng(0)
    strings = [] if alphabet is None else list(_matching_strings(pattern, alphabet, max_len))
    strings += _sample_strings(pattern, rng, 20)
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False)
        assert d_can.accepts(ids) and d_can.accepts(ids + [eos]), (pattern, s, ids)
    # sampled accepted paths: decoding and re-encoding gives the same path
    paths = 0
    for _ in range(300):
        if paths == 20:
            break
        end, seq = sample_path(d_can, rng, eos, stop=0.3)
        if seq and d_can.is_accepting(end):
            text = tok.decode(seq)
            assert re.fullmatch(pattern, text), (pattern, text)
            assert tok.encode(text, add_special_tokens=False) == seq, (pattern, text)
            paths += 1
    assert paths >= 10


def test_merge_rank_pair_test_on_every_pair(tok):
    """SR(a) ∩ SL(b) ≠ ∅ ⇔ BPE of the concatenated bytes is not [a, b], for every pair of
    tokens that are BPE's encoding of themselves (the BPE model alone, no pre-tokenizer)."""
    checker = pair_checker(tok)
    tables = MergeTables(tok.backend_tokenizer, len(tok))
    whole = np.array([bool(checker.tokens[t]) and checker._is_whole(t) for t in range(len(tok))])
    tokens = np.flatnonzero(whole)
    a, b = (x.ravel() for x in np.meshgrid(tokens, tokens, indexing="ij"))
    across = tables.merges_across(a, b)
    truth = np.array([checker._bpe_ids(checker.tokens[x], checker.tokens[y]) != [x, y]
                      for x, y in zip(a.tolist(), b.tolist())])
    assert truth.any() and not truth.all()
    assert np.array_equal(across, truth)
    # the class count is the number of distinct rows of the forbidden table
    letters = np.array([t for t in tokens if checker.tokens[t].isalpha()])
    la, lb = (x.ravel() for x in np.meshgrid(letters, letters, indexing="ij"))
    rows = across_rows = tables.merges_across(la, lb).reshape(len(letters), len(letters))
    classes, forbidden = right_context_classes(tables, letters, letters)
    assert classes == len({r.tobytes() for r in across_rows}) and forbidden == rows.sum()
    # the bound on transitions, by brute force: per class, the distinct classes it may precede
    ids: dict[bytes, int] = {}
    cls = np.array([ids.setdefault(r.tobytes(), len(ids)) for r in across_rows])
    reps = [int(np.flatnonzero(cls == c)[0]) for c in range(len(ids))]
    transitions = sum(len(set(cls[~across_rows[r]].tolist())) for r in reps)
    assert loop_transition_bound(tables, letters) == (classes, transitions)
    # and the canonical DFA of the loop meets it
    d = dfa.regex("[a-z]+", tok, encodings="canonical", eos_token_id=None)
    live = d.live_states()
    assert d.num_states >= classes
    succ = sum(len(set(row[live[row]].tolist())) for row in d.dense())
    assert succ >= transitions


def test_merge_rank_pair_test_on_smollm2_pairs():
    """The same equivalence on 3,000 random pairs of SmolLM2 letter tokens (~14 % of which BPE
    merges across), and the class count quoted in docs/regex.md."""
    from ctrlg.lm.models import load_tokenizer

    tok = load_tokenizer()
    checker = pair_checker(tok)
    tables = MergeTables(tok.backend_tokenizer, len(tok))
    letters = np.array([t for t, b in enumerate(checker.tokens)
                        if b.isalpha() and b.islower() and b.isascii() and checker._is_whole(t)])
    rng = np.random.default_rng(0)
    a, b = rng.choice(letters, 3000), rng.choice(letters, 3000)
    truth = np.array([checker._bpe_ids(checker.tokens[x], checker.tokens[y]) != [x, y]
                      for x, y in zip(a.tolist(), b.tolist())])
    assert 0.05 < truth.mean() < 0.5
    assert np.array_equal(tables.merges_across(a, b), truth)
    assert right_context_classes(tables, letters, letters)[0] == 4188


def test_pair_shortcuts_agree_with_encode_on_smollm2():
    """Pairs the checker decides from the merge ranks (ASCII letter/digit runs, bytes inside
    one multi-byte character) get the verdict ``encode`` (or BPE, for partial characters)
    gives."""
    from ctrlg.dfa.canonical import FREE
    from ctrlg.lm.models import load_tokenizer

    tok = load_tokenizer()
    checker = pair_checker(tok)
    assert checker.merge_tables() is not None   # built now: small batches use them once they exist
    runs = np.array(checker.ascii_runs())
    rng = np.random.default_rng(1)
    spaced_letters, letters = np.flatnonzero(runs == 1), np.flatnonzero(runs == 2)
    digits = np.flatnonzero(runs == 4)
    partial = np.array([t for t, b in enumerate(checker.tokens) if b and b[-1] >= 0xC0])
    tails = np.array([t for t, b in enumerate(checker.tokens) if b and 0x80 <= b[0] < 0xC0])
    groups = [(spaced_letters, letters), (letters, letters), (digits, digits), (partial, tails)]
    for left, right in groups:
        a, b = rng.choice(left, 400), rng.choice(right, 400)
        checker.pair_cache.clear()
        got = checker.pairs(a, b) == FREE
        for x, y, ok in zip(a.tolist(), b.tolist(), got.tolist()):
            data = checker.tokens[x] + checker.tokens[y]
            try:
                truth = tok.encode(data.decode("utf-8"), add_special_tokens=False) == [x, y]
            except UnicodeDecodeError:
                truth = checker._bpe_ids(checker.tokens[x], checker.tokens[y]) == [x, y]
            assert ok == truth, tok.convert_ids_to_tokens([x, y])
