"""ctrlg.HMM: forward algorithm against enumeration, sampling, persistence and bad input."""

import functools
import itertools
import json
import math

import pytest
import torch

from ctrlg import HMM
from ctrlg.errors import CheckpointError, HMMParameterError, VocabularyMismatchError
from helpers import floored_random_hmm


#: rows ∝ U(0, 1) + 0.05
random_hmm = functools.partial(floored_random_hmm, floor=0.05)


def brute_log_prob(hmm, seq):
    pi, A, B = hmm.initial.double(), hmm.transition.double(), hmm.emission.double()
    total = 0.0
    for z in itertools.product(range(hmm.hidden_size), repeat=len(seq)):
        p = pi[z[0]] * B[z[0], seq[0]]
        for t in range(1, len(seq)):
            p = p * A[z[t - 1], z[t]] * B[z[t], seq[t]]
        total += float(p)
    return math.log(total)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_log_prob_equals_enumeration(seed):
    hmm = random_hmm(h=3, V=4, seed=seed)
    seqs = list(itertools.product(range(4), repeat=3))
    got = hmm.log_prob(torch.tensor(seqs))
    want = torch.tensor([brute_log_prob(hmm, s) for s in seqs], dtype=torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # all sequences of length 3 together carry probability 1
    assert abs(float(torch.logsumexp(got.double(), 0))) < 1e-5


def test_log_prob_mask_equals_shorter_sequences():
    hmm = random_hmm(h=4, V=5, seed=3)
    ids = torch.tensor([[1, 2, 3, 4], [0, 1, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    got = hmm.log_prob(ids, mask=mask)
    assert math.isclose(float(got[0]), brute_log_prob(hmm, [1, 2, 3, 4]), rel_tol=1e-5)
    assert math.isclose(float(got[1]), brute_log_prob(hmm, [0, 1]), rel_tol=1e-5)


def test_log_prob_long_sequences_stay_finite():
    hmm = random_hmm(h=8, V=50, seed=4)
    ids = hmm.sample(2, 1024, seed=0)
    lp = hmm.log_prob(ids)
    assert torch.isfinite(lp).all() and (lp < -100).all()


def test_sample_frequencies_match_probabilities():
    hmm = random_hmm(h=2, V=3, seed=5)
    samples = hmm.sample(20000, 2, seed=1)
    codes = samples[:, 0] * 3 + samples[:, 1]
    freq = torch.bincount(codes, minlength=9).double() / len(codes)
    probs = hmm.log_prob(torch.tensor(list(itertools.product(range(3), repeat=2)))).double().exp()
    assert (freq - probs).abs().max() < 0.015
    assert torch.equal(samples, hmm.sample(20000, 2, seed=1))  # seeded


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_load_roundtrip(tmp_path, dtype):
    hmm = random_hmm(h=4, V=6, seed=6)
    hmm.config["tokenizer_name"] = "toy"
    hmm.save(tmp_path / "ckpt", dtype=dtype)
    loaded = HMM.load(tmp_path / "ckpt")
    tol = 1e-7 if dtype == torch.float32 else 1e-2
    for name in ("initial", "transition", "emission"):
        torch.testing.assert_close(getattr(loaded, name), getattr(hmm, name), atol=tol, rtol=0)
        torch.testing.assert_close(getattr(loaded, name).sum(-1), torch.ones_like(getattr(loaded, name).sum(-1)))
    assert loaded.config["tokenizer_name"] == "toy" and loaded.hidden_size == 4 and loaded.vocab_size == 6
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["dtype"] == str(dtype).replace("torch.", "")


@pytest.mark.parametrize("bad, message", [
    (lambda p: p[0].__setitem__(0, float("nan")), "NaN"),
    (lambda p: (p[1].__setitem__((0, 0), -0.1), p[1].__setitem__((0, 1), p[1][0, 1] + 0.1)), "negative"),
    (lambda p: p[2].__setitem__((1, 0), p[2][1, 0] + 0.5), "sum to 1"),
])
def test_bad_parameters_raise(bad, message):
    hmm = random_hmm(h=3, V=4, seed=7)
    params = [hmm.initial.clone(), hmm.transition.clone(), hmm.emission.clone()]
    bad(params)
    with pytest.raises(HMMParameterError, match=message):
        HMM.from_params(*params)


def test_bad_shapes_raise():
    hmm = random_hmm(h=3, V=4)
    with pytest.raises(HMMParameterError, match="transition"):
        HMM.from_params(hmm.initial, hmm.transition[:2], hmm.emission)
    with pytest.raises(HMMParameterError, match="emission"):
        HMM.from_params(hmm.initial, hmm.transition, hmm.emission[:2])


def test_vocabulary_checks():
    hmm = random_hmm(h=3, V=4)
    with pytest.raises(VocabularyMismatchError, match="vocabulary size 4"):
        hmm.check_vocab(5)
    hmm.check_vocab(4)
    with pytest.raises(VocabularyMismatchError, match=r"\[0, 4\)"):
        hmm.log_prob(torch.tensor([[0, 4]]))


class FakeTokenizer:
    def __init__(self, vocab, name):
        self._vocab, self.name_or_path = vocab, name

    def get_vocab(self):
        return dict(self._vocab)


def test_checkpoint_for_another_tokenizer_raises(tmp_path):
    from ctrlg.hmm import tokenizer_fingerprint

    mine = FakeTokenizer({"a": 0, "b": 1, "c": 2, "d": 3}, "mine")
    other = FakeTokenizer({"a": 0, "b": 1, "c": 2, "e": 3}, "other")
    hmm = random_hmm(h=3, V=4)
    hmm.config.update(tokenizer_name="mine", tokenizer_hash=tokenizer_fingerprint(mine))
    hmm.save(tmp_path / "c")
    assert HMM.load(tmp_path / "c", tokenizer=mine).vocab_size == 4
    with pytest.raises(VocabularyMismatchError, match="distilled for tokenizer 'mine'"):
        HMM.load(tmp_path / "c", tokenizer=other)


def test_truncated_or_missing_checkpoint_raises(tmp_path):
    hmm = random_hmm(h=3, V=4)
    path = hmm.save(tmp_path / "c")
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        HMM.load(path)
    weights.unlink()
    with pytest.raises(CheckpointError, match="not an HMM checkpoint"):
        HMM.load(path)
    hmm.save(tmp_path / "d")
    (tmp_path / "d" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        HMM.load(tmp_path / "d")


def test_checkpoint_with_unnormalised_rows_raises(tmp_path):
    from safetensors.torch import save_file

    from ctrlg.checkpoint import file_sha256

    hmm = random_hmm(h=3, V=4)
    path = hmm.save(tmp_path / "c")
    save_id = json.loads((path / "config.json").read_text())["save_id"]
    save_file({"initial": hmm.initial, "transition": hmm.transition * 2, "emission": hmm.emission},
              str(path / "model.safetensors"), metadata={"save_id": save_id})
    config = json.loads((path / "config.json").read_text())      # a deliberate edit: its
    config["checksums"] = {"model.safetensors": file_sha256(path / "model.safetensors")}  # sum
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="transition"):
        HMM.load(path)
