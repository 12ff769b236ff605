"""The processor's guidance strength w and per-step prior sources (LM-conditioned heads), checked
by enumeration on tiny DFAs and HMMs and on a tiny random Llama."""

import itertools
import math

import pytest
import torch

from ctrlg.sampler import ConstraintLogitsProcessor
from test_guide import CASES, brute_weights, random_dfa, random_hmm, seq_prob


def brute_ratio(hmm, weights, prefix, v):
    """p_hmm(α | x, v) by enumeration: accepted mass of generations extending x·v over p(x·v)
    (``weights``: :func:`test_guide.brute_weights`)."""
    head = tuple(prefix) + (v,)
    mass = sum(w for y, w in weights.items() if y[:len(head)] == head)
    return mass / seq_prob(hmm, head)


@pytest.mark.parametrize("case", [c for c in CASES if c[6] is None][:4])
@pytest.mark.parametrize("strength", [0.0, 0.5, 1.0, 2.0])
def test_guidance_strength_is_exact_and_keeps_feasibility(case, strength):
    """For every prefix: p_w(v) ∝ p_lm(v) · p_hmm(α | x, v)^w on exactly the feasible tokens
    (enumeration), −inf elsewhere; w = 0 is logical masking, w = 1 Ctrl-G."""
    S, V, h, n, m, eos, _, seed = case
    hmm, dfa = random_hmm(h, V, seed), random_dfa(S, V, seed)
    weights = brute_weights(hmm, dfa, n, m, eos, None)
    guided = ConstraintLogitsProcessor(hmm, dfa, prompt_length=1, max_new_tokens=n,
                                       min_new_tokens=m, eos_token_id=eos or None,
                                       strength=strength, precision="float32")
    lm = torch.randn(1, V, generator=torch.Generator().manual_seed(seed)) * 2
    for length in range(n):
        for prefix in itertools.product(range(V), repeat=length):
            if any(t in eos for t in prefix):
                continue
            ratios = [brute_ratio(hmm, weights, prefix, v)
                      if (v not in eos or length >= m) else 0.0 for v in range(V)]
            if not any(ratios):
                continue  # a dead prefix: the sampler never reaches it
            out = guided(torch.tensor([[0, *prefix]]), lm.clone())[0].double()
            log_lm = torch.log_softmax(lm[0].double(), -1)
            expected = torch.tensor([float(log_lm[v]) + strength * math.log(r) if r > 0
                                     else -math.inf for v, r in enumerate(ratios)],
                                    dtype=torch.float64)
            expected = torch.log_softmax(expected, -1)
            feasible = torch.isfinite(expected)
            assert torch.equal(torch.isfinite(out), feasible), (prefix, strength)
            assert torch.allclose(out[feasible], expected[feasible], atol=1e-4), (prefix, strength)


# ---------------------------------------------------------------------- per-step priors (heads)
V_TINY, EOS_TINY = 8, 7


def tiny_llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=V_TINY, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=64, eos_token_id=EOS_TINY, pad_token_id=EOS_TINY,
                         bos_token_id=0)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


class FilterRecomputed:
    """The HMM's filtering posterior as a per-step source: every row's prior recomputed from its
    generated tokens at every call (π, then ∝ (p ⊙ B[:, x]) A), independent of the bookkeeping."""

    def __init__(self, hmm):
        from ctrlg.guide.priors import HMMFilterPrior

        self.filter = HMMFilterPrior(hmm)
        self.calls = 0

    def initial(self, num_rows):
        return self.filter.initial(num_rows)

    def advance(self, priors, tokens):
        return priors

    def current(self, generated):
        self.calls += 1
        p = self.filter.initial(generated.shape[0])
        for t in range(generated.shape[1]):
            p = self.filter.advance(p, generated[:, t])
        return p


def decode(model, proc, beams, seed=0, n=6):
    prompt = torch.tensor([[0, 3, 5], [0, 2, 4]])
    kwargs = dict(num_beams=beams, do_sample=False) if beams > 1 else dict(do_sample=True)
    torch.manual_seed(seed)
    with torch.no_grad():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                              num_return_sequences=3, logits_processor=[proc],
                              pad_token_id=EOS_TINY, eos_token_id=EOS_TINY, top_k=0, **kwargs)


@pytest.mark.parametrize("beams", [1, 4])
def test_filtering_posterior_as_a_per_step_prior_gives_identical_outputs(beams):
    """A per-step source that returns the HMM's own filtering posterior reproduces the default
    processor exactly (sampling and beam search, two prompts with one DFA each)."""
    model, hmm = tiny_llama(), random_hmm(3, V_TINY, 0)
    dfas = [random_dfa(4, V_TINY, 1), random_dfa(4, V_TINY, 2)]
    make = lambda **kw: ConstraintLogitsProcessor(hmm, dfas, prompt_length=3, max_new_tokens=6,  # noqa: E731
                                                  eos_token_id=EOS_TINY, **kw)
    for seed in range(3):
        today = decode(model, make(), beams, seed)
        source = FilterRecomputed(hmm)
        per_step = decode(model, make(prior=source), beams, seed)
        assert source.calls >= 2 and torch.equal(today, per_step)


@pytest.mark.parametrize("beams", [1, 4])
def test_head_prior_reads_the_features_of_the_current_rows(beams):
    """Every captured feature equals a full forward pass of the row the processor sees (the
    final-norm hidden state at its last position), also when beams reorder the rows."""
    from ctrlg.hmm.prior_head import PriorHead
    from ctrlg.guide.priors import HeadPrior

    model, hmm = tiny_llama(), random_hmm(3, V_TINY, 0)
    torch.manual_seed(1)
    head = PriorHead(16, 3, inner_size=4)
    prompts = torch.tensor([[0, 3, 5], [0, 2, 4]])
    checked = []

    class Checked(HeadPrior):
        def current(self, generated):
            rows = generated.shape[0]
            full = torch.cat([prompts.repeat_interleave(rows // 2, 0), generated], 1)
            with torch.no_grad():
                want = model(full, output_hidden_states=True).hidden_states[-1][:, -1].float()
            assert torch.allclose(self._features, want, atol=1e-5)
            checked.append(rows)
            return super().current(generated)

    dfas = [random_dfa(4, V_TINY, 1), random_dfa(4, V_TINY, 2)]
    with Checked(head, model, hidden_size=hmm.hidden_size) as prior:
        proc = ConstraintLogitsProcessor(hmm, dfas, prompt_length=3, max_new_tokens=6,
                                         eos_token_id=EOS_TINY, prior=prior, strength=0.7)
        out = decode(model, proc, beams)
    assert checked  # the head was consulted
    for i, row in enumerate(out[:, 3:].tolist()):
        body = row[:row.index(EOS_TINY) + 1] if EOS_TINY in row else row
        assert dfas[i // (out.shape[0] // 2)].accepts(body)


def test_generate_with_a_prior_head_accepts_and_checks_sizes():
    import ctrlg
    from ctrlg.errors import VocabularyMismatchError
    from ctrlg.hmm.prior_head import PriorHead

    model, hmm = tiny_llama(), random_hmm(3, V_TINY, 0)
    dfa = random_dfa(4, V_TINY, 1)
    head = PriorHead(16, 3, inner_size=0)
    for beams in (1, 3):
        outs = ctrlg.generate(model, None, [0, 3, 5], dfa, hmm=hmm, max_new_tokens=6,
                              num_samples=3, num_beams=beams, eos_token_id=EOS_TINY,
                              prior_head=head, rank_by_lm=False)
        assert outs and all(dfa.accepts(g.token_ids) for g in outs)
    # the hook is gone after generate
    assert not model.get_output_embeddings()._forward_pre_hooks
    with pytest.raises(VocabularyMismatchError, match="hidden states"):
        ctrlg.generate(model, None, [0, 3], dfa, hmm=hmm, max_new_tokens=6,
                       eos_token_id=EOS_TINY, prior_head=PriorHead(16, 5))
    with pytest.raises(VocabularyMismatchError, match="width"):
        ctrlg.generate(model, None, [0, 3], dfa, hmm=hmm, max_new_tokens=6,
                       eos_token_id=EOS_TINY, prior_head=PriorHead(32, 3))
    with pytest.raises(ValueError, match="strength"):
        ConstraintLogitsProcessor(hmm, dfa, max_new_tokens=4, strength=-1)
    for mode in ("ctrlg", "logical"):
        with pytest.raises(ValueError, match="precision must be one of"):
            ConstraintLogitsProcessor(hmm, dfa, max_new_tokens=4, mode=mode, precision="half")
