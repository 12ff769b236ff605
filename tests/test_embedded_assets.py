"""The HMMs shipped in ctrlg/assets: each loads against the embedded tokenizer, is a proper HMM,
and models what its pipeline decodes — the adapted pipeline's HMM (distilled from the
CommonGen-adapted LM's BOS-prompted samples) gives CommonGen dev sentences a higher likelihood
than the instruct pipeline's HMM (distilled from answers to instructions)."""

import torch

from ctrlg.data import load_commongen
from ctrlg.data.commongen_prompts import target_text
from ctrlg.hmm import EMBEDDED_HMMS, load_embedded_hmm


def test_every_embedded_hmm_loads_and_is_stochastic(smollm2_tokenizer):
    for name in EMBEDDED_HMMS:
        hmm = load_embedded_hmm(name, tokenizer=smollm2_tokenizer)
        assert hmm.vocab_size == len(smollm2_tokenizer)
        for probs in (hmm.initial[None], hmm.transition, hmm.emission):
            assert torch.allclose(probs.double().sum(-1), torch.ones(probs.shape[0], dtype=torch.float64),
                                  atol=1e-3)
            assert (probs >= 0).all()


def test_adapted_hmm_models_commongen_sentences_better_than_the_instruct_one(smollm2_tokenizer):
    tok = smollm2_tokenizer
    references = [ex.references[0] for ex in load_commongen(limit=40)]
    rows = [tok(target_text(s, tok), add_special_tokens=False)["input_ids"] for s in references]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tok.eos_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[i < len(r) for i in range(width)] for r in rows])
    per_token = {name: float(load_embedded_hmm(name).log_prob(ids, mask=mask).sum() / mask.sum())
                 for name in ("instruct", "commongen-adapted")}
    assert per_token["commongen-adapted"] > per_token["instruct"] + 0.5, per_token
