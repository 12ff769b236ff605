"""The HMMs shipped in ctrlg/assets: each loads against the embedded tokenizer, is a proper HMM,
and models what its pipeline decodes — the adapted pipeline's HMM (distilled from the
CommonGen-adapted LM's BOS-prompted samples) gives CommonGen dev sentences a higher likelihood
than the instruct pipeline's HMM (distilled from answers to instructions).

Registered assets that are not shipped (docs/models.md: re-created by their commands) are left
out here; tests/test_models_doc.py checks that every asset a default uses ships."""

import pytest
import torch

from ctrlg.data import load_commongen
from ctrlg.errors import CheckpointError
from ctrlg.data.commongen_prompts import target_text
from ctrlg.hmm import EMBEDDED_HMMS, default_hmm_path, load_embedded_hmm

ASSETS = default_hmm_path().parent
SHIPPED_HMMS = [name for name, folder in EMBEDDED_HMMS.items() if (ASSETS / folder).is_dir()]


def test_every_embedded_hmm_loads_and_is_stochastic(smollm2_tokenizer):
    assert {"instruct", "commongen-adapted", "commongen-human-h512"} <= set(SHIPPED_HMMS)
    for name in SHIPPED_HMMS:
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
                 for name in ("instruct", "commongen-adapted", "commongen-human-h512")}
    assert per_token["commongen-adapted"] > per_token["instruct"] + 0.5, per_token
    # the adapted pipeline's HMM (h = 512, re-fitted to the LM adapted on human-written captions
    # only): closer still to the crowd-written references
    assert per_token["commongen-human-h512"] > per_token["commongen-adapted"] + 0.3, per_token


def test_every_embedded_adapter_names_the_embedded_base_and_improved_held_out_nll():
    """The shipped adapters carry their metadata: the embedded base LM and its
    fingerprint (checked again when the adapter is merged), the text format they were trained
    on, and a lower held-out NLL of held-out targets (dev references, tune passages) than the
    base LM's."""
    from ctrlg.lm.adapters import ASSETS, EMBEDDED_ADAPTERS, adapter_info

    shipped = [name for name, folder in EMBEDDED_ADAPTERS.items() if (ASSETS / folder).is_dir()]
    assert {"commongen-human-balanced", "commongen-supervised"} <= set(shipped)
    fingerprints = set()
    for name in shipped:
        info = adapter_info(name)
        assert info["base_model"] == "smollm2-135m-instruct"
        expected_form = {"stories": "plain", "stories-continue": "continuation",
                         "stories-ilm": "ilm", "commongen-supervised": "supervised"}
        assert info["form"] == expected_form.get(name, "unsupervised"), name
        nll = info["metrics"]["heldout_nll_per_token"]
        assert nll["adapted"] < nll["base"] - 0.3, (name, nll)
        fingerprints.add(info["base_fingerprint"])
    assert len(fingerprints) == 1


def test_every_embedded_prior_head_attaches_to_its_hmm_and_improved_held_out_ll(smollm2_tokenizer):
    """Prior heads shipped apart from their HMM: each was trained against the embedded HMM it
    names (same save_id), reads the embedded LM's width, and its held-out table shows the head
    beating the HMM's own filtering prior on continuations of the LM it reads."""
    from ctrlg.hmm import EMBEDDED_PRIOR_HEADS, prior_head_path
    from ctrlg.hmm.prior_head import PriorHead

    for name in EMBEDDED_PRIOR_HEADS:
        folder = prior_head_path(name)
        base = PriorHead.load(folder).config["base_hmm"]
        hmm = load_embedded_hmm(base, tokenizer=smollm2_tokenizer)
        head = hmm.attach_prior_head(folder, tokenizer=smollm2_tokenizer)
        assert head.lm_hidden_size == 576 and head.hidden_size == hmm.hidden_size
        assert head.config["lm_adapter"] == name   # the LM whose features it reads
        for row in head.config["metrics"]["prefix_table"]:
            assert row["per_token"]["hmm_head"] > row["per_token"]["hmm"], row


def test_a_registered_asset_that_is_not_shipped_says_how_to_make_it(monkeypatch):
    from ctrlg.lm.adapters import EMBEDDED_ADAPTERS, resolve_adapter

    monkeypatch.setitem(EMBEDDED_HMMS, "not-made", "hmm_not_made_here")
    monkeypatch.setitem(EMBEDDED_ADAPTERS, "not-made", "adapter_not_made_here")
    with pytest.raises(CheckpointError, match="'not-made' is not in .*hmm_not_made_here.*docs/models.md"):
        load_embedded_hmm("not-made")
    with pytest.raises(CheckpointError, match="'not-made' is not in .*adapter_not_made_here.*docs/models.md"):
        resolve_adapter("not-made")
