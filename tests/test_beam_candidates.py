"""Beam search scoring only the entries it can keep (``keep_top``), against the full lookahead.

* :mod:`ctrlg.guide.entry_weights`: p_hmm(α | x≤t, v) at listed entries and p_hmm(α | x≤t) per
  row equal the full product's (and P_hmm(α) by enumeration); the successor bounds bound every
  token's value.
* :mod:`ctrlg.guide.beam_candidates`: every entry among a row's (or, with running scores, an
  input's) K best has the full computation's value, every other entry is −inf or that value.
* :mod:`ctrlg.lm.beam_scores`: the recorded running scores are the beams' summed log-probs.
* The processor: beam search with ``keep_top`` gives the same beams and scores as without it,
  step by step, on a tiny random Llama (plain and fast search, one and two EOS ids).
"""

import math

import numpy as np
import pytest
import torch

from ctrlg import dfa
from ctrlg.errors import ConstraintError
from ctrlg.guide import beam_candidates
from ctrlg.guide.beam_candidates import top_lookahead_scores
from ctrlg.guide.entry_weights import BOUND_LETTER
from ctrlg.guide.guidance import guidance_log_ratio, lookahead_scores
from ctrlg.guide.tables import build_tables
from ctrlg.lm.beam_scores import (EntrySupport, latest_beam_scores, publish_support, record_beam_scores,
                                  take_support)
from ctrlg.lm.beam_search import InPlaceBans, two_stage_topk
from ctrlg.sampler import ConstraintLogitsProcessor
from helpers import random_dfa, random_hmm, random_letter_dfa, tiny_llama
from test_guide import generations, seq_prob

N = 5


def _cases():
    """(name, tables): small tables over token DFAs (every exception a small letter) and over
    letter DFAs with letters of ≥ BOUND_LETTER tokens, with EOS, a minimum length, a suffix."""
    big = random_letter_dfa(4, 300, seed=2)
    assert np.diff(big.letter_members[0]).min() >= BOUND_LETTER
    return [
        ("tokens", build_tables(random_hmm(4, 7, seed=1), random_dfa(5, 7, seed=1), N,
                                eos_token_id=6, min_new_tokens=1, precision="float32")),
        ("tokens-no-band", build_tables(random_hmm(3, 7, seed=5), random_dfa(4, 7, seed=5), N,
                                        eos_token_id=[5, 6], precision="float32",
                                        reachable_only=False)),
        ("letters", build_tables(random_hmm(5, 300, seed=2, concentration=0.3), big, N,
                                 eos_token_id=299, min_new_tokens=2, precision="float32")),
        ("suffix", build_tables(random_hmm(3, 9, seed=3), random_letter_dfa(4, 9, seed=3), N,
                                eos_token_id=8, suffix_ids=[2, 5], precision="float32")),
    ]


CASES = _cases()


def _rows(table, remaining: int, count: int, seed: int):
    """Up to ``count`` rows reached by random feasible non-EOS walks of n − ``remaining`` tokens:
    (states, priors [R, h])."""
    rng = np.random.default_rng(seed)
    states, priors = [], []
    eos = set(table.eos_ids)
    for _ in range(count):
        s, p = table.dfa.initial, table.initial_prior()
        for r in range(table.max_new_tokens, remaining, -1):
            ok = [v for v in np.flatnonzero(table.token_feasible([s], r)[0].numpy()) if v not in eos]
            ok = [v for v in ok if table.feasible[r - 1, table.dfa.step(s, v)]]
            if not ok:
                break
            v = int(rng.choice(ok))
            s, p = table.dfa.step(s, v), table.advance(p, [v])
        else:
            states.append(s)
            priors.append(p)
    return np.asarray(states, dtype=np.int64), torch.cat(priors) if priors else None


def _full(table, states, priors, remaining):
    """The full product's (log p_hmm(α | x≤t, v) [R, V], log p_hmm(α | x≤t) [R])."""
    accept = []
    ratio = guidance_log_ratio([table], np.zeros(len(states), np.int64), states, priors, remaining,
                               log_accept=accept)
    return ratio, accept[0]


# ---------------------------------------------------------------------- entry weights
@pytest.mark.parametrize("name,table", CASES, ids=[c[0] for c in CASES])
def test_entry_weights_equal_the_full_product(name, table):
    checked = 0
    for remaining in range(N, 0, -1):
        states, priors = _rows(table, remaining, 6, seed=remaining)
        if not len(states):
            continue
        ratio, accept = _full(table, states, priors, remaining)
        R, V = ratio.shape
        rows, tokens = np.repeat(np.arange(R), V), np.tile(np.arange(V), R)
        got, lost = table.entry_log_ratios(rows, tokens, states, priors, remaining)
        assert not lost.any()
        want = ratio.reshape(-1).double()
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        finite = torch.isfinite(want)
        torch.testing.assert_close(got[finite], want[finite], atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(table.log_accept_rows(states, priors, remaining),
                                   accept.double(), atol=2e-5, rtol=2e-5)
        checked += int(finite.sum())
    assert checked > 50


@pytest.mark.parametrize("name,table", CASES, ids=[c[0] for c in CASES])
def test_successor_bounds_bound_every_non_eos_token(name, table):
    for remaining in range(N, 0, -1):
        states, priors = _rows(table, remaining, 6, seed=10 + remaining)
        if not len(states):
            continue
        ratio, _ = _full(table, states, priors, remaining)
        common, (rows, tokens, bounds) = table.successor_bounds(states, remaining)
        bound = np.repeat(common[:, None], table.vocab_size, axis=1)
        bound[rows, tokens] = bounds
        bound[:, table.eos_ids] = math.inf
        assert (ratio.double().numpy() <= bound + 1e-5).all()
        if name == "letters":
            assert len(rows) == 0        # every exceptional letter is a big one


def test_log_accept_at_the_start_is_p_alpha_by_enumeration():
    hmm, constraint = random_hmm(3, 5, seed=7), random_dfa(4, 5, seed=7)
    table = build_tables(hmm, constraint, 4, eos_token_id=4, min_new_tokens=1, precision="float32")
    want = sum(seq_prob(hmm, y) for y in generations(5, 4, 1, {4}) if constraint.accepts(list(y)))
    got = table.log_accept_rows([constraint.initial], table.initial_prior(), 4)
    assert float(got[0]) == pytest.approx(math.log(want), abs=1e-5)


def test_entry_weights_need_an_hmm():
    logical = build_tables(None, random_dfa(3, 5, seed=0), 3)
    with pytest.raises(ConstraintError, match="HMM"):
        logical.log_accept_rows([0], None, 3)


# ---------------------------------------------------------------------- candidates
def _check_kept(out, full, keep, running=None, groups=None):
    """Finite entries of ``out`` equal ``full``'s; the ``keep`` best of each row (or of each
    group's running + score) are the same entries with the same values."""
    finite = torch.isfinite(out)
    assert torch.equal(finite, finite & torch.isfinite(full))
    torch.testing.assert_close(out[finite], full[finite], atol=1e-4, rtol=1e-5)
    if running is None:
        pick_out, pick_full = torch.topk(out, keep), torch.topk(full, keep)
    else:
        width = out.shape[0] // (int(groups.max()) + 1)
        total = lambda s: (s + running[:, None]).reshape(-1, width * s.shape[1])  # noqa: E731
        pick_out, pick_full = torch.topk(total(out), keep), torch.topk(total(full), keep)
    live = torch.isfinite(pick_full.values)
    torch.testing.assert_close(pick_out.values[live], pick_full.values[live], atol=1e-4, rtol=1e-5)
    assert torch.equal(pick_out.indices[live], pick_full.indices[live])


def _lm_scores(R, V, seed, sharp=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(sharp * torch.randn(R, V, generator=g), -1)


@pytest.mark.parametrize("name,table", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("strength", [1.0, 0.5, 2.0])
def test_kept_entries_equal_the_full_lookahead(name, table, strength):
    fell_back, rows_seen = [], 0
    for remaining in range(N, 0, -1):
        states, priors = _rows(table, remaining, 8, seed=20 + remaining)
        if len(states) < 2:
            continue
        R, V = len(states), table.vocab_size
        lm = _lm_scores(R, V, seed=remaining)
        first = remaining == N
        tor = np.zeros(R, np.int64)
        full = lookahead_scores(lm, [table], tor, states, priors, remaining, strength, first=first)

        def full_rows(rows):
            fell_back.extend(rows.tolist())
            return lookahead_scores(lm[rows], [table], tor[rows], states[rows], priors[rows],
                                    remaining, strength, first=first)

        for keep in (1, 3, 8):
            out = top_lookahead_scores(lm, [table], tor, states, priors, remaining, strength, first,
                                       keep, full=full_rows)
            _check_kept(out, full, min(keep, V))
            rows_seen += R
            # written into the scores themselves (the processor's way): the same result, the
            # fallback rows read before the fill
            scratch = lm.clone()
            same = top_lookahead_scores(
                scratch, [table], tor, states, priors, remaining, strength, first, keep,
                full=lambda rows: lookahead_scores(scratch[rows], [table], tor[rows], states[rows],
                                                   priors[rows], remaining, strength, first=first),
                out=scratch)
            assert same.data_ptr() == scratch.data_ptr() and torch.equal(same, out)
        beams = R // 2
        running = -5 * torch.rand(2 * beams, generator=torch.Generator().manual_seed(remaining))
        running[1] = -1e9                                   # transformers' placeholder beams
        groups = np.arange(2 * beams) // beams
        sub = slice(0, 2 * beams)
        out = top_lookahead_scores(lm[sub], [table], tor[sub], states[sub], priors[sub], remaining,
                                   strength, first, 2 * beams, running, groups,
                                   full=lambda rows: full[sub][torch.as_tensor(rows)])
        _check_kept(out, full[sub], 2 * beams, running, groups)
    assert rows_seen > 0
    if name == "letters":                                   # V = 300: most rows settle
        assert len(fell_back) < rows_seen / 2


def test_crowded_and_lost_rows_fall_back_to_the_full_scores(monkeypatch):
    name, table = CASES[2]
    states, priors = _rows(table, N - 1, 6, seed=3)
    R, V = len(states), table.vocab_size
    lm = _lm_scores(R, V, seed=1, sharp=0.1)                 # flat LM: many candidates per row
    tor = np.zeros(R, np.int64)
    full = lookahead_scores(lm, [table], tor, states, priors, N - 1)
    called = []

    def full_rows(rows):
        called.append(rows.tolist())
        return full[torch.as_tensor(rows)]

    monkeypatch.setattr(beam_candidates, "MAX_ENTRIES", 5)
    out = top_lookahead_scores(lm, [table], tor, states, priors, N - 1, 1.0, False, 4, full=full_rows)
    _check_kept(out, full, 4)
    assert called and len(called[-1]) > 0
    def full_of(scores):                                     # the fallback rows from ``scores``
        return lambda rows: lookahead_scores(scores[rows], [table], tor[rows], states[rows],
                                             priors[rows], N - 1)

    expected = top_lookahead_scores(lm, [table], tor, states, priors, N - 1, 1.0, False, 4,
                                    full=full_of(lm))
    scratch = lm.clone()                                     # fallback rows read before the fill
    same = top_lookahead_scores(scratch, [table], tor, states, priors, N - 1, 1.0, False, 4,
                                full=full_of(scratch), out=scratch)
    assert torch.equal(same, expected)
    monkeypatch.undo()

    original = type(table).entry_log_ratios

    def lose_row_zero(self, rows, tokens, *args):
        value, lost = original(self, rows, tokens, *args)
        return value, lost | (np.asarray(rows) == 0)

    monkeypatch.setattr(type(table), "entry_log_ratios", lose_row_zero)
    called.clear()
    out = top_lookahead_scores(lm, [table], tor, states, priors, N - 1, 1.0, False, 4, full=full_rows)
    assert called == [[0]]
    assert torch.equal(out[0], full[0])
    _check_kept(out, full, 4)
    with pytest.raises(ValueError, match="full"):
        top_lookahead_scores(lm, [table], tor, states, priors, N - 1, 1.0, False, 4)


# ---------------------------------------------------------------------- running scores
def test_recorded_running_scores_are_the_beams_summed_log_probs():
    V, beams = 20, 3
    model = tiny_llama(V, seed=1)
    ids = torch.tensor([[0, 5], [0, 7]])
    seen = []

    class Probe:
        def __call__(self, input_ids, scores):
            record = latest_beam_scores()
            if input_ids.shape[1] > 2:
                assert record is not None and record.describes(input_ids)
                assert record.steps == input_ids.shape[1] - 2
                assert (record.beams, record.keep) == (beams, 2 * beams)
                seen.append((input_ids.clone(), record.running.clone()))
            return scores

    with torch.no_grad(), record_beam_scores(model) as active:
        assert active is not None
        model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=beams, do_sample=False,
                       max_new_tokens=5, pad_token_id=1, eos_token_id=1, logits_processor=[Probe()])
    assert latest_beam_scores() is None
    assert "_get_running_beams_for_next_iteration" not in model.__dict__
    assert len(seen) >= 3
    with torch.no_grad():
        for input_ids, running in seen:
            log_probs = torch.log_softmax(model(input_ids=input_ids).logits.double(), -1)
            summed = log_probs[:, 1:-1].gather(2, input_ids[:, 2:, None])[..., 0].sum(1)
            torch.testing.assert_close(running.double(), summed, atol=1e-4, rtol=1e-5)
    stale = seen[-1][0].clone()
    stale[0, -1] = (stale[0, -1] + 1) % V
    with record_beam_scores(model) as record:
        record.sequences = seen[-1][0]
        assert record.describes(seen[-1][0]) and not record.describes(stale)


def test_a_published_support_is_read_once_and_only_at_its_own_step():
    keys = np.array([1, 5, 9])
    with record_beam_scores(tiny_llama(8, seed=0)):
        publish_support(EntrySupport(3, 2, 8, keys))
        assert take_support(4, 2, 8) is None             # another step: stale, and consumed
        assert take_support(3, 2, 8) is None
        publish_support(EntrySupport(3, 2, 8, keys))
        assert take_support(3, 2, 9) is None             # another width
        publish_support(EntrySupport(3, 2, 8, keys))
        assert np.array_equal(take_support(3, 2, 8), keys)
        assert take_support(3, 2, 8) is None
        publish_support(None)
        assert take_support(3, 2, 8) is None
    publish_support(EntrySupport(3, 2, 8, keys))         # outside a block: nothing kept
    assert take_support(3, 2, 8) is None


def test_recording_leaves_a_model_without_the_method_alone():
    with record_beam_scores(object()) as record:
        assert record is None and latest_beam_scores() is None


# ---------------------------------------------------------------------- the processor
class _Compare:
    """Runs the ``keep_top`` processor and a full one on the same inputs; checks that the entries
    the search can keep (its K best running + score per input) have the same values."""

    def __init__(self, kept, full, beams, keep):
        self.kept, self.full, self.beams, self.keep = kept, full, beams, keep
        self.steps = 0

    def __call__(self, input_ids, scores):
        out = self.kept(input_ids, scores.clone())
        want = self.full(input_ids, scores.clone())
        record = latest_beam_scores()
        R = input_ids.shape[0]
        if record is not None and record.describes(input_ids):
            running = record.running
        else:                                    # the first step: beam 0 of each input at 0
            running = torch.full((R,), -1e9)
            running[::self.beams] = 0.0
        _check_kept(out, want, self.keep, running, np.arange(R) // self.beams)
        self.steps += 1
        return out


def _search(model, processors, beams, eos, fast, max_new=7):
    ids = torch.tensor([[0, 5], [0, 7]])
    kwargs = dict(num_beams=beams, num_return_sequences=beams, max_new_tokens=max_new,
                  do_sample=False, pad_token_id=1, eos_token_id=eos,
                  attention_mask=torch.ones_like(ids), length_penalty=0.2,
                  output_scores=True, return_dict_in_generate=True)
    with torch.no_grad(), record_beam_scores(model):
        if fast:
            bans = InPlaceBans(2, 2, ids.shape[1], eos)
            with two_stage_topk(model):
                return model.generate(ids, logits_processor=[bans, *processors], **kwargs)
        return model.generate(ids, logits_processor=list(processors), no_repeat_ngram_size=2,
                              min_new_tokens=2, **kwargs)


@pytest.mark.parametrize("seed,beams,eos,fast,strength", [
    (0, 4, [1], False, 1.0), (1, 4, [1], True, 1.0), (2, 6, [1, 2], True, 0.5),
    (3, 2, [1], True, 2.0), (4, 8, [1, 2], False, 1.0)])
def test_beam_search_with_keep_top_gives_the_same_beams(seed, beams, eos, fast, strength,
                                                       monkeypatch):
    """With ``fast`` the search's top-k also reads the kept entries alone (the support the
    processor publishes): counted, and the beams are again the plain search's."""
    import ctrlg.lm.beam_search as beam_search_module

    sparse_picks = []
    sparse = beam_search_module.sparse_topk_values

    def counting(*args):
        out = sparse(*args)
        sparse_picks.append(out is not None)
        return out

    monkeypatch.setattr(beam_search_module, "sparse_topk_values", counting)
    V = 48
    model = tiny_llama(V, seed=seed)
    hmm = random_hmm(6, V, seed=seed, concentration=0.3)
    constraints = [dfa.any_phrase([[3, 4], [6]], V), dfa.any_phrase([[9, 10, 11], [20]], V)]
    keep = max(2, 1 + len(eos)) * beams

    def processor(keep_top):
        return ConstraintLogitsProcessor(hmm, constraints, prompt_length=2, max_new_tokens=7,
                                         min_new_tokens=2, eos_token_id=eos, precision="float32",
                                         beam_score="lookahead", strength=strength,
                                         keep_top=keep_top)

    plain = _search(model, [processor(None)], beams, eos, fast)
    compare = _Compare(processor(keep), processor(None), beams, keep)
    kept = _search(model, [compare], beams, eos, fast)
    assert compare.steps >= 3
    assert torch.equal(plain.sequences, kept.sequences)
    torch.testing.assert_close(plain.sequences_scores, kept.sequences_scores, atol=1e-4, rtol=1e-5)
    sparse_picks.clear()
    only = _search(model, [processor(4 * beams)], beams, eos, fast)     # without the comparison
    assert torch.equal(plain.sequences, only.sequences)
    torch.testing.assert_close(plain.sequences_scores, only.sequences_scores, atol=1e-4, rtol=1e-5)
    assert sum(sparse_picks) >= (2 if fast else 0) and (fast or not sparse_picks)


def test_keep_top_below_the_search_width_and_without_lookahead_are_refused():
    V = 24
    model, hmm = tiny_llama(V, seed=0), random_hmm(4, V, seed=0)
    constraint = dfa.any_phrase([[3, 4]], V)
    kw = dict(prompt_length=2, max_new_tokens=5, eos_token_id=1, precision="float32")
    proc = ConstraintLogitsProcessor(hmm, [constraint, constraint], beam_score="lookahead",
                                     keep_top=3, **kw)
    with pytest.raises(ConstraintError, match="keep_top=3.*keeps 8"):
        _search(model, [proc], 4, [1], fast=False, max_new=5)
    with pytest.raises(ConstraintError, match="keep_top needs beam_score='lookahead'"):
        ConstraintLogitsProcessor(hmm, constraint, keep_top=8, **kw)
    with pytest.raises(ConstraintError, match="keep_top"):
        ConstraintLogitsProcessor(hmm, constraint, beam_score="lookahead", keep_top=0, **kw)


def test_rows_take_their_parents_exact_entry_instead_of_recomputing_it(monkeypatch):
    """From the second step on, the kept path reads a row's log p_hmm(α | x≤t) off its parent's
    exact entry (``known_prev``) instead of recomputing it (the beams and scores equal the full
    processor's: the comparison of every step above runs with it): few rows are recomputed."""
    import ctrlg.sampler as sampler_module
    from ctrlg.guide.entry_weights import EntryWeights

    V, beams, eos = 48, 4, [1]
    model = tiny_llama(V, seed=5)
    hmm = random_hmm(6, V, seed=5, concentration=0.3)
    constraints = [dfa.any_phrase([[3, 4], [6]], V), dfa.any_phrase([[9, 10, 11], [20]], V)]
    recomputed, later_rows = [], []
    accept_rows, top_scores = EntryWeights.log_accept_rows, sampler_module.top_lookahead_scores

    def counting_accept(self, states, priors, remaining):
        recomputed.append(len(states))
        return accept_rows(self, states, priors, remaining)

    def counting_top(scores, *args, **kwargs):
        if not args[6]:                                  # ``first``
            later_rows.append(scores.shape[0])
        return top_scores(scores, *args, **kwargs)

    monkeypatch.setattr(EntryWeights, "log_accept_rows", counting_accept)
    monkeypatch.setattr(sampler_module, "top_lookahead_scores", counting_top)
    proc = ConstraintLogitsProcessor(hmm, constraints, prompt_length=2, max_new_tokens=7,
                                     min_new_tokens=2, eos_token_id=eos, precision="float32",
                                     beam_score="lookahead", keep_top=2 * beams)
    _search(model, [proc], beams, eos, True)
    assert len(later_rows) >= 3
    assert sum(recomputed) < sum(later_rows) / 2     # the second step's rows, and few others
