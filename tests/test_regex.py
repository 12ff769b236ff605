"""Regex → byte DFA → token DFA: parser errors, agreement with Python's ``re`` by enumeration,
token-level acceptance by enumeration over tiny vocabularies and by sampling with SmolLM2."""

import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrlg import dfa
from ctrlg.dfa.bytes_dfa import compile_bytes_dfa, utf8_sequences
from ctrlg.dfa.regex_syntax import class_ranges, parse
from ctrlg.dfa.vocab_trie import VocabTrie
from ctrlg.errors import (ConstraintError, RegexError, UnsatisfiableConstraintError,
                          UnsupportedRegexError, VocabularyMismatchError)

PATTERNS = [
    "a|ab", "(ab|a)c?", "a*", "(a|b)*c", "[abc]{2}", "a{1,3}b?", "a{2,}", "[^a]b", r"\s+a",
    r"\d{2}", r"\w+", r"\S\D", ".b", "é+|ü", "[à-ÿ]x?", "(?:ab)+|c", "x|", r"\.\*", "[-a]+",
    "[]a]", "a{,2}", r"\x61\u00e9", "(?P<n>a)b", "^ab$", "a+?b*?", r"[\w-]c", "[a-c]|[b-d]",
]
ALPHABET = ["a", "b", "c", "x", ".", "*", "-", "]", " ", "\n", "é", "ü", "1", "٣", "\u3000", "_"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_bytes_dfa_matches_python_re(pattern):
    bdfa = compile_bytes_dfa(pattern)
    for n in range(4):
        for chars in itertools.product(ALPHABET, repeat=n):
            s = "".join(chars)
            assert bdfa.fullmatch(s.encode()) == bool(re.fullmatch(pattern, s)), (pattern, s)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x2FFF), max_size=6))
def test_bytes_dfa_random_strings(text):
    for pattern in (r"\w+\s?\d*", r"[^\W\d]+|\s", ".{2,4}", r"(\S\s)*"):
        assert compile_bytes_dfa(pattern).fullmatch(text.encode()) == bool(
            re.fullmatch(pattern, text)), (pattern, text)


def test_class_ranges_agree_with_re_over_all_code_points():
    everything = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    for letter in "dws":
        expected = {ord(m.group()) for m in re.finditer("\\" + letter, everything)}
        got = {c for lo, hi in class_ranges(letter) for c in range(lo, hi + 1)}
        assert got == expected, letter


def test_utf8_sequences_cover_exactly():
    lo, hi = 0x70, 0x10450
    seqs = utf8_sequences(lo, hi)
    for cp in list(range(0x60, 0x900)) + list(range(0xFFF0, 0x10500)):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        data = chr(cp).encode()
        hit = any(len(s) == len(data) and all(a <= b <= z for (a, z), b in zip(s, data))
                  for s in seqs)
        assert hit == (lo <= cp <= hi), hex(cp)


@pytest.mark.parametrize("pattern, construct", [
    (r"(a)\1", "backreference"), ("(?=a)a", "lookahead"), ("(?!a)b", "negative lookahead"),
    ("(?<=a)b", "lookbehind"), ("(?<!a)b", "negative lookbehind"), ("(?>a)", "atomic group"),
    ("a*+", "possessive"), ("(a)(?(1)b|c)", "conditional"), (r"\bword", "word boundary"),
    ("(?i)a", "inline flags"), (r"(?P<x>a)(?P=x)", "backreference"), (r"\p{L}", "Unicode property"),
    ("a^b", "anchor"), ("a$b", "anchor"),
])
def test_unsupported_constructs_are_named(pattern, construct):
    with pytest.raises(UnsupportedRegexError, match=re.escape(construct)):
        parse(pattern)


@pytest.mark.parametrize("pattern", ["", "(ab", "ab)", "[a-", "[z-a]", "*a", "a{3,2}", "a**",
                                     "\\", r"\xZZ", r"\q"])
def test_invalid_patterns_raise_regex_error(pattern):
    with pytest.raises(RegexError):
        parse(pattern)
    with pytest.raises(ValueError):
        dfa.regex(pattern, [b"a"])


def test_non_string_pattern():
    with pytest.raises(RegexError, match="must be a str"):
        parse(b"ab")


# ------------------------------------------------------------------ token DFA, tiny vocabulary
EOS = 9
VOCAB = [b"a", b"b", b"ab", b"c", b"abc", b"\xc3", b"\xa9", "é".encode(), b"ba", b"", b" ",
         b"\n", b"a"]  # 12 duplicates 0's bytes (like a byte-fallback token)
TRIE = VocabTrie.from_token_bytes(VOCAB, eos_token_id=EOS)


def _expected(pattern, seq):
    k = len(seq)
    while k and seq[k - 1] == EOS:
        k -= 1
    if EOS in seq[:k]:
        return False
    data = b"".join(VOCAB[t] for t in seq[:k])
    try:
        return bool(re.fullmatch(pattern, data.decode()))
    except UnicodeDecodeError:
        return False


@pytest.mark.parametrize("pattern", ["a|ab", "(ab|a)c?", "é+b?", r"\s?a*", "[^c]{1,3}",
                                     "(ba)+|abc", r"a\nb?", "[éa]{2}"])
def test_token_dfa_by_enumeration(pattern):
    _check_by_enumeration(dfa.regex(pattern, TRIE), pattern)


def _check_by_enumeration(d, pattern):
    """``d`` accepts exactly the token sequences (up to 4 tokens) whose bytes match."""
    accepted = 0
    for n in range(5):
        for seq in itertools.product(range(len(VOCAB)), repeat=n):
            got = d.accepts(list(seq))
            assert got == _expected(pattern, list(seq)), (pattern, seq)
            accepted += got
    assert accepted > 0


def test_alternation_is_a_true_union():
    d = dfa.regex("a|ab", TRIE)
    assert d.accepts([0]) and d.accepts([2]) and d.accepts([0, 1]) and not d.accepts([1])


def test_eos_only_after_a_full_match():
    d = dfa.regex("ab", TRIE)
    assert not d.accepts([EOS]) and not d.accepts([0, EOS])
    assert d.accepts([2, EOS, EOS]) and not d.accepts([2, EOS, 1])
    no_eos = dfa.regex("ab", TRIE, eos_token_id=None)
    assert not no_eos.accepts([2, EOS])


def test_bad_arguments():
    with pytest.raises(ConstraintError, match="encodings"):
        dfa.regex("a", TRIE, encodings="some")
    with pytest.raises(ConstraintError, match="vocab_size"):
        dfa.regex("a", TRIE, vocab_size=3)
    with pytest.raises(UnsatisfiableConstraintError):
        dfa.regex("zz", TRIE)
    with pytest.raises(UnsatisfiableConstraintError):
        dfa.regex("[^\\s\\S]", TRIE)
    with pytest.raises(VocabularyMismatchError):
        dfa.regex("a", object())
    with pytest.raises(VocabularyMismatchError):
        dfa.regex("a", ["a", "b"])


def test_vocab_size_padding_keeps_language():
    d = dfa.regex("ab", TRIE, vocab_size=20)
    assert d.vocab_size == 20 and d.accepts([0, 1]) and not d.accepts([15])


# ------------------------------------------------------------------ real tokenizer
@pytest.fixture(scope="module")
def smollm2():
    from ctrlg.lm.models import load_tokenizer

    return load_tokenizer()


SMOL_PATTERNS = [r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,4}", r"\(\d{3}\) \d{3}-\d{4}",
                 r"\d{4}-\d{2}-\d{2}", "a|ab", "(ab|a)c?", r"[α-ω]+\s[éü]", r"\s+x"]


@pytest.mark.parametrize("pattern", SMOL_PATTERNS)
def test_sampled_walks_decode_to_full_matches(smollm2, pattern):
    from ctrlg.dfa.vocab_trie import vocabulary_index

    index = vocabulary_index(smollm2)
    d = dfa.regex(pattern, smollm2)
    live = d.live_states()
    rng = np.random.default_rng(0)
    eos = smollm2.eos_token_id
    for _ in range(30):
        s, seq = d.initial, []
        while len(seq) < 40:
            tokens, nxt = d.exceptions(s)
            keep = live[nxt] & (tokens != eos)
            options = tokens[keep]
            if d.is_accepting(s) and (not len(options) or rng.random() < 0.3):
                break
            k = rng.integers(len(options))
            seq.append(int(options[k]))
            s = int(nxt[keep][k])
        if not d.is_accepting(s):
            continue
        text = index.decode_bytes(seq).decode("utf-8")
        assert re.fullmatch(pattern, text), (pattern, text, seq)
        assert d.accepts(seq + [eos])
    # canonical encodings of matching strings are among all encodings
    for text in ["ab", "a", "abc", "john.doe@mail.com", "(555) 123-4567", "2024-01-31",
                 "αβγ\té", "  x"]:
        if re.fullmatch(pattern, text):
            assert d.accepts(smollm2.encode(text, add_special_tokens=False)), text


# ------------------------------------------------------------------ class-string letters
LETTER_PATTERNS = [r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,6}", r"\(\d{3}\) \d{3}-\d{4}",
                   r"https?://[a-zA-Z0-9.-]+(/[a-zA-Z0-9._~%-]*){0,4}", r"[^\n]*",
                   r'"([^"\\]|\\["\\/bfnrt]){0,8}"', r"[α-ω]+\s[éü]", r"\s+x", r"(\w+ ){1,3}\w+\."]


@pytest.mark.parametrize("pattern", LETTER_PATTERNS)
def test_class_string_letters_match_the_per_token_walk(smollm2, pattern):
    """The all-encodings DFA built over class-string letters has exactly the per-token edges of
    the direct walk of the byte trie (every token from every live state)."""
    from ctrlg.dfa.vocab_trie import vocab_trie, walk

    trie = vocab_trie(smollm2)
    bdfa = compile_bytes_dfa(pattern)
    live = bdfa.live()
    src, tok, end = walk(trie, bdfa.table, live, np.nonzero(live)[0])
    d = dfa.regex(pattern, smollm2, minimize=False)
    assert d.has_letters and d.num_letters < trie.vocab_size // 4
    eos = smollm2.eos_token_id
    states = d.exception_states()
    keep = d.exc_tokens != eos
    got = np.stack([states[keep], d.exc_tokens[keep], d.exc_next[keep]])
    expected = np.stack([src, tok, end])[:, tok != eos]
    assert got.shape == expected.shape and (got == expected).all()
    minimal = dfa.regex(pattern, smollm2)
    assert minimal.num_states <= d.num_states
    # the per-token fallback (too many transformations × states) builds the same automaton
    from ctrlg.dfa.regex_index import token_dfa_from_bytes_dfa

    per_token = token_dfa_from_bytes_dfa(bdfa, trie, max_transformation_entries=1)
    assert not per_token.has_letters
    assert np.array_equal(per_token.accepting, d.accepting)
    dense = per_token.letter_table()                       # [S, V]: every token's successor
    assert np.array_equal(dense, d.letter_table()[:, d.letter_of_token])
    expected_dense = np.zeros_like(dense)
    expected_dense[src, tok] = end
    ended = bdfa.num_states
    expected_dense[np.flatnonzero(d.accepting), eos] = ended
    assert np.array_equal(dense, expected_dense)
    # states where most tokens loop (free text) store their loop as the default, not 40k edges
    heavy = np.bincount(src, minlength=len(dense)) * 2 > trie.vocab_size
    assert np.array_equal(per_token.default != 0, heavy & (
        (dense == per_token.default[:, None]).sum(axis=1) > (dense == 0).sum(axis=1)))
    assert per_token.num_exceptions <= len(src) + len(d.accepting)
    if pattern == r"[^\n]*":                      # the free-text state loops by default
        assert per_token.default[d.initial] == d.initial and per_token.num_exceptions < 2_000


def test_positions_count_expanded_repetitions():
    from ctrlg.dfa.regex_syntax import positions

    assert positions(parse("abc")) == 3
    assert positions(parse("a{3}b*")) == 4
    assert positions(parse("(ab|c){0,10}")) == 30
    assert positions(parse("(a{2,5}){3}")) == 15


@pytest.mark.parametrize("pattern", ["a", "a*", "a?b?", "(a|)", "(a|b)+", "a{0,3}", "a{2,3}",
                                     "(ab*)*c?", "[^a]|b*", "(a+|b?)(c|d*)"])
def test_matches_empty_agrees_with_python_re(pattern):
    import re

    from ctrlg.dfa.regex_syntax import matches_empty, parse

    assert matches_empty(parse(pattern)) == (re.fullmatch(pattern, "") is not None)


_ANCHOR_PARTS = ["a", "b", "^", "$", "(a|^b)", "(a$|b)", "(^|a)", "($|b)", "a*", "[ab]", "\\A", "\\Z"]


@given(st.lists(st.sampled_from(_ANCHOR_PARTS), min_size=1, max_size=4),
       st.lists(st.sampled_from(_ANCHOR_PARTS), min_size=0, max_size=3))
@settings(max_examples=150, deadline=None)
def test_search_language_equals_python_re_search(left, right):
    """Anchors anywhere (in alternatives, groups, the middle): the strings of search_language are
    exactly those in which re.search finds a match, over every string of length ≤ 4 on {a, b, c}."""
    from ctrlg.dfa.bytes_dfa import compile_ast
    from ctrlg.dfa.regex_syntax import CharSet, search_language

    pattern = "".join(left) + ("|" + "".join(right) if right else "")
    language = compile_ast(search_language(parse(pattern, anchors=True), CharSet(((0, 0x10FFFF),))))
    for n in range(5):
        for chars in itertools.product("abc", repeat=n):
            text = "".join(chars)
            q = language.initial
            for byte in text.encode():
                q = int(language.table[q, byte])
            assert bool(language.accepting[q]) == (re.search(pattern, text) is not None), (pattern, text)


def test_an_anchor_under_a_quantifier_is_named():
    from ctrlg.dfa.regex_syntax import CharSet, search_language

    with pytest.raises(UnsupportedRegexError, match="quantified anchor"):
        parse("a^*", anchors=True)
    with pytest.raises(UnsupportedRegexError, match="inside a repetition"):
        search_language(parse("(a|^b)+", anchors=True), CharSet(((0, 0x10FFFF),)))


# ------------------------------------------------------------------ large-automaton paths
LOOP_PATTERNS = ["[^c]*", "[^c]*c[ab]*", "a*|[^a]*", r"(\s|a|b)*c", "é[^c]*", "[ab]{0,3}"]


@pytest.mark.parametrize("pattern", LOOP_PATTERNS)
def test_per_token_construction_by_enumeration(pattern):
    """The per-token path for large automata (loop tokens skipped by the walk, majority
    defaults) accepts exactly the token sequences whose bytes match, like the letter path."""
    from ctrlg.dfa.regex_index import token_dfa_from_bytes_dfa

    bdfa = compile_bytes_dfa(pattern)
    d = token_dfa_from_bytes_dfa(bdfa, TRIE, max_transformation_entries=1)
    assert not d.has_letters
    _check_by_enumeration(d, pattern)
    if pattern == "[^c]*":       # 7 of 13 tokens loop: the state's default is itself
        assert d.default[d.initial] == d.initial


@pytest.mark.parametrize("pattern", LOOP_PATTERNS + [r'"([^"\\]|\\["\\/bfnrt])*"', r"[^\n]*x"])
def test_walk_with_loops_equals_the_plain_walk(smollm2, pattern):
    """Edges plus loop tokens of :func:`walk_with_loops` are exactly :func:`walk`'s edges."""
    from ctrlg.dfa.vocab_trie import vocab_trie, walk, walk_with_loops

    for trie in (TRIE, vocab_trie(smollm2)):
        bdfa = compile_bytes_dfa(pattern)
        live = bdfa.live()
        sources = np.nonzero(live)[0]
        src, tok, end = walk(trie, bdfa.table, live, sources)
        s2, t2, e2, loops = walk_with_loops(trie, bdfa.table, live, sources,
                                            min_loop_tokens=trie.vocab_size // 2 + 1)
        parts = [np.stack([s2, t2, e2])]
        for states, tokens in loops:
            assert len(tokens) > trie.vocab_size // 2
            parts += [np.stack([np.full(len(tokens), q), tokens, np.full(len(tokens), q)])
                      for q in states.tolist()]
        got = np.concatenate(parts, axis=1)
        got = got[:, np.lexsort((got[1], got[0]))]
        assert np.array_equal(got, np.stack([src, tok, end])), pattern


def _fixed_point_live(table, accepting):
    live = accepting.copy()
    while True:
        new = live | live[table].any(axis=1)
        if (new == live).all():
            return live
        live = new


def _random_byte_table(num_states: int, num_columns: int, seed: int):
    """(table, accepting, used bytes) of a random byte DFA: state 0 dead, ``num_columns``
    bytes used, about 30 % of the states accepting."""
    rng = np.random.default_rng(seed)
    table = np.zeros((num_states, 256), dtype=np.int32)
    used = rng.choice(256, size=num_columns, replace=False)
    table[1:, used] = rng.integers(0, num_states, size=(num_states - 1, num_columns))
    accepting = rng.random(num_states) < 0.3
    accepting[0] = False
    return table, accepting, used


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 40), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_minimize_live_and_columns_against_brute_force(num_states, num_columns, seed):
    """Backward-BFS liveness equals the fixed point; hashed column grouping equals
    ``np.unique``; the worklist refinement gives the partition of the exact Moore rounds; the
    minimised DFA has the same language (all byte strings up to length 4 over the used bytes)."""
    from ctrlg.dfa import bytes_dfa as bd

    table, accepting, used = _random_byte_table(num_states, num_columns, seed)
    assert np.array_equal(bd._live(table, accepting), _fixed_point_live(table, accepting))
    assert np.array_equal(bd._distinct_columns(table),
                          np.sort(np.unique(table.T, axis=0, return_index=True)[1]))
    dfa_in = bd.ByteDFA(table=table, accepting=accepting, initial=1)
    small = bd.minimize(dfa_in)
    live = dfa_in.live()
    masked = np.where(live[table], table, 0)
    masked[~live] = 0
    compact = masked[:, bd._distinct_columns(masked)]
    block = np.where(~live, 0, np.where(accepting, 1, 2)).astype(np.int64)
    exact_refine, fallbacks = bd._refine_exact, []
    bd._refine_exact = lambda *args: fallbacks.append(1) or exact_refine(*args)
    try:
        hashed = bd._refine(block, compact)
    finally:
        bd._refine_exact = exact_refine
    assert not fallbacks           # the worklist refinement is stable on its own
    exact = exact_refine(block, compact)
    pairs = np.unique(np.stack([hashed, exact]), axis=1).shape[1]   # the same partition
    assert pairs == len(np.unique(hashed)) == len(np.unique(exact))
    for n in range(5):
        for word in itertools.product(used.tolist(), repeat=n):
            assert small.fullmatch(bytes(word)) == (dfa_in.fullmatch(bytes(word))
                                                     and bool(live[dfa_in.run(bytes(word))]))


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 90), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_small_automata_minimise_as_the_worklist_does(num_states, num_columns, seed):
    """The whole-table path for automata of at most SMALL_DFA_STATES states gives the same
    minimal DFA, numbering included, as the worklist path (forced by a threshold of 0), and
    its liveness is the fixed point's; sizes on both sides of the threshold."""
    from ctrlg.dfa import bytes_dfa as bd

    table, accepting, used = _random_byte_table(num_states, num_columns, seed)
    dfa_in = bd.ByteDFA(table=table, accepting=accepting, initial=1)
    assert np.array_equal(bd._small_live(table, accepting), _fixed_point_live(table, accepting))
    got = bd.minimize(dfa_in)
    threshold = bd.SMALL_DFA_STATES
    bd.SMALL_DFA_STATES = 0
    try:
        want = bd.minimize(dfa_in)
    finally:
        bd.SMALL_DFA_STATES = threshold
    assert np.array_equal(got.table, want.table) and got.initial == want.initial
    assert np.array_equal(got.accepting, want.accepting)


def test_minimize_survives_hash_collisions(monkeypatch):
    """With every hash weight 1 (collisions everywhere) the checks fall back to exact
    comparisons and the result is unchanged."""
    from ctrlg.dfa import bytes_dfa as bd

    fallbacks = []
    exact = bd._refine_exact

    def counted(*args):
        fallbacks.append(1)
        return exact(*args)

    for pattern in ["(ab|ba)*c", "[a-c]{2,4}|x+", r'"([^"\\]|\\.)*"']:
        expected = compile_bytes_dfa(pattern)
        monkeypatch.setattr(bd, "SMALL_DFA_STATES", 0)       # the worklist path at every size
        monkeypatch.setattr(bd, "_hash_weights", lambda n, seed: np.ones(n, dtype=np.uint64))
        monkeypatch.setattr(bd, "_refine_exact", counted)
        got = compile_bytes_dfa(pattern)
        monkeypatch.undo()
        assert np.array_equal(got.table, expected.table)
        assert np.array_equal(got.accepting, expected.accepting)
    assert fallbacks       # the collisions were caught, not silently merged
