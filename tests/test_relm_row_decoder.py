"""ReLM sampling's incremental row decoder against the reference (each row run alone, no cache,
no padding), and the sampler's distribution against the exact one, enumerated token by token:
p(x) = Π_i p_lm(x_i | x_<i) / Σ_{v allowed} p_lm(v | x_<i), with stopping weighted by p_lm(EOS)."""

import math

import numpy as np
import pytest
import torch

from ctrlg.relm import Query, sample
from ctrlg.relm.query import (_ContextScorer, _accepting, _initial, _moves, _prepare, _step,
                              _topk_mask)
from ctrlg.relm.row_decoder import RowDecoder
from tiny_lms import NoCacheLM, tiny_llama


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def lm(tok):
    """Two layers and grouped-query attention (one K/V head for two query heads)."""
    return tiny_llama(len(tok), seed=1, head_scale=20.0, layers=2, kv_heads=1)


@torch.no_grad()
def _alone(lm, ids):
    """float32 [len(ids), V]: log p_lm(· | ids[:i+1]) for the sequence run on its own."""
    return torch.log_softmax(lm(input_ids=torch.tensor([ids])).logits[0].float(), -1)


@pytest.mark.parametrize("cached", [True, False])
def test_rows_of_different_prefixes_and_lengths_equal_each_row_run_alone(lm, cached):
    context = [5, 17, 90]
    scorer = _ContextScorer(lm if cached else NoCacheLM(lm), context)
    assert (scorer.layers is not None) == cached
    prefixes = [[7, 8, 9], [], [11], [12, 13]]
    steps = [[21, 22, 23], [31, None, None], [41, 42, None], [None, None, None]]
    decoder = RowDecoder(scorer)
    log_probs, prefix_scores = decoder.start(prefixes)
    rows = [list(p) for p in prefixes]
    for r, prefix in enumerate(prefixes):
        reference = _alone(lm, context + prefix)
        assert torch.allclose(log_probs[r], reference[-1], atol=1e-4)
        expected = sum(float(reference[len(context) - 1 + i, t]) for i, t in enumerate(prefix))
        assert prefix_scores[r] == pytest.approx(expected, abs=1e-4)
    for t in range(3):
        tokens = [steps[r][t] for r in range(len(prefixes))]
        log_probs = decoder.advance(tokens)
        for r, token in enumerate(tokens):
            if token is None:
                continue
            rows[r].append(token)
            assert torch.allclose(log_probs[r], _alone(lm, context + rows[r])[-1], atol=1e-4)
    with pytest.raises(ValueError, match="one entry per row"):
        decoder.advance([1])


def _exact_distribution(lm, tok, query):
    """{token ids: probability} of the sampler's language, by enumerating every token path."""
    autom, context, eos = _prepare(lm, tok, query, None)
    out = {}

    def walk(seq, configs, prob):
        lp = _alone(lm, context + seq)[-1]
        allowed = _topk_mask(lp, query.top_k)
        options = (np.zeros(0, dtype=np.int64) if len(seq) >= query.max_tokens
                   else _moves(autom, configs, allowed))
        weights = [math.exp(float(lp[int(v)])) for v in options]
        stop = _accepting(autom, configs)
        if stop:
            weights.append(math.exp(float(lp[eos])))
        total = sum(weights)
        for v, w in zip(options, weights):
            walk(seq + [int(v)], _step(autom, configs, int(v), allowed), prob * w / total)
        if stop:
            out[tuple(seq)] = out.get(tuple(seq), 0.0) + prob * weights[-1] / total

    walk([], _initial(autom), 1.0)
    return out


def test_sampled_frequencies_match_the_enumerated_distribution(lm, tok):
    query = Query("(a|b) (c|d)e?", encodings="all", max_tokens=5)   # 24 token paths
    exact = _exact_distribution(lm, tok, query)
    assert len(exact) > 20 and sum(exact.values()) == pytest.approx(1.0, abs=1e-9)
    n = 3000
    drawn = sample(lm, tok, query, num_samples=n, seed=7, batch_size=64)
    assert len(drawn) == n
    counts = {}
    for result in drawn:
        assert result.token_ids in exact                   # every sample is a path of the tree
        counts[result.token_ids] = counts.get(result.token_ids, 0) + 1
    total_variation = 0.5 * sum(abs(counts.get(x, 0) / n - p) for x, p in exact.items())
    assert total_variation < 0.05, total_variation       # ~0.02 expected from sampling noise
    for result in drawn[:50]:                            # scores are the LM's, as in search
        steps = _alone(lm, [tok.bos_token_id] + list(result.token_ids))
        expected = sum(float(steps[i, t]) for i, t in enumerate(result.token_ids))
        assert result.log_prob == pytest.approx(expected, abs=1e-3)
