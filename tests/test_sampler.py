"""ConstraintLogitsProcessor / generate: exactness (χ² vs enumeration), the acceptance guarantee
(hypothesis × sampling × beam search), beam reordering, insertion, errors."""

import math
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from ctrlg import dfa
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError, VocabularyMismatchError
from ctrlg.lm.hmm_lm import HMMForCausalLM
from ctrlg.sampler import ConstraintLogitsProcessor, generate, lm_log_likelihood, rerank
from dfa_strategies import token_dfas
from helpers import random_hmm, trim_at_eos
from test_guide import generations, seq_prob

PROMPT = 0  # a one-token prompt; the HMM LM ignores it


def sample_with_hmm_lm(hmm, constraint, n, num, *, eos=None, m=0, suffix=None, seed=0, **kw):
    model = HMMForCausalLM.from_hmm(hmm, prompt_length=1, eos_token_id=eos)
    proc = ConstraintLogitsProcessor(hmm, constraint, prompt_length=1, max_new_tokens=n,
                                     min_new_tokens=m, eos_token_id=eos, suffix_ids=suffix)
    ids = torch.full((1, 1), PROMPT)
    torch.manual_seed(seed)
    out = model.generate(ids, do_sample=True, num_return_sequences=num, max_new_tokens=n,
                         min_new_tokens=m, logits_processor=[proc],
                         attention_mask=torch.ones_like(ids), **kw)
    results = []
    for row in out[:, 1:].tolist():
        results.append(tuple(trim_at_eos(row, eos)))
    return results


def chi_square_against(samples, target):
    """χ² p-value of the samples against the target distribution {outcome: prob}; outcomes with
    small expectation are pooled. Fails if a sample lies outside the target's support."""
    outside = [s for s in samples if s not in target]
    assert not outside, f"outputs outside the constraint: {outside[:5]}"
    counts = Counter(samples)
    N = len(samples)
    keys = sorted(target, key=lambda k: -target[k])
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for k in keys:
        e = N * target[k]
        if e >= 5:
            obs.append(counts[k])
            exp.append(e)
        else:
            pool_o += counts[k]
            pool_e += e
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    return chisquare(obs, exp).pvalue


V4 = 4
CONSTRAINTS = {  # (DFA, n, eos, min_new_tokens)
    "phrase": (lambda: dfa.phrase([1, 2], V4), 4, 3, 0),
    "any_phrase_and_length": (lambda: dfa.intersect(dfa.any_phrase([[1], [2, 0]], V4),
                                                    dfa.length(2, 3, vocab_size=V4)), 3, 3, 0),
    "complement": (lambda: dfa.complement(dfa.any_phrase([[1, 1], [0, 2]], V4)), 3, None, 0),
    "concat": (lambda: dfa.concat(dfa.phrase([2], V4), dfa.phrase([0], V4)), 3, 3, 1),
}


@pytest.mark.parametrize("name", list(CONSTRAINTS))
def test_hmm_as_lm_samples_exactly_from_the_hmm_conditional(name):
    make, n, eos, m = CONSTRAINTS[name]
    constraint = make()
    hmm = random_hmm(3, V4, seed=len(name))
    eos_set = set() if eos is None else {eos}
    target = {y: seq_prob(hmm, y) for y in generations(V4, n, m, eos_set) if constraint.accepts(list(y))}
    Z = sum(target.values())
    target = {y: p / Z for y, p in target.items()}
    samples = sample_with_hmm_lm(hmm, constraint, n, 4000, eos=eos, m=m, seed=1)
    assert chi_square_against(samples, target) > 1e-3


def test_insertion_samples_the_middle_given_the_suffix():
    """With suffix σ and the HMM as LM, middles y follow p_hmm(y σ)·[DFA accepts y] (normalised)."""
    n, suffix = 3, [2, 2]
    constraint = dfa.any_phrase([[0, 1], [3]], V4)
    hmm = random_hmm(3, V4, seed=5, concentration=0.5)
    target = {y: seq_prob(hmm, list(y) + suffix) for y in generations(V4, n, 0, set())
              if constraint.accepts(list(y))}
    Z = sum(target.values())
    target = {y: p / Z for y, p in target.items()}
    samples = sample_with_hmm_lm(hmm, constraint, n, 4000, suffix=suffix, seed=2)
    assert chi_square_against(samples, target) > 1e-3


def manual_generation(proc, n, V, num_rows, seed, eos):
    """Drive the processor like transformers' sampling loop with random LM logits."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(num_rows, 1, dtype=torch.long)
    done = torch.zeros(num_rows, dtype=torch.bool)
    for _ in range(n):
        logits = torch.randn(num_rows, V, generator=g) * 3
        scores = proc(ids, logits)
        probs = torch.softmax(scores, -1)
        nxt = torch.multinomial(probs, 1, generator=g)[:, 0]
        pad = eos if eos is not None else 0
        nxt = torch.where(done, pad, nxt)
        ids = torch.cat([ids, nxt[:, None]], 1)
        if eos is not None:
            done |= nxt == eos
            if done.all():
                break
    outs = []
    for row in ids[:, 1:].tolist():
        outs.append(trim_at_eos(row, eos))
    return outs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(constraint=token_dfas(vocab_size=4, max_states=5), n=st.integers(1, 4),
       eos=st.sampled_from([None, 3]), m=st.integers(0, 2), seed=st.integers(0, 10_000),
       mode=st.sampled_from(["ctrlg", "logical"]))
def test_every_sampled_output_is_accepted(constraint, n, eos, m, seed, mode):
    m = min(m, n)
    hmm = random_hmm(2, 4, seed, concentration=0.3)
    satisfiable = any(constraint.accepts(list(y)) for y in generations(4, n, m, {eos} - {None}))
    if not satisfiable:
        with pytest.raises(UnsatisfiableConstraintError):
            ConstraintLogitsProcessor(hmm, constraint, prompt_length=1, max_new_tokens=n,
                                      min_new_tokens=m, eos_token_id=eos, mode=mode)
        return
    proc = ConstraintLogitsProcessor(hmm, constraint, prompt_length=1, max_new_tokens=n,
                                     min_new_tokens=m, eos_token_id=eos, mode=mode)
    for y in manual_generation(proc, n, 4, 6, seed, eos):
        assert constraint.accepts(y), y
        assert len(y) == n or (eos is not None and y[-1] == eos and len(y) - 1 >= m)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(constraint=token_dfas(vocab_size=5, max_states=4), n=st.integers(1, 4),
       seed=st.integers(0, 10_000), beams=st.sampled_from([1, 2, 3]))
def test_generate_with_random_lm_sampling_and_beams_always_accepts(constraint, n, seed, beams):
    """transformers generate (sampling, and beam search) with another HMM as a random LM."""
    eos = 4
    hmm = random_hmm(3, 5, seed)
    lm = HMMForCausalLM.from_hmm(random_hmm(2, 5, seed + 1, concentration=0.2), prompt_length=1,
                                 eos_token_id=eos)
    if not any(constraint.accepts(list(y)) for y in generations(5, n, 0, {eos})):
        with pytest.raises(UnsatisfiableConstraintError):
            generate(lm, None, [1], constraint, hmm=hmm, max_new_tokens=n, seed=seed)
        return
    out = generate(lm, None, [1], constraint, hmm=hmm, max_new_tokens=n, num_samples=beams,
                   num_beams=beams, seed=seed, rank_by_lm=False)
    assert out, "generate returned no accepted output"
    # generate filters; check the raw transformers output too
    proc = ConstraintLogitsProcessor(hmm, [constraint, constraint], prompt_length=1,
                                     max_new_tokens=n, eos_token_id=eos)
    ids = torch.tensor([[1], [2]])
    kw = dict(num_beams=beams, num_return_sequences=beams, do_sample=False) if beams > 1 else \
        dict(do_sample=True, top_k=3, top_p=0.9, temperature=0.7)
    raw = lm.generate(ids, max_new_tokens=n, logits_processor=[proc], return_dict_in_generate=True,
                      output_scores=True, attention_mask=torch.ones_like(ids), **kw)
    # beam search must keep num_beams beams even when fewer continuations are feasible: those
    # beams are not outputs of the guided distribution. transformers scores them −inf, or −1e9
    # (its stand-in for "no hypothesis") when it initialised the beam, so both count as dead.
    finite = (raw.sequences_scores > -1e8) if beams > 1 else torch.ones(len(raw.sequences), dtype=bool)
    assert finite.reshape(2, -1).any(1).all()
    for row, ok in zip(raw.sequences[:, 1:].tolist(), finite.tolist()):
        if not ok:
            continue
        y = trim_at_eos(row, eos)
        assert constraint.accepts(y), (row, y)


def test_tiny_llama_sampling_and_beam_search_respect_the_constraint():
    from transformers import LlamaConfig, LlamaForCausalLM

    V = 12
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V + 4, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         eos_token_id=11, pad_token_id=11, bos_token_id=0)
    lm = LlamaForCausalLM(config).eval()   # the LM pads its vocabulary: 16 logits for 12 tokens
    hmm = random_hmm(4, V, 3)
    constraint = dfa.intersect(dfa.any_phrase([[3, 4], [5, 6, 7]], V), dfa.phrase([2], V))
    for kw in (dict(num_samples=6), dict(num_samples=3, num_beams=3),
               dict(num_samples=4, top_k=4, top_p=0.8, temperature=0.5)):
        out = generate(lm, None, [0, 1], constraint, hmm=hmm, max_new_tokens=6, seed=0, **kw)
        assert out and all(constraint.accepts(g.token_ids) for g in out)
        assert all(t < V for g in out for t in g.token_ids)
        scores = [g.lm_log_likelihood for g in out]
        assert scores == sorted(scores, reverse=True)


def test_one_dfa_per_input_row_with_several_samples_each():
    V, n, eos = 5, 4, 4
    hmm = random_hmm(3, V, 9)
    lm = HMMForCausalLM.from_hmm(random_hmm(2, V, 10), prompt_length=1, eos_token_id=eos)
    dfas = [dfa.phrase([1, 1], V), dfa.phrase([2, 3], V), dfa.complement(dfa.phrase([0], V))]
    proc = ConstraintLogitsProcessor(hmm, dfas, prompt_length=1, max_new_tokens=n, eos_token_id=eos)
    ids = torch.tensor([[1], [2], [3]])
    torch.manual_seed(0)
    out = lm.generate(ids, do_sample=True, num_return_sequences=4, max_new_tokens=n,
                      logits_processor=[proc], attention_mask=torch.ones_like(ids))
    for i, row in enumerate(out[:, 1:].tolist()):
        y = trim_at_eos(row, eos)
        assert dfas[i // 4].accepts(y), (i, y)


def test_processor_state_follows_reordered_and_duplicated_beams():
    V, n = 5, 4
    hmm = random_hmm(3, V, 0)
    constraint = dfa.phrase([1, 2, 3], V)
    proc = ConstraintLogitsProcessor(hmm, constraint, prompt_length=1, max_new_tokens=n)
    scores = torch.log_softmax(torch.randn(3, V, generator=torch.Generator().manual_seed(0)), -1)
    proc(torch.tensor([[0], [0], [0]]), scores)
    proc(torch.tensor([[0, 1], [0, 4], [0, 0]]), scores)
    reordered = torch.tensor([[0, 4, 1], [0, 1, 2], [0, 1, 2]])   # rows permuted and duplicated
    got = proc(reordered, scores)
    fresh = ConstraintLogitsProcessor(hmm, constraint, prompt_length=1, max_new_tokens=n)
    for i in range(3):  # a fresh processor replays each prefix from scratch
        fresh.reset()
        expect = fresh(reordered[i:i + 1], scores[i:i + 1])
        assert torch.allclose(got[i], expect[0], atol=1e-5)
    assert torch.equal(got[1], got[2])


def test_logical_mode_masks_and_renormalises_only():
    V = 4
    constraint = dfa.phrase([2, 2], V)
    proc = ConstraintLogitsProcessor(None, constraint, prompt_length=1, max_new_tokens=2, mode="logical")
    scores = torch.log_softmax(torch.tensor([[0.5, 1.0, -1.0, 2.0]]), -1)
    out = proc(torch.tensor([[0]]), scores)
    assert torch.isinf(out[0, [0, 1, 3]]).all() and out[0, 2] == 0.0


def test_padded_lm_vocabulary_columns_get_minus_inf_and_narrow_scores_raise():
    hmm = random_hmm(2, 4, 0)
    proc = ConstraintLogitsProcessor(hmm, dfa.phrase([1], 4), prompt_length=1, max_new_tokens=2)
    out = proc(torch.tensor([[0]]), torch.zeros(1, 7))
    assert torch.isinf(out[0, 4:]).all() and torch.isfinite(out[0, :4]).any()
    with pytest.raises(VocabularyMismatchError, match="3 columns"):
        proc(torch.tensor([[0]]), torch.zeros(1, 3))


def test_lm_that_forbids_every_feasible_token_falls_back_to_the_guide():
    hmm = random_hmm(2, 4, 0)
    proc = ConstraintLogitsProcessor(hmm, dfa.phrase([1], 4), prompt_length=1, max_new_tokens=1)
    scores = torch.tensor([[0.0, -math.inf, 0.0, 0.0]])   # the only feasible token is 1
    out = proc(torch.tensor([[0]]), scores)
    assert out[0, 1] == 0.0 and torch.isinf(out[0, [0, 2, 3]]).all()


def test_bad_inputs_raise_clear_errors():
    hmm = random_hmm(2, 4, 0)
    lm_small = HMMForCausalLM.from_hmm(random_hmm(2, 3, 1), prompt_length=1)
    with pytest.raises(VocabularyMismatchError, match="HMM has vocabulary size 4"):
        generate(lm_small, None, [0], dfa.phrase([1], 4), hmm=hmm, max_new_tokens=2)
    with pytest.raises(VocabularyMismatchError, match="DFA has vocabulary size 4"):
        generate(lm_small, None, [0], dfa.phrase([1], 4), mode="logical", max_new_tokens=2)
    with pytest.raises(VocabularyMismatchError, match=r"dfa\[0\] has vocabulary size 5"):
        ConstraintLogitsProcessor(hmm, dfa.phrase([1], 5), max_new_tokens=2)
    proc = ConstraintLogitsProcessor(hmm, [dfa.phrase([1], 4), dfa.phrase([2], 4)], prompt_length=1,
                                     max_new_tokens=2)
    with pytest.raises(ConstraintError, match="not a multiple of the number of DFAs"):
        proc(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, 4))
    with pytest.raises(ConstraintError, match="rows 0 and 1 share"):
        proc(torch.tensor([[0], [1], [2], [3]]), torch.zeros(4, 4))   # 4 inputs, 2 DFAs
    with pytest.raises(UnsatisfiableConstraintError, match="max_new_tokens=3"):
        ConstraintLogitsProcessor(hmm, dfa.phrase([1, 2, 3, 1], 4), max_new_tokens=3)
    with pytest.raises(ConstraintError, match="needs an HMM"):
        ConstraintLogitsProcessor(None, dfa.phrase([1], 4), max_new_tokens=2)
    with pytest.raises(ConstraintError, match="mode must be"):
        ConstraintLogitsProcessor(hmm, dfa.phrase([1], 4), max_new_tokens=2, mode="fast")


def test_an_hmm_padded_with_another_eos_is_refused_by_name():
    hmm = random_hmm(3, 5, 0)
    hmm.config.update(eos_pad_state=2, eos_token_id=1)      # distilled from samples padded with 1
    constraint = dfa.phrase([3], 5)
    with pytest.raises(VocabularyMismatchError, match=r"emits token 1 .* EOS ids \[4\]"):
        ConstraintLogitsProcessor(hmm, constraint, max_new_tokens=3, eos_token_id=4)
    ConstraintLogitsProcessor(hmm, constraint, max_new_tokens=3, eos_token_id=[4, 1])
    ConstraintLogitsProcessor(None, constraint, max_new_tokens=3, eos_token_id=4, mode="logical")
    hmm.config.pop("eos_pad_state")                         # no padding state: nothing to check
    ConstraintLogitsProcessor(hmm, constraint, max_new_tokens=3, eos_token_id=4)


def test_rerank_orders_by_lm_likelihood():
    hmm = random_hmm(3, 4, 2)
    lm = HMMForCausalLM.from_hmm(hmm, prompt_length=1)
    candidates = [[1, 2], [0, 0, 3], [2]]
    scores = lm_log_likelihood(lm, [PROMPT], candidates)
    for c, s in zip(candidates, scores):
        assert math.isclose(s, math.log(seq_prob(hmm, c)), rel_tol=1e-4)
    ranked = rerank(lm, [PROMPT], candidates)
    assert [c for _, c in ranked] == [candidates[i] for i in np.argsort(scores)[::-1]]
    with_suffix = rerank(lm, [PROMPT], candidates, suffix_ids=[3])
    assert math.isclose(with_suffix[0][0], max(math.log(seq_prob(hmm, c + [3])) for c in candidates),
                        rel_tol=1e-4)


def test_generate_leaves_the_global_rng_alone_and_is_reproducible():
    V, eos = 5, 4
    hmm = random_hmm(3, V, 7)
    lm = HMMForCausalLM.from_hmm(random_hmm(2, V, 8), prompt_length=1, eos_token_id=eos)
    constraint = dfa.intersect(dfa.phrase([1], vocab_size=V), dfa.eos(eos, V))
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = generate(lm, None, [0], constraint, hmm=hmm, max_new_tokens=4, num_samples=6, seed=5,
                     rank_by_lm=False)
    assert torch.equal(torch.get_rng_state(), before)
    second = generate(lm, None, [0], constraint, hmm=hmm, max_new_tokens=4, num_samples=6, seed=5,
                      rank_by_lm=False)
    assert [g.token_ids for g in first] == [g.token_ids for g in second] and first


class _RecordingTokenizer:
    """A tokenizer stub: ``<s>`` is its special BOS, added unless ``add_special_tokens=False``."""

    all_special_tokens = ["<s>"]
    eos_token_id = 4

    def __init__(self):
        self.calls = []

    def __call__(self, text, add_special_tokens=True):
        self.calls.append(add_special_tokens)
        body = [0 if text.startswith("<s>") else 1] + [2] * (len(text) % 3)
        return type("Encoding", (), {"input_ids": ([0] if add_special_tokens else []) + body})()

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def test_a_templated_string_prompt_gets_no_second_set_of_special_tokens():
    V, eos = 5, 4
    lm = HMMForCausalLM.from_hmm(random_hmm(2, V, 3), prompt_length=1, eos_token_id=eos)
    tokenizer = _RecordingTokenizer()
    constraint = dfa.eos(eos, V)
    generate(lm, tokenizer, "<s>user: hi", constraint, mode="logical", max_new_tokens=2,
             num_samples=1, rank_by_lm=False)
    generate(lm, tokenizer, "plain text", constraint, mode="logical", max_new_tokens=2,
             num_samples=1, rank_by_lm=False)
    assert tokenizer.calls == [False, True]


def test_old_keyword_names_still_work_with_a_deprecation_warning():
    from ctrlg.guide import build_tables

    V, eos = 5, 4
    hmm = random_hmm(2, V, 1)
    constraint = dfa.eos(eos, V)
    with pytest.warns(DeprecationWarning, match="dfa="):
        proc = ConstraintLogitsProcessor(hmm, dfa=constraint, max_new_tokens=3, eos_token_id=eos)
    assert proc.dfas == [constraint]
    with pytest.warns(DeprecationWarning, match="min_tokens="):
        tables = build_tables(hmm, constraint, 3, min_tokens=1, eos_token_id=eos)
    assert tables.min_new_tokens == tables.min_tokens == 1
    lm = HMMForCausalLM.from_hmm(random_hmm(2, V, 2), prompt_length=1, eos_token_id=eos)
    with pytest.warns(DeprecationWarning, match="rerank="):
        out = generate(lm, None, [0], constraint, hmm=hmm, max_new_tokens=3, num_samples=2,
                       rerank=False)
    assert all(math.isnan(g.lm_log_likelihood) for g in out)
