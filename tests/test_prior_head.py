"""PriorHead (ctrlg.hmm.prior_head): normalisation, save/load round trip with its HMM, and clear
errors on tokenizer / LM / HMM-size mismatch and corrupt or torn files."""

import json

import pytest
import torch

from ctrlg import HMM
from ctrlg.errors import CheckpointError, VocabularyMismatchError
from ctrlg.hmm import PriorHead, tokenizer_fingerprint


class FakeTokenizer:
    def __init__(self, vocab, name):
        self._vocab, self.name_or_path = vocab, name

    def get_vocab(self):
        return dict(self._vocab)


MINE = FakeTokenizer({"a": 0, "b": 1, "c": 2, "d": 3}, "mine")
OTHER = FakeTokenizer({"a": 0, "b": 1, "c": 2, "e": 3}, "other")


def random_hmm(h=3, V=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return HMM.from_params(*(torch.rand(*shape, generator=g).add(0.05) for shape in ((h,), (h, h), (h, V))),
                           normalize=True)


def trained_like_head(d=5, h=3, inner=4, seed=0):
    torch.manual_seed(seed)
    head = PriorHead(d, h, inner_size=inner,
                     config={"lm_name": "tiny", "tokenizer_name": "mine", "tokenizer_hash": tokenizer_fingerprint(MINE)})
    with torch.no_grad():
        for p in head.parameters():
            p.normal_()
    return head


@pytest.mark.parametrize("inner", [0, 4])
def test_forward_is_a_log_distribution_over_hidden_states(inner):
    head = trained_like_head(inner=inner)
    out = head(torch.randn(2, 7, 5))
    assert out.shape == (2, 7, 3) and out.dtype == torch.float32
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(2, 7))
    assert head(torch.randn(5, dtype=torch.bfloat16)).shape == (3,)
    with pytest.raises(VocabularyMismatchError, match="width 5"):
        head(torch.randn(2, 6))


def test_init_bias_gives_a_constant_prior():
    head = PriorHead(5, 3, inner_size=4)
    prior = torch.tensor([0.2, 0.3, 0.5])
    head.init_bias(prior.log())
    torch.testing.assert_close(head(torch.randn(4, 5)).exp(), prior.expand(4, 3))


def test_save_load_round_trip_alone_and_with_its_hmm(tmp_path):
    head = trained_like_head()
    features = torch.randn(6, 5)
    head.save(tmp_path / "h")
    loaded = PriorHead.load(tmp_path / "h", tokenizer=MINE, lm_hidden_size=5, hidden_size=3)
    torch.testing.assert_close(loaded(features), head(features), rtol=0, atol=0)
    assert loaded.config["lm_name"] == "tiny" and loaded.inner_size == 4 and not loaded.training

    hmm = random_hmm()
    assert hmm.prior_head is None
    hmm.save(tmp_path / "plain")
    assert HMM.load(tmp_path / "plain").prior_head is None
    hmm.prior_head = head
    hmm.save(tmp_path / "both")
    again = HMM.load(tmp_path / "both", tokenizer=MINE)
    torch.testing.assert_close(again.prior_head(features), head(features), rtol=0, atol=0)
    torch.testing.assert_close(again.transition, hmm.transition)
    # saving the HMM without a head removes the stale head files
    hmm.prior_head = None
    hmm.save(tmp_path / "both")
    assert HMM.load(tmp_path / "both").prior_head is None


def test_mismatches_are_clear_errors(tmp_path):
    head = trained_like_head()
    head.save(tmp_path / "h")
    with pytest.raises(VocabularyMismatchError, match="trained for tokenizer 'mine'"):
        PriorHead.load(tmp_path / "h", tokenizer=OTHER)
    with pytest.raises(VocabularyMismatchError, match="width 5 .*LM 'tiny'.* width 8"):
        PriorHead.load(tmp_path / "h", lm_hidden_size=8)
    with pytest.raises(VocabularyMismatchError, match="predicts 3 HMM hidden states but the HMM has 4"):
        PriorHead.load(tmp_path / "h", hidden_size=4)
    # attached to an HMM of another size
    big = random_hmm(h=4)
    big.save(tmp_path / "big")
    head.save(tmp_path / "big")
    with pytest.raises(VocabularyMismatchError, match="but the HMM has 4"):
        HMM.load(tmp_path / "big")
    # a head saved with other HMM weights of the same size
    hmm = random_hmm(seed=1)
    hmm.prior_head = head
    hmm.save(tmp_path / "pair")
    random_hmm(seed=2).save(tmp_path / "other")
    for name in ("prior_head.safetensors", "prior_head.json"):
        (tmp_path / "other" / name).write_bytes((tmp_path / "pair" / name).read_bytes())
    with pytest.raises(CheckpointError, match="other HMM weights"):
        HMM.load(tmp_path / "other")
    with pytest.raises(VocabularyMismatchError, match="trained for tokenizer"):
        HMM.load(tmp_path / "pair", tokenizer=OTHER)


def test_corrupt_or_torn_files_are_clear_errors(tmp_path):
    head = trained_like_head()
    folder = head.save(tmp_path / "h")
    weights, config = folder / "prior_head.safetensors", folder / "prior_head.json"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        PriorHead.load(folder)
    head.save(folder)
    config.write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        PriorHead.load(folder)
    head.save(folder)
    edited = json.loads(config.read_text())
    edited["hidden_size"] = 7
    config.write_text(json.dumps(edited))
    with pytest.raises(CheckpointError, match="do not belong together"):
        PriorHead.load(folder)
    head.save(folder)
    config.unlink()
    with pytest.raises(CheckpointError, match=r"missing \['prior_head.json'\]"):
        PriorHead.load(folder)
    # a half-present head next to an HMM is an error, not silently ignored
    hmm = random_hmm()
    hmm.save(tmp_path / "hmm")
    (tmp_path / "hmm" / "prior_head.safetensors").write_bytes(data)
    with pytest.raises(CheckpointError, match="no complete prior head"):
        HMM.load(tmp_path / "hmm")
    with pytest.raises(CheckpointError, match="positive"):
        PriorHead(0, 3)
