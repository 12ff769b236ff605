"""Counted slices of the lazy token automaton (:func:`ctrlg.dfa.lazy.class_slice`): the tokens
of a char class ``C`` by need, checked against a brute-force decoding of every token; and the
lazy masks, which use them inside counted repetitions ``C{m,n}``, equal to the eager
:func:`dfa.regex` / :func:`dfa.json_schema` masks along random walks (hypothesis), for ``n``
below, around and above the vocabulary's longest token, over the tiny BPE vocabulary and the
SmolLM2 vocabulary."""

import warnings
import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctrlg import dfa
from ctrlg.dfa import lazy as lazy_mod
from ctrlg.dfa.lazy import _PRUNE_NEVER, class_slice, lazy_regex
from ctrlg.dfa.masks import TokenMasks
from ctrlg.dfa.regex_syntax import CharSet
from ctrlg.dfa.vocab_trie import vocab_trie
from test_lazy_dfa import _compare_walk
from tiny_bpe import tiny_bpe_tokenizer


@pytest.fixture(scope="module")
def tiny():
    return tiny_bpe_tokenizer()


@pytest.fixture(scope="module")
def tiny_max_len(tiny):
    return max(len(b) for b in vocab_trie(tiny).token_bytes)


def _brute_need(data: bytes, cls: CharSet):
    """The characters ``data`` starts when it is a prefix of a string of ``C*`` (the last
    character possibly cut), else None: decode whole characters, then test the cut tail
    against every character of the class with that many leading bytes."""
    inside = lambda cp: any(lo <= cp <= hi for lo, hi in cls.ranges)  # noqa: E731
    for cut in range(0, min(4, len(data) + 1)):
        head, tail = data[:len(data) - cut], data[len(data) - cut:]
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not all(inside(ord(c)) for c in text):
            continue
        if not tail:
            return len(text)
        lead = tail[0]
        width = 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4 if lead >= 0xF0 else 0
        if width <= len(tail):
            continue
        for lo, hi in cls.ranges:       # is some character of C encoded as tail + more bytes?
            for cp in range(max(lo, 0x80), min(hi, 0x10FFFF) + 1):
                if 0xD800 <= cp <= 0xDFFF:
                    continue
                enc = chr(cp).encode("utf-8")
                if len(enc) == width and enc.startswith(tail):
                    return len(text) + 1
        return None
    return None


CLASSES = {
    "lower": CharSet(((ord("a"), ord("z")),)),
    "string": CharSet(((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E), (0xA0, 0x10FFFF))),
    "greek_e": CharSet(((ord(" "), ord(" ")), (0xE9, 0xE9), (0x3B1, 0x3C9))),
}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_class_slice_is_the_brute_force_need(tiny, name):
    cls = CLASSES[name]
    trie = vocab_trie(tiny)
    sl = class_slice(trie, cls)
    got = {int(t): k for k in range(len(sl.off))
           for t in sl.tokens[(sl.off[k - 1] if k else 0):sl.off[k]]}
    expect = {}
    for t, data in enumerate(trie.token_bytes):
        if data:
            need = _brute_need(bytes(data), cls)
            if need is not None:
                expect[t] = need
    assert got == expect
    assert class_slice(trie, cls) is sl                  # memoised per vocabulary
    # a node is pruned at r only when every token below it has need <= r
    for node in range(trie.num_nodes):
        below = _tokens_below(trie, node)
        if sl.prune[node] != _PRUNE_NEVER:
            assert all(t in expect and expect[t] <= sl.prune[node] for t in below)
        elif node:
            assert any(t not in expect for t in below) or not below


def _tokens_below(trie, node):
    out, stack = [], [node]
    while stack:
        x = stack.pop()
        out += trie.node_tokens[trie.tok_ptr[x]:trie.tok_ptr[x + 1]].tolist()
        stack += trie.child_node[trie.child_ptr[x]:trie.child_ptr[x + 1]].tolist()
    return out


def _counted_patterns(n_max):
    """Counted classes with n below, around and above the longest token (``n_max``)."""
    ns = sorted({1, 3, n_max - 1, n_max, n_max + 1, 2 * n_max + 3})
    out = []
    for n in ns:
        out += [rf'"[^"\\]{{0,{n}}}"',
                rf'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]){{{min(2, n)},{n}}}", ?[0-9]',
                rf"(?:[a-z ]{{1,{n}}},){{0,3}}\.",
                rf"(?:ab|[a-c]{{0,{n}}})!",
                rf"[ éα-ω]{{0,{n}}}(?:x|yz)"]
    return out


def test_counted_slices_are_used(tiny, tiny_max_len):
    """The walks below do go through counted slices (else they would test nothing new)."""
    lazy = lazy_regex(rf'"[^"\\]{{0,{2 * tiny_max_len}}}"', tiny)
    q = lazy.step(lazy.initial, tiny.encode('"', add_special_tokens=False)[0])
    assert lazy._counted_slice(q) is not None
    assert lazy._counted_slice(lazy.initial) is None


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_counted_masks_match_the_eager_dfa(tiny, tiny_max_len, data):
    pattern = data.draw(st.sampled_from(_counted_patterns(tiny_max_len)))
    lazy = lazy_regex(pattern, tiny)
    eager = dfa.regex(pattern, tiny, minimize=False)
    _compare_walk(lazy, eager, TokenMasks(eager),
                  lambda n: data.draw(st.integers(0, n - 1)), steps=40)


@pytest.mark.parametrize("max_len", [4, 30])
def test_counted_json_strings_match_the_eager_dfa(tiny, max_len):
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": max_len},
        "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "minLength": 2,
                                                            "maxLength": max_len}}},
        "required": ["name", "tags"], "additionalProperties": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = dfa.json_schema(schema, tiny, minimize=False)
        lazy = dfa.lazy_json_schema(schema, tiny)
    masks = TokenMasks(eager)
    rng = np.random.default_rng(max_len)
    for _ in range(15):
        _compare_walk(lazy, eager, masks, lambda n: int(rng.integers(n)), steps=80)


def _walked_against_eager(pattern, tiny, seed, walks, steps):
    """The lazy automaton of ``pattern`` after ``walks`` seeded random walks of ``steps``
    tokens, each mask and step compared with the eager automaton's (:func:`_compare_walk`)."""
    lazy = lazy_regex(pattern, tiny)
    eager = dfa.regex(pattern, tiny, minimize=False)
    masks = TokenMasks(eager)
    rng = np.random.default_rng(seed)
    for _ in range(walks):
        _compare_walk(lazy, eager, masks, lambda n: int(rng.integers(n)), steps=steps)
    return lazy


def _walked(lazy, rng, walks, steps):
    """The states of ``walks`` uniform random walks of at most ``steps`` tokens."""
    states = set()
    for _ in range(walks):
        q = lazy.initial
        for _ in range(steps):
            states.add(q)
            ids = np.flatnonzero(lazy.mask(q))
            if not len(ids):
                break
            q = lazy.step(q, int(ids[rng.integers(len(ids))]))
    return states


def _plain_mask(lazy, q):
    """The mask of live state ``q`` from :meth:`LazyTokenDFA._expand` (its loop slice, if
    any, added; EOS where ``q`` accepts), built afresh rather than memoised."""
    plain = np.zeros(lazy.vocab_size, dtype=bool)
    tok, _, loop = lazy._expand(q)
    plain[tok] = True
    if loop is not None:
        plain[loop] = True
    if lazy.eos_token_id is not None:
        plain[lazy.eos_token_id] = bool(lazy.bdfa.accepting[q])
    return plain


def test_counted_slice_off_matches_full_walk(tiny, tiny_max_len, monkeypatch):
    """Every state's mask is the same with and without counted slices."""
    pattern = rf'(?:"[^"\\]{{0,{tiny_max_len + 2}}}"|[a-z]{{2,{tiny_max_len - 1}}}) ?[0-9]{{0,3}}'
    with_slices = lazy_regex(pattern, tiny)
    states = _walked(with_slices, np.random.default_rng(0), 20, 30)
    monkeypatch.setattr(lazy_mod.LazyTokenDFA, "_counted_slice", lambda self, q: None)
    used = 0
    for q in states:
        if q in (0, 1):
            continue
        assert np.array_equal(with_slices.mask(q), _plain_mask(with_slices, q)), q
        used += 1
    assert used >= 10


@pytest.mark.parametrize("max_len", [12, 100])
def test_smollm2_counted_strings_match_the_eager_dfa(smollm2_tokenizer, max_len):
    """The real vocabulary (longest token 81 bytes): strings of at most 12 and 100 characters
    (below and above it), keys and values, through the shared class slices."""
    trie = vocab_trie(smollm2_tokenizer)
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": max_len},
        "code": {"type": "string", "pattern": "^[A-Za-z0-9_ ]{0,%d}$" % max_len}},
        "required": ["name", "code"], "additionalProperties": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = dfa.json_schema(schema, trie, minimize=False)
        lazy = dfa.lazy_json_schema(schema, trie)
    masks = TokenMasks(eager, max_table_bytes=0)
    rng = np.random.default_rng(max_len)
    for _ in range(4):
        _compare_walk(lazy, eager, masks, lambda n: int(rng.integers(n)), steps=40)


@pytest.mark.parametrize("pattern", [r'"[^"\\]{0,60}", ?[0-9]',
                                     r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]){3,50}"',
                                     r"[a-z ]{0,40}\.(?:[a-z]{0,3},){0,2}",
                                     r"[ -~éα-ω]{5,45}(?:\n|yz)"])
def test_translated_masks_match_the_eager_dfa(tiny, pattern):
    """Deep inside a long counter a state's mask is read off an earlier position's
    (:meth:`LazyTokenDFA._translated_mask`); those masks, and the steps taken without rows
    (:meth:`LazyByteDFA.run_bytes`), agree with the eager automaton up to the counter's end."""
    lazy = _walked_against_eager(pattern, tiny, seed=7, walks=12, steps=70)
    assert lazy.translated_masks > 0


def test_translation_needs_the_same_walk(tiny):
    """Where the copies differ (an alternative that only fits the first copies), no mask is
    translated wrongly: the masks still match the eager ones position by position."""
    pattern = r'(?:"[a-z]{0,30}"|"ab[a-z]{0,3}x")'
    lazy = lazy_regex(pattern, tiny)
    eager = dfa.regex(pattern, tiny, minimize=False)
    masks = TokenMasks(eager)
    ids = lambda s: tiny.encode(s, add_special_tokens=False)  # noqa: E731
    for text in ['"' + "a" * k for k in range(0, 30)] + ['"ab' + "c" * k for k in range(6)]:
        ql, qe = lazy.run(ids(text)), eager.run(ids(text))
        assert np.array_equal(lazy.mask(ql), masks(qe)), text


@pytest.mark.parametrize("pattern", [r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]){0,12}"',
                                     r"x[a-c]{2,9}y[^a]{0,5}", r"(?:ab|[a-z]){3,8}"])
def test_translates_is_the_edge_by_edge_commutation(pattern):
    """:meth:`TemplateNFA.translates` (a block comparison for copied template states) implies
    that the renamed edges and ε-moves of the state agree, and is implied by it beyond the
    first copy (whose start lies outside the region, so it may be refused there), and
    ``run_of`` counts the translations in a row."""
    from ctrlg.dfa.lazy import TemplateNFA, parse
    nfa = TemplateNFA()
    s, e = nfa.add_state(), nfa.add_state()
    nfa.build(parse(pattern), s, e)
    assert nfa.regions
    for k, (lo, hi, d) in enumerate(nfa.regions):
        sigma = lambda x: x + d if lo <= x < hi else x  # noqa: E731
        for y in range(len(nfa.edges)):
            y2 = sigma(y)
            brute = y2 < len(nfa.edges) and (not lo <= y < hi or y2 < hi) and \
                set(nfa.edges_of(y2)) == {(a, b, sigma(t)) for a, b, t in nfa.edges_of(y)} and \
                set(nfa.eps_of(y2)) == {sigma(t) for t in nfa.eps_of(y)} and \
                all(not lo <= t < hi or t + d < hi
                    for t in [t for _, _, t in nfa.edges_of(y)] + list(nfa.eps_of(y)))
            if nfa.translates(k, y):
                assert brute, (k, y)
            if brute and lo + d <= y:
                assert nfa.translates(k, y), (k, y)
            if lo <= y < hi:
                n = nfa.run_of(k, y)
                assert all(nfa.translates(k, y + m * d) for m in range(n))
                assert not nfa.translates(k, y + n * d) if y + n * d < hi else True


def test_class_slice_masks_in_any_order(tiny):
    """``ClassSlice.mask(r)`` (built from the nearest memoised count) is the tokens of need ≤ r
    whatever order the counts are asked in."""
    trie = vocab_trie(tiny)
    sl = class_slice(trie, CharSet(((0x20, 0x7E),)))
    order = list(range(len(sl.off)))[::-1] + [0, len(sl.off) - 1, 2]
    for r in order:
        expect = np.zeros(trie.vocab_size, dtype=bool)
        expect[sl.tokens[:sl.off[r]]] = True
        assert np.array_equal(sl.mask(r), expect), r


def test_slice_caches_stay_bounded_and_exact(tiny, monkeypatch):
    """A serving process meets schema after schema: the per-vocabulary slice caches and each
    class slice's memoised masks are cleared when full, and masks rebuilt after a clear are the
    same sets (tokens of need ≤ r)."""
    monkeypatch.setattr(lazy_mod, "MAX_MASKS_PER_SLICE", 2)
    monkeypatch.setattr(lazy_mod, "MAX_CACHED_SLICES", 3)
    monkeypatch.setattr(lazy_mod, "_CLASS_SLICES", weakref.WeakKeyDictionary())
    trie = vocab_trie(tiny)
    sl = class_slice(trie, CharSet(((97, 122),)))
    for r in [1, 3, 2, 5, 4, 1, len(sl.off) - 1]:
        got = sl.mask(r)
        want = np.zeros(trie.vocab_size, dtype=bool)
        want[sl.tokens[:sl.off[r]]] = True
        assert (got == want).all()
        assert len(sl.masks) <= 2
    for lo in range(97, 103):
        class_slice(trie, CharSet(((lo, lo + 3),)))
        assert len(lazy_mod._CLASS_SLICES[trie]) <= 3


def _assert_rows_are_the_subset_construction(lazy):
    """Every built row (translated ones included) equals the subset construction's row of the
    same NFA subset (rebuilt here; subsets are interned, so equal rows have equal ids)."""
    b = lazy.bdfa
    built = [q for q in range(2, b.num_states) if b.computed[q]]
    rows = {q: b.table[q].copy() for q in built}
    for q in built:
        b._subset_row(q)
        assert np.array_equal(b.table[q], rows[q]), (q, sorted(b._sets[q]))
    return len(built)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_translated_rows_are_the_subset_construction(tiny, tiny_max_len, data):
    """Rows moved along a counter (:meth:`LazyByteDFA._translated_row`) are exactly the rows
    the subset construction builds, and the masks over them match the eager automaton's."""
    pattern = data.draw(st.sampled_from(_counted_patterns(tiny_max_len) + [
        r'"[^"\\]{0,60}", ?[0-9]', r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]){3,50}"',
        r"[a-z ]{0,40}\.(?:[a-z]{0,3},){0,2}", r"[ -~éα-ω]{5,45}(?:\n|yz)",
        r'(?:"[a-z]{0,30}"|"ab[a-z]{0,3}x")', r"(?:ab|[a-z]){3,40}c"]))
    lazy = lazy_regex(pattern, tiny)
    eager = dfa.regex(pattern, tiny, minimize=False)
    masks = TokenMasks(eager)
    seed = data.draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    for _ in range(3):
        _compare_walk(lazy, eager, masks, lambda n: int(rng.integers(n)), steps=60)
    _assert_rows_are_the_subset_construction(lazy)


def test_translated_rows_are_used(tiny):
    lazy = lazy_regex(r'"[^"\\]{0,60}", ?[0-9]', tiny)
    _walked(lazy, np.random.default_rng(1), 6, 60)
    assert lazy.bdfa.translated_rows > 10
    assert _assert_rows_are_the_subset_construction(lazy) > lazy.bdfa.translated_rows


@pytest.mark.parametrize("max_len", [100, 300])
def test_smollm2_translated_rows(smollm2_tokenizer, max_len):
    """The real vocabulary, a JSON string of at most 100 / 300 characters: the rows moved
    along the counter are the subset construction's, and the masks match the eager ones."""
    trie = vocab_trie(smollm2_tokenizer)
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": max_len},
        "n": {"type": "integer"}}, "required": ["name", "n"], "additionalProperties": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lazy = dfa.lazy_json_schema(schema, trie)
        eager = dfa.json_schema(schema, trie, minimize=False) if max_len <= 100 else None
    rng = np.random.default_rng(max_len)
    if eager is not None:
        masks = TokenMasks(eager, max_table_bytes=0)
        for _ in range(3):
            _compare_walk(lazy, eager, masks, lambda n: int(rng.integers(n)), steps=60)
    else:
        _walked(lazy, rng, 3, 120)
    assert lazy.bdfa.translated_rows > 0
    _assert_rows_are_the_subset_construction(lazy)


def _pure_class_tokens(trie, cls):
    """``{token: need}`` of the tokens spelled by a string of ``Pref(C*)``."""
    sl = class_slice(trie, cls)
    return {int(t): k for k in range(len(sl.off))
            for t in sl.tokens[(sl.off[k - 1] if k else 0):sl.off[k]]}


@pytest.mark.parametrize("pattern", [r'"[^"\\]{0,40}", ?[0-9]',
                                     r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]){2,30}"',
                                     r"(?:ab|[a-c]){0,20}!", r"[a-z ]{0,25}[a-z0-9]*\.",
                                     r"(?:[a-z ]{1,12},){0,3}\.", r"[ éα-ω]{0,20}(?:x|yz)"])
def test_class_depth_bounds_the_live_need(tiny, pattern):
    """:meth:`LazyByteDFA.class_depth`: wherever it gives a bound ``D``, no token of
    ``Pref(C*)`` with need above ``D`` is live (brute force: the token's bytes run through the
    automaton), for every class noted in the state; and the masks that use it (near a
    counter's end) equal the eager automaton's."""
    lazy = _walked_against_eager(pattern, tiny, seed=3, walks=12, steps=40)
    trie = vocab_trie(tiny)
    b = lazy.bdfa
    bounded = 0
    for q in range(2, b.num_states):
        classes = {cls for s in b._sets[q] for cls, _ in b.notes_of(s)}
        for cls in classes:
            D = b.class_depth(q, cls, 40)
            if D is None:
                continue
            bounded += 1
            for t, need in _pure_class_tokens(trie, cls).items():
                if need > D:
                    assert b.run_bytes(q, bytes(trie.token_bytes[t])) == 0, (q, t, need, D)
    if "*" not in pattern:
        assert bounded > 0


def test_depth_pruned_masks_are_used_and_exact(tiny, tiny_max_len, monkeypatch):
    """Near a counter's end the walk skips every subtrie of ``Pref(C*)`` tokens (limit
    ``_PRUNE_NEVER - 1`` below the longest token's need); the masks are the full walk's."""
    pattern = rf'"[^"\\]{{0,{tiny_max_len + 6}}}", ?[0-9]'
    lazy = lazy_regex(pattern, tiny)
    states = _walked(lazy, np.random.default_rng(5), 20, 40)
    pruned = [q for q in states if q > 1 and (got := lazy._counted_slice(q)) is not None
              and got[2] == _PRUNE_NEVER - 1 and got[0].sum() < len(class_slice(
                  vocab_trie(tiny), CharSet(((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)))).tokens)]
    assert pruned
    monkeypatch.setattr(lazy_mod.LazyTokenDFA, "_counted_slice", lambda self, q: None)
    for q in states:
        if q in (0, 1):
            continue
        assert np.array_equal(lazy.mask(q), _plain_mask(lazy, q)), q
