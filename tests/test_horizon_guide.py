"""The lazy guide (ctrlg.guide.horizon) against enumeration: exact budget masks, the token bound
u(s) ≥ d(s) and its completions, Ctrl-G's p_hmm(α | x≤t, v) when the horizon covers the budget,
and the horizon estimate p_hmm(α_k | x≤t, v) by its definition; and against the eager tables
(GuideTables over the materialised automaton) on a JSON schema with a BPE vocabulary."""

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra
from helpers import random_hmm
from tiny_bpe import tiny_bpe_tokenizer

from ctrlg import dfa
from ctrlg.dfa.lazy import DEAD, ENDED, lazy_regex
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError, VocabularyMismatchError
from ctrlg.guide import GuideTables
from ctrlg.guide.guidance import guidance_log_ratio
from ctrlg.guide.horizon import (HorizonGuide, LazyFeasibility, _descent, _descent_py,
                                 _rarity_order,
                                 _rarity_order_py, _unit_distances, _unit_distances_py)

# single bytes, pairs, a triple and a token without a single-byte spelling of its own ("d" only
# inside "dd"); the last token is EOS
TOKENS = [b"a", b"b", b"c", b"ab", b"ba", b"abc", b"dd", b"\x00"]
EOS = len(TOKENS) - 1
V = len(TOKENS)
PATTERNS = [r"(ab|c)*ba?", r"a(b|c){1,3}(dd)?", r"(a|bc|dd)+c", r"[abc]{2,4}"]


def _lazy(pattern):
    return lazy_regex(pattern, TOKENS, eos_token_id=EOS)


def _sequences(max_len):
    """Every terminal token sequence of at most ``max_len`` tokens: ends with EOS, or has exactly
    ``max_len`` tokens."""
    for n in range(1, max_len + 1):
        for seq in itertools.product(range(V), repeat=n):
            if EOS in seq[:-1]:
                continue
            if seq[-1] == EOS or n == max_len:
                yield seq


def _accepted(d, prefix, rest):
    q = d.run(prefix)
    for t in rest:
        q = d.step(q, t)
        if q == DEAD:
            return False
    return d.is_accepting(q)


def _hmm_prob(hmm, seq):
    pi, A, B = (x.double().numpy() for x in (hmm.initial, hmm.transition, hmm.emission))
    alpha = pi * B[:, seq[0]]
    for t in seq[1:]:
        alpha = (alpha @ A) * B[:, t]
    return float(alpha.sum())


def _min_tokens(d, q, limit=8):
    """d(q) by breadth-first enumeration over token sequences (non-EOS), None beyond ``limit``."""
    layer = {q}
    for depth in range(limit + 1):
        if any(s != DEAD and d.is_accepting(s) for s in layer):
            return depth
        layer = {d.step(s, t) for s in layer for t in range(V) if t != EOS} - {DEAD}
    return None


@pytest.mark.parametrize("pattern", PATTERNS)
def test_masks_are_exact_under_the_budget(pattern):
    d = _lazy(pattern)
    feas = LazyFeasibility(d)
    n = 5
    terminal = list(_sequences(n))
    for prefix in [(), (0,), (2,), (0, 1), (3,), (4,)]:
        q = d.run(prefix)
        if q == DEAD:
            continue
        r = n - len(prefix)
        want = np.zeros(V, dtype=bool)
        for seq in _sequences(r):
            if _accepted(d, prefix, seq):
                want[seq[0]] = True
        got = feas.mask(q, r)
        assert np.array_equal(got, want), (pattern, prefix, got, want)
    assert terminal


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_bound_is_never_below_the_token_distance(pattern):
    d = _lazy(pattern)
    feas = LazyFeasibility(d)
    seen = set()
    for prefix in itertools.product(range(V - 1), repeat=3):
        for cut in range(4):
            q = d.run(prefix[:cut])
            if q in (DEAD, ENDED) or q in seen:
                continue
            seen.add(q)
            exact = _min_tokens(d, q)
            bound = feas.upper_bound(q)
            assert exact is not None and bound >= exact, (pattern, prefix[:cut], bound, exact)
            for k in range(6):
                assert feas.within(q, k) == (exact <= k)
            tokens, s = [], q                   # the completion behind the bound is accepted
            while (step := feas.completion_step(s)) is not None:
                assert d.step(s, step[0]) == step[1]
                tokens.append(step[0])
                s = step[1]
            assert d.is_accepting(s) and len(tokens) == feas.upper_bound(q)
    assert len(seen) >= 3


def _prior_after(guide, prefix):
    prior = guide.initial_prior()
    for t in prefix:
        prior = guide.advance_prior(prior, t)
    return prior


def _brute_ratio(hmm, d, prefix, r, horizon=None, tail=None):
    """log p_hmm(α | x≤t, v) for every v by enumeration; with ``horizon``, α_k of the module
    docstring (k = min(horizon, r)): a path of k tokens ending in state s is worth
    P_hmm(x≤t v y tail(s)), ``tail(s)`` the tokens appended at the horizon (None: worth 0)."""
    k = r if horizon is None else min(horizon, r)
    out = np.full(V, -np.inf)
    for v in range(V):
        num, den = 0.0, _hmm_prob(hmm, list(prefix) + [v])
        for rest in _sequences(k - 1) if k > 1 else [()]:
            seq = [v, *rest]
            if EOS in seq[:-1]:
                continue
            q = d.run(prefix)
            for t in seq:
                q = d.step(q, t)
                if q == DEAD:
                    break
            if q == DEAD:
                continue
            extra = []
            if seq[-1] == EOS or len(seq) < k:
                ok = seq[-1] == EOS and d.is_accepting(q)
            elif horizon is None:
                ok = d.is_accepting(q)
            else:
                extra = tail(q)
                ok = extra is not None
            if ok:
                num += _hmm_prob(hmm, list(prefix) + seq + (extra or []))
        if v == EOS:
            num = den if d.is_accepting(d.run(prefix)) else 0.0
        if num > 0:
            out[v] = math.log(num) - math.log(den)
    return out


@pytest.fixture(params=["product", "gather", "dense"])
def product_path(request, monkeypatch):
    """Each way log_ratio reads p · B[:, v] and p ⊙ Ŵ · B[:, v]: one product over V with the
    groups' columns gathered, the columns alone (no product), every group off the product."""
    import ctrlg.guide.horizon as horizon

    if request.param == "product":
        monkeypatch.setattr(horizon, "PRODUCT_SHARE", 0.0)
    elif request.param == "gather":
        monkeypatch.setattr(horizon, "PRODUCT_SHARE", 1.0)
        monkeypatch.setattr(horizon, "GATHER_BLOCK", 2)          # several blocks
    else:
        monkeypatch.setattr(horizon, "DENSE_GROUP", 1)
    return request.param


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_horizon_over_the_budget_is_ctrlg_exactly(pattern, product_path):
    d = _lazy(pattern)
    hmm = random_hmm(3, V, seed=1)
    n = 4
    guide = HorizonGuide(d, hmm, n, horizon=n, max_region_states=10_000)
    for prefix in [(), (0,), (2,), (3,), (0, 1)]:
        q = d.run(prefix)
        if q == DEAD:
            continue
        prior = _prior_after(guide, prefix)
        r = n - len(prefix)
        got = guide.log_ratio(q, prior, r).double().numpy()
        want = _brute_ratio(hmm, d, prefix, r)
        assert np.array_equal(np.isfinite(got), np.isfinite(want)), (prefix, got, want)
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("horizon", [1, 2, 3])
def test_a_short_horizon_is_its_named_approximation(pattern, horizon, product_path):
    d = _lazy(pattern)
    hmm = random_hmm(3, V, seed=2)
    n = 6
    guide = HorizonGuide(d, hmm, n, horizon=horizon, max_region_states=10_000)
    feas = guide.feasibility
    for prefix in [(), (0,), (2,), (0, 1)]:
        q = d.run(prefix)
        if q == DEAD:
            continue
        prior = _prior_after(guide, prefix)
        r = n - len(prefix)
        k = min(horizon, r)
        left = r - k
        got = guide.log_ratio(q, prior, r).double().numpy()
        def tail(s):              # W_0(s) = [u(s) ≤ left] · β(s); left = 0: [s accepting]
            if feas.upper_bound(s, left) > left:
                return None
            if left == 0:
                return []
            tokens = []
            while (step := feas.completion_step(s)) is not None:
                tokens.append(step[0])
                s = step[1]
            return tokens + [EOS]

        want = _brute_ratio(hmm, d, prefix, r, horizon=horizon, tail=tail)
        allowed = feas.mask(q, r)
        assert np.array_equal(np.isfinite(got), allowed)
        estimated = np.isfinite(want) & allowed
        np.testing.assert_allclose(got[estimated], want[estimated], rtol=1e-4, atol=1e-5)
        floored = allowed & ~np.isfinite(want)      # allowed, estimate 0: below every estimate
        if floored.any() and estimated.any():
            assert got[floored].max() < got[estimated].min()


def test_a_small_region_keeps_the_masks_exact():
    d = _lazy(PATTERNS[2])
    hmm = random_hmm(4, V, seed=3)
    n = 6
    small = HorizonGuide(d, hmm, n, horizon=6, max_region_states=2)
    feas = LazyFeasibility(d)
    for prefix in [(), (0,), (6,), (0, 6)]:
        q = d.run(prefix)
        prior = _prior_after(small, prefix)
        got = small.log_ratio(q, prior, n - len(prefix))
        assert np.array_equal(torch.isfinite(got).numpy(), feas.mask(q, n - len(prefix)))


def test_matches_the_eager_tables_on_a_json_schema(product_path):
    tok = tiny_bpe_tokenizer()
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    lazy = dfa.lazy_json_schema(schema, tok, whitespace="")
    n = 14
    hmm = random_hmm(4, lazy.vocab_size, seed=4)
    eager = lazy.materialize(n)
    tables = GuideTables(eager, hmm, n, eos_token_id=lazy.eos_token_id)
    guide = HorizonGuide(lazy, hmm, n, horizon=n, max_region_states=100_000)
    rng = np.random.default_rng(0)
    q_lazy, q_eager, prior = lazy.initial, eager.initial, guide.initial_prior()
    for step in range(n):
        r = n - step
        got = guide.log_ratio(q_lazy, prior, r)
        want = guidance_log_ratio([tables], [0], [q_eager], prior[None], r)[0]
        assert torch.equal(torch.isfinite(got), torch.isfinite(want)), step
        fin = torch.isfinite(want)
        torch.testing.assert_close(got[fin], want[fin], rtol=2e-3, atol=2e-3)
        allowed = np.flatnonzero(fin.numpy())
        v = int(rng.choice(allowed))
        if v == lazy.eos_token_id:
            break
        q_lazy, q_eager = lazy.step(q_lazy, v), eager.step(q_eager, v)
        prior = guide.advance_prior(prior, v)


def test_bad_arguments_are_named():
    d = _lazy(PATTERNS[0])
    with pytest.raises(ConstraintError, match="horizon"):
        HorizonGuide(d, None, 4, horizon=0)
    with pytest.raises(ConstraintError, match="max_region_states"):
        HorizonGuide(d, None, 4, max_region_states=1)
    with pytest.raises(VocabularyMismatchError, match="vocabulary size"):
        HorizonGuide(d, random_hmm(2, V + 1, seed=0), 4)
    with pytest.raises(UnsatisfiableConstraintError, match="max_new_tokens=1"):
        HorizonGuide(_lazy("abcabc"), None, 1)
    with pytest.raises(ConstraintError, match="LazyTokenDFA"):
        LazyFeasibility(dfa.regex("ab", TOKENS, eos_token_id=EOS))


def _schema_constraints(tok):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 4},
                                               "id": {"type": "integer"}},
              "required": ["name"], "additionalProperties": False}
    eager = dfa.json_schema(schema, tok, whitespace="")
    lazy = dfa.lazy_json_schema(schema, tok, whitespace="")
    return eager, lazy


@pytest.mark.parametrize("mode", ["logical", "ctrlg"])
def test_the_processor_with_a_full_horizon_matches_the_tables(mode):
    """Sampled rows (some finishing early, rows re-drawn each step as beams are): the lazy guide
    with horizon = budget gives the tables' guided scores, step by step."""
    from ctrlg.sampler import ConstraintLogitsProcessor

    tok = tiny_bpe_tokenizer()
    eager, lazy = _schema_constraints(tok)
    V, eos, n = eager.vocab_size, tok.eos_token_id, 16
    hmm = random_hmm(4, V, seed=5) if mode == "ctrlg" else None
    procs = [ConstraintLogitsProcessor(hmm, eager, max_new_tokens=n, eos_token_id=eos, mode=mode,
                                       precision="float32"),
             ConstraintLogitsProcessor(hmm, lazy, max_new_tokens=n, eos_token_id=eos, mode=mode,
                                       precision="float32", horizon=n, max_region_states=10**6)]
    g = torch.Generator().manual_seed(0)
    ids = torch.zeros(4, 1, dtype=torch.long)
    done = torch.zeros(4, dtype=torch.bool)
    for _ in range(n):
        logits = torch.randn(4, V, generator=g) * 3
        a, b = (p(ids, logits.clone()) for p in procs)
        assert torch.equal(torch.isfinite(a), torch.isfinite(b))
        torch.testing.assert_close(a[torch.isfinite(a)], b[torch.isfinite(b)], atol=2e-3, rtol=2e-3)
        nxt = torch.multinomial(torch.softmax(a, -1), 1, generator=g)[:, 0]
        nxt = torch.where(done, eos, nxt)
        ids = torch.cat([ids, nxt[:, None]], 1)
        done |= nxt == eos
        order = torch.randperm(4, generator=g)        # rows reordered, as beams are
        ids, done = ids[order], done[order]
        if done.all():
            break
    for row in ids[:, 1:].tolist():
        toks = row[:row.index(eos) + 1] if eos in row else row
        assert lazy.accepts(toks)


def test_a_short_horizon_keeps_every_generation_accepted():
    from helpers import tiny_llama

    from ctrlg.sampler import generate

    tok = tiny_bpe_tokenizer()
    _, lazy = _schema_constraints(tok)
    V = lazy.vocab_size
    model = tiny_llama(V, seed=1)
    hmm = random_hmm(6, V, seed=6)
    out = generate(model, tok, [0], lazy, hmm=hmm, max_new_tokens=14, num_samples=6, seed=0,
                   eos_token_id=tok.eos_token_id, horizon=3)
    assert out, "no accepted output"
    for gen in out:
        assert lazy.accepts(gen.token_ids)
        assert gen.token_ids[-1] == tok.eos_token_id or len(gen.token_ids) == 14


def test_the_processor_names_what_horizon_does_not_support_and_checks_first_horizon():
    from ctrlg.sampler import ConstraintLogitsProcessor

    tok = tiny_bpe_tokenizer()
    eager, lazy = _schema_constraints(tok)
    hmm = random_hmm(2, eager.vocab_size, seed=0)
    eos = tok.eos_token_id
    with pytest.raises(ConstraintError, match="lazy automata"):
        ConstraintLogitsProcessor(hmm, eager, max_new_tokens=8, eos_token_id=eos, horizon=4)
    for kwargs, name in [({"suffix_ids": [3]}, "suffix_ids"), ({"min_new_tokens": 2}, "min_new_tokens"),
                         ({"beam_score": "lookahead"}, "lookahead")]:
        with pytest.raises(ConstraintError, match=name):
            ConstraintLogitsProcessor(hmm, lazy, max_new_tokens=8, eos_token_id=eos, horizon=4, **kwargs)
    with pytest.raises(ConstraintError, match="horizon"):
        ConstraintLogitsProcessor(hmm, lazy, max_new_tokens=8, eos_token_id=eos, horizon=0)
    with pytest.raises(ConstraintError, match="first_horizon needs horizon"):
        ConstraintLogitsProcessor(hmm, eager, max_new_tokens=8, eos_token_id=eos, first_horizon=1)
    with pytest.raises(ConstraintError, match="first_horizon"):
        ConstraintLogitsProcessor(hmm, lazy, max_new_tokens=8, eos_token_id=eos, horizon=4,
                                  first_horizon=0)
    with pytest.raises(ConstraintError, match="first_horizon"):
        HorizonGuide(_lazy(PATTERNS[0]), None, 4, first_horizon=0)
    proc = ConstraintLogitsProcessor(hmm, lazy, max_new_tokens=8, eos_token_id=eos, horizon=4,
                                     first_horizon=1)
    assert [(g.horizon, g.first_horizon) for g in proc.horizon_rows.guides] == [(4, 1)]


@pytest.mark.parametrize("gather_sums, large_letter", [(0, None), (512, None), (0, 2)])
def test_pair_sums_are_the_groups_column_sums(gather_sums, large_letter, monkeypatch):
    """Ē_{s,t} against a direct sum of B's columns, for every group of every state met along a
    walk of a JSON schema's lazy automaton, a group of more than half the vocabulary (the
    complement path) included; by the sparse product (``GATHER_SUMS`` 0) and the gather, and
    with every group of two tokens or more (short of half the vocabulary) from the HMM's store
    of large sums (``LARGE_LETTER`` 2; the complement then adds the stored sums back)."""
    import ctrlg.guide.horizon as horizon

    monkeypatch.setattr(horizon, "GATHER_SUMS", gather_sums)
    if large_letter is not None:
        monkeypatch.setattr(horizon, "LARGE_LETTER", large_letter)
    tok = tiny_bpe_tokenizer()
    lazy = dfa.lazy_json_schema({"type": "object", "properties": {"note": {"type": "string"}}},
                                tok, whitespace="")
    hmm = random_hmm(4, lazy.vocab_size, seed=5)
    guide = HorizonGuide(lazy, hmm, 12, horizon=3)
    B = hmm.emission.double()
    big_groups = 0
    walk = [lazy.initial]
    for _ in range(8):                       # the first allowed token at each step
        allowed = np.flatnonzero(guide.mask(walk[-1], 12 - len(walk) + 1))
        allowed = allowed[allowed != lazy.eos_token_id]
        if not len(allowed):
            break
        walk.append(lazy.step(walk[-1], int(allowed[-1])))
    stored_groups = 0
    for s in walk:
        _, members = guide.feasibility.groups(s)
        got = guide.pair_sums(s).double()
        for j, tokens in enumerate(members):
            big_groups += len(tokens) > lazy.vocab_size // 2
            stored_groups += large_letter is not None and \
                large_letter <= len(tokens) <= lazy.vocab_size // 2
            np.testing.assert_allclose(got[j].numpy(), B[:, tokens].sum(1).numpy(), rtol=1e-5,
                                       atol=1e-7)
    assert big_groups > 0
    assert (stored_groups > 0) == (large_letter is not None)


@given(st.lists(st.integers(0, 6), min_size=1, max_size=64), st.integers(0, 2**32 - 1))
def test_the_rarity_order_is_unique_then_a_stable_sort_by_count(values, seed):
    """The compiled rarity order of the explorer's successors against numpy's unique + stable
    argsort (its definition) and against its own Python source, on random rows and masks."""
    row = np.asarray(values, dtype=np.int32)
    single = np.random.default_rng(seed).random(len(row)) < 0.8
    targets, counts = np.unique(row[single], return_counts=True)
    keep = targets != DEAD
    expected = targets[keep][np.argsort(counts[keep], kind="stable")].tolist()
    assert _rarity_order(row, single, DEAD).tolist() == expected
    assert _rarity_order_py(row, single, DEAD).tolist() == expected


@given(st.integers(1, 12), st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)),
                                    max_size=40), st.lists(st.integers(0, 11), max_size=3))
def test_unit_distances_are_a_multi_source_shortest_path(n, edges, sources):
    """The compiled breadth-first distances against scipy's unit-weight Dijkstra (and against
    their Python source) on random graphs, duplicate edges and self-loops included."""
    edges = [(a % n, b % n) for a, b in edges]
    sources = np.asarray(sorted({s % n for s in sources}), dtype=np.int64)
    heads = np.asarray([a for a, _ in edges], dtype=np.int64)
    tails = np.asarray([b for _, b in edges], dtype=np.int64)
    if len(sources):
        graph = csr_matrix((np.ones(len(heads)), (heads, tails)), shape=(n, n))
        expected = dijkstra(graph, directed=True, indices=sources, min_only=True,
                            unweighted=True)
    else:
        expected = np.full(n, np.inf)
    np.testing.assert_array_equal(_unit_distances(heads, tails, n, sources), expected)
    np.testing.assert_array_equal(_unit_distances_py(heads, tails, n, sources), expected)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_compiled_descent_is_its_python_source(pattern):
    """The completion path read off the byte distances, compiled and in Python, from every
    state with a finite distance once the automaton is explored from every token state."""
    d = _lazy(pattern)
    feas = LazyFeasibility(d)
    for prefix in [(), (0,), (2,), (0, 1), (3,), (4,), (6,)]:
        q = d.run(prefix)
        if q != DEAD:
            feas.upper_bound(q)
    dist = feas._byte_distances()
    finite = [q for q in range(len(dist)) if np.isfinite(dist[q]) and dist[q] > 0]
    assert finite
    for q in finite:
        got = _descent(d.bdfa.table, dist, feas._single, q)
        want = _descent_py(d.bdfa.table, dist, feas._single, q)
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
        assert len(got[0]) == int(dist[q])
        end = q
        for byte in got[1].tolist():
            end = int(d.bdfa.table[end, byte])
        assert d.bdfa.accepting[end]


def _log_hmm_prob(hmm, seq):
    """log P_hmm(seq) by the forward recurrence in log space (long sequences underflow)."""
    log_pi, log_a, log_b = (x.double().log() for x in (hmm.initial, hmm.transition,
                                                         hmm.emission))
    alpha = log_pi + log_b[:, seq[0]]
    for t in seq[1:]:
        alpha = torch.logsumexp(alpha[:, None] + log_a, 0) + log_b[:, t]
    return float(torch.logsumexp(alpha, 0))


def test_an_estimate_far_below_float64s_range_is_kept():
    """Every completion from the first token's successors has log probability below −709 (400
    forced tokens, then EOS): the region's scales must carry it, and the ratio of each first
    token is P(v, its completion) / P(v), by the log-space forward recurrence."""
    d = _lazy(r"(a|b)c{400}")
    hmm = random_hmm(3, V, seed=3)
    guide = HorizonGuide(d, hmm, 410, horizon=2)
    got = guide.log_ratio(d.initial, guide.initial_prior(), 410).double().numpy()
    a, b, c = 0, 1, 2
    for v in (a, b):
        tail = [v] + [c] * 400 + [EOS]
        assert _log_hmm_prob(hmm, tail) < -709
        want = _log_hmm_prob(hmm, tail) - _log_hmm_prob(hmm, [v])
        assert got[v] == pytest.approx(want, rel=1e-5)
    assert np.isinf(np.delete(got, [a, b])).all()


def test_guides_of_one_hmm_share_the_transposed_transition_until_it_changes():
    """Aᵀ is built once per HMM (not per guide) and again after an in-place change of A."""
    d = _lazy(PATTERNS[0])
    hmm = random_hmm(3, V, seed=4)
    first, second = HorizonGuide(d, hmm, 6), HorizonGuide(d, hmm, 6)
    assert second._transition_t is first._transition_t
    assert torch.equal(first._transition_t, hmm.transition.float().T)
    with torch.no_grad():
        hmm.transition.mul_(0.5)
    third = HorizonGuide(d, hmm, 6)
    assert third._transition_t is not first._transition_t
    assert torch.equal(third._transition_t, hmm.transition.float().T)


@pytest.mark.parametrize("descent", [_descent, _descent_py])
def test_a_stale_distance_is_an_error_not_a_made_up_path(descent):
    """A state whose distance no row descends from (here: a row of zeros, the dead state)
    raises instead of returning bytes that were never read."""
    table = np.zeros((3, 256), dtype=np.int32)
    dist = np.array([np.inf, np.inf, 2.0])
    with pytest.raises(RuntimeError, match="do not descend"):
        descent(table, dist, np.ones(256, dtype=bool), 2)


def test_a_device_hmm_is_read_through_one_shared_cpu_copy(monkeypatch):
    """The guide computes on the CPU: an HMM whose parameters are elsewhere (a GPU) is read
    through its host copy, built once per HMM (the guides share it, and its caches) and again
    after an in-place change; the copy gives the HMM's own ratios along a walk."""
    import ctrlg.guide.emission_operands as operands

    d = _lazy(PATTERNS[1])
    hmm = random_hmm(3, V, seed=6)
    assert operands.host_copy(hmm) is hmm                  # already in CPU memory
    direct = HorizonGuide(d, hmm, 8, horizon=2)
    monkeypatch.setattr(operands, "_in_host_memory", lambda tensors: False)
    first, second = HorizonGuide(d, hmm, 8, horizon=2), HorizonGuide(d, hmm, 8, horizon=2)
    assert isinstance(first.hmm, operands.HostHMM) and second.hmm is first.hmm
    assert first._completions is second._completions
    for name in ("initial", "transition", "emission"):
        assert torch.equal(getattr(first.hmm, name), getattr(hmm, name))
        assert getattr(first.hmm, name).data_ptr() != getattr(hmm, name).data_ptr()
    q, left, priors = d.initial, 8, [direct.initial_prior(), first.initial_prior()]
    for token in (0, 1, 2):                              # a, b, c
        ratios = [g.log_ratio(q, p, left) for g, p in zip((direct, first), priors)]
        assert torch.equal(ratios[0], ratios[1]) and ratios[1].device.type == "cpu"
        priors = [g.advance_prior(p, token) for g, p in zip((direct, first), priors)]
        q, left = d.step(q, token), left - 1
    with torch.no_grad():
        hmm.emission.mul_(1.0)                 # an in-place write: a new version of B
    assert HorizonGuide(d, hmm, 8, horizon=2).hmm is not first.hmm


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_first_horizon_looks_that_far_at_the_first_token_only(pattern):
    """first_horizon=F: the first token's ratios are a horizon-F guide's, every later token's
    the horizon-H guide's (same state, prior and tokens left); the masks are the same."""
    d = _lazy(pattern)
    hmm = random_hmm(3, V, seed=7)
    n = 6
    mixed = HorizonGuide(d, hmm, n, horizon=3, first_horizon=1)
    short, long_ = HorizonGuide(d, hmm, n, horizon=1), HorizonGuide(d, hmm, n, horizon=3)
    q, prior = d.initial, mixed.initial_prior()
    first = mixed.log_ratio(q, prior, n)
    assert torch.equal(first, short.log_ratio(q, prior, n))
    g = torch.Generator().manual_seed(1)
    left = n
    ratio = first
    while left > 1:
        v = int(torch.multinomial(torch.softmax(ratio, 0), 1, generator=g))
        if v == EOS:
            break
        q, prior, left = d.step(q, v), mixed.advance_prior(prior, v), left - 1
        ratio = mixed.log_ratio(q, prior, left)
        assert torch.equal(ratio, long_.log_ratio(q, prior, left))


def test_generate_passes_first_horizon_and_keeps_every_output_accepted(monkeypatch):
    from helpers import tiny_llama

    import ctrlg.sampler as sampler

    tok = tiny_bpe_tokenizer()
    _, lazy = _schema_constraints(tok)
    model = tiny_llama(lazy.vocab_size, seed=1)
    hmm = random_hmm(6, lazy.vocab_size, seed=6)
    seen = []
    real = sampler.HorizonGuide

    def spy(*args, **kwargs):
        guide = real(*args, **kwargs)
        seen.append((guide.horizon, guide.first_horizon))
        return guide

    monkeypatch.setattr(sampler, "HorizonGuide", spy)
    out = sampler.generate(model, tok, [0], lazy, hmm=hmm, max_new_tokens=14, num_samples=4,
                           seed=0, eos_token_id=tok.eos_token_id, horizon=3, first_horizon=1)
    assert seen == [(3, 1)]
    assert out and all(lazy.accepts(gen.token_ids) for gen in out)
