"""8-bit emission storage (ctrlg.hmm.quantize): every decoded row is a distribution, each entry is
within the scheme's stated error, the checkpoint round trip keeps the log-likelihood, and a
corrupt quantized checkpoint is a clear error."""

import math

import pytest
import torch
from safetensors.torch import load_file, save_file

import ctrlg
from ctrlg.errors import CheckpointError
from ctrlg.guide.factored_emission import rank_one_tail
from ctrlg.hmm.quantize import LOG_RANGE, dequantize_emission, quantize_emission, support_from_tokens


def skewed_emission(h=6, V=300, seed=0):
    """Rows spanning ~20 orders of magnitude, as a distilled HMM's do."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(h, V, generator=g, dtype=torch.float64) * 6
    return torch.softmax(logits, -1)


def test_log8_keeps_every_entry_within_half_a_step_in_log_space():
    B = skewed_emission()
    q = quantize_emission(B, "log8")
    assert q["emission_codes"].dtype == torch.uint8
    decoded = dequantize_emission(q, "log8")
    assert torch.allclose(decoded.sum(1), torch.ones(B.shape[0], dtype=torch.float64))
    assert (decoded > 0).all()
    # up to the row's renormalisation (a common factor), log B̂ − log B lies within ±step/2
    # wherever log B is within LOG_RANGE of the row's maximum
    diff = decoded.log() - B.log()
    for row in range(B.shape[0]):
        inside = B[row].log() >= B[row].log().max() - LOG_RANGE
        spread = diff[row, inside].max() - diff[row, inside].min()
        assert spread <= float(q["emission_step"][row]) * (1 + 1e-6)


def test_normq8_is_linear_in_the_row_maximum_and_floors_small_entries():
    B = skewed_emission(seed=1)
    q = quantize_emission(B, "normq8")
    decoded = dequantize_emission(q, "normq8")
    assert torch.allclose(decoded.sum(1), torch.ones(B.shape[0], dtype=torch.float64))
    assert (decoded > 0).all()                      # the floor keeps every token possible
    codes = q["emission_codes"].double()
    top = B.max(1).values[:, None]
    assert ((codes - 255 * B / top).abs() <= 0.5 + 1e-9).all()


@pytest.mark.parametrize("scheme", ["log8", "normq8"])
def test_quantized_checkpoint_round_trip(tmp_path, scheme):
    g = torch.Generator().manual_seed(3)
    h, V = 5, 400
    emission = skewed_emission(h, V, seed=3).float()
    hmm = ctrlg.HMM.from_params(torch.full((h,), 1 / h), torch.softmax(torch.randn(h, h, generator=g), -1),
                                emission)
    hmm.save(tmp_path / "q", emission_quantization=scheme)
    loaded = ctrlg.HMM.load(tmp_path / "q")
    assert loaded.config["emission_quantization"] == scheme
    assert torch.allclose(loaded.transition, hmm.transition, atol=1e-6)
    ids = hmm.sample(64, 12, seed=0)
    per_token = (loaded.log_prob(ids) - hmm.log_prob(ids)).abs().mean() / 12
    bound = 0.06 if scheme == "log8" else 1.0     # log8: about half a step (~0.06 nats) at most
    assert float(per_token) < bound
    size = (tmp_path / "q" / "model.safetensors").stat().st_size
    assert size < h * V * 1.2 + 4 * h * h + 4096        # one byte per emission entry


def test_unknown_scheme_and_missing_tensors_are_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="must be one of"):
        quantize_emission(skewed_emission(), "int4")
    hmm = ctrlg.HMM.from_params(torch.full((2,), 0.5), torch.full((2, 2), 0.5), torch.full((2, 3), 1 / 3))
    hmm.save(tmp_path / "q", emission_quantization="log8")
    weights = tmp_path / "q" / "model.safetensors"
    tensors = load_file(str(weights))
    del tensors["emission_step"]
    save_file(tensors, str(weights), metadata={"format": "ctrlg-hmm"})
    with pytest.raises(CheckpointError):
        ctrlg.HMM.load(tmp_path / "q")
    assert math.isfinite(LOG_RANGE)


def test_topk8_keeps_the_top_entries_and_spreads_the_tail_over_the_background():
    B = skewed_emission(h=5, V=300, seed=4)
    q = quantize_emission(B, "topk8-40")
    assert q["emission_topk_index"].shape == (5, 40) and q["emission_codes"].dtype == torch.uint8
    decoded = dequantize_emission(q, "topk8-40")
    assert torch.allclose(decoded.sum(1), torch.ones(5, dtype=torch.float64)) and (decoded > 0).all()
    background = B.mean(0)
    for row in range(5):
        top = torch.topk(B[row], 40).indices
        tail = torch.ones(300, dtype=torch.bool)
        tail[top] = False
        # the tail keeps its total mass and is proportional to the background
        assert math.isclose(float(decoded[row, tail].sum()), float(B[row, tail].sum()), rel_tol=1e-5)
        ratio = decoded[row, tail] / background[tail]
        assert torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-6)
        # the kept entries keep their order of magnitude (log8 codes, rescaled by a common factor)
        diff = decoded[row, top].log() - B[row, top].log()
        assert float(diff.max() - diff.min()) <= float(q["emission_step"][row]) * (1 + 1e-6)


def test_topk8_indices_survive_vocabularies_past_int16():
    V = 40000
    B = torch.softmax(torch.randn(3, V, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 5, -1)
    q = quantize_emission(B, "topk8-100")
    assert q["emission_topk_index"].dtype == torch.int16
    decoded = dequantize_emission(q, "topk8-100")
    for row in range(3):
        top = torch.topk(B[row], 100).indices
        assert q["emission_topk_index"][row].long().__and__(0xFFFF).sort().values.equal(top.sort().values)
        diff = decoded[row, top].log() - B[row, top].log()   # the codes land on the right tokens
        assert float(diff.max() - diff.min()) <= float(q["emission_step"][row]) * (1 + 1e-6)


def test_topk8_checkpoint_round_trip_and_size(tmp_path):
    g = torch.Generator().manual_seed(5)
    h, V, K = 6, 500, 50
    emission = skewed_emission(h, V, seed=5).float()
    hmm = ctrlg.HMM.from_params(torch.full((h,), 1 / h), torch.softmax(torch.randn(h, h, generator=g), -1),
                                emission)
    hmm.save(tmp_path / "q", emission_quantization=f"topk8-{K}")
    loaded = ctrlg.HMM.load(tmp_path / "q")
    ids = hmm.sample(64, 12, seed=0)
    assert float((loaded.log_prob(ids) - hmm.log_prob(ids)).abs().mean() / 12) < 0.1
    size = (tmp_path / "q" / "model.safetensors").stat().st_size
    assert size < h * K * 3 + 4 * V + 4 * h * h + 4096


@pytest.mark.parametrize("name", ["topk8-0", "topk8-x", "topk8", "topk4-8"])
def test_bad_topk_names_are_clear_errors(name):
    with pytest.raises(CheckpointError, match="topk8-K"):
        quantize_emission(skewed_emission(), name)


def test_topk8_within_a_support_keeps_rows_there_and_leaves_one_profile_outside():
    """Each row's K kept among the support tokens; every other token's column is one shared
    profile, so the guide's product multiplies only the kept tokens' columns."""
    B = skewed_emission(h=5, V=300, seed=6)
    support = torch.zeros(300, dtype=torch.bool)
    support[torch.arange(0, 300, 3)] = True                       # 100 tokens
    q = quantize_emission(B, "topk8-20", support=support)
    index = q["emission_topk_index"].long() & 0xFFFF
    within = support.nonzero()[:, 0]
    for row in range(5):                                          # the 20 largest within the support
        want = within[torch.topk(B[row, within], 20).indices]
        assert index[row].sort().values.equal(want.sort().values)
    decoded = dequantize_emission(q, "topk8-20")
    assert torch.allclose(decoded.sum(1), torch.ones(5, dtype=torch.float64))
    kept = torch.zeros(300, dtype=torch.bool)
    kept[index.flatten()] = True
    tail = rank_one_tail(decoded.float().T.contiguous())
    assert tail is not None and torch.equal(tail.support, kept.nonzero()[:, 0])
    assert bool(support[tail.support].all())


def test_a_support_needs_a_topk_scheme_and_a_vocabulary_sized_mask():
    B = skewed_emission(h=3, V=50)
    with pytest.raises(CheckpointError, match="needs a topk8-K scheme"):
        quantize_emission(B, "log8", support=torch.ones(50, dtype=torch.bool))
    with pytest.raises(CheckpointError, match="non-empty bool vector over the 50 tokens"):
        quantize_emission(B, "topk8-4", support=torch.ones(49, dtype=torch.bool))
    with pytest.raises(CheckpointError, match="non-empty"):
        quantize_emission(B, "topk8-4", support=torch.zeros(50, dtype=torch.bool))


def test_support_from_tokens_counts_by_enumeration():
    tokens = torch.tensor([[1, 2, 2, 3], [3, 3, 7, 0]])
    counts = {v: sum(int(t == v) for t in tokens.flatten()) for v in range(10)}
    for m in (1, 2, 3):
        got = support_from_tokens(tokens, 10, m, always=(9,))
        assert got.tolist() == [counts[v] >= m or v == 9 for v in range(10)]
    with pytest.raises(CheckpointError, match="min_count must be >= 1"):
        support_from_tokens(tokens, 10, 0)


def test_a_checkpoint_saved_within_a_support_records_its_size(tmp_path):
    h, V = 4, 200
    hmm = ctrlg.HMM.from_params(torch.full((h,), 1 / h), torch.full((h, h), 1 / h),
                                skewed_emission(h, V, seed=7).float())
    support = torch.zeros(V, dtype=torch.bool)
    support[:80] = True
    with pytest.raises(CheckpointError, match="needs a topk8-K emission_quantization"):
        hmm.save(tmp_path / "dense", emission_support=support)
    hmm.save(tmp_path / "s", emission_quantization="topk8-10", emission_support=support)
    loaded = ctrlg.HMM.load(tmp_path / "s")
    assert loaded.config["emission_support_size"] == 80
    kept = load_file(str(tmp_path / "s" / "model.safetensors"))["emission_topk_index"].long() & 0xFFFF
    assert int(kept.max()) < 80
