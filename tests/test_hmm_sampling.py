"""LM sampling for distillation (ctrlg.hmm.sampling) and the pipeline (ctrlg.hmm.distill) on a tiny
random Llama with a word-level tokenizer."""

import json

import pytest
import torch

from ctrlg import HMM
from ctrlg.data.commongen_prompts import commongen_prompts
from ctrlg.errors import CtrlgError
from ctrlg.hmm.sampling import load_chunks, read_prompts, sample_sequences, sample_to_disk, shared_prefix


EOS = 2


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": EOS, **{f"w{i}": i for i in range(3, 40)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>",
                                        bos_token="<bos>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         eos_token_id=EOS, bos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # make EOS likely so that rows finish at different times
        model.lm_head.weight[EOS] += 0.5 * model.lm_head.weight.mean(0)
        model.lm_head.weight[EOS] *= 3
    path = tmp_path_factory.mktemp("tiny_lm")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer, path


def full_forward_check(model, prompt, tokens, logprob, hidden, hidden_atol=1e-5):
    n = next((i + 1 for i, x in enumerate(tokens.tolist()) if x == EOS), len(tokens))
    ids = torch.cat([prompt, tokens[:n]])[None]
    out = model(ids, output_hidden_states=True)
    want = torch.log_softmax(out.logits[0, len(prompt) - 1:-1].float(), -1).gather(1, tokens[:n, None])[:, 0]
    torch.testing.assert_close(logprob[:n], want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden[:n], out.hidden_states[-1][0, len(prompt) - 1:-1], atol=hidden_atol,
                               rtol=hidden_atol)
    assert (tokens[n:] == EOS).all() and (logprob[n:] == 0).all()
    return n


@torch.no_grad()
@pytest.mark.parametrize("use_prefix", [False, True])
def test_cached_sampling_matches_full_forward(tiny_lm, use_prefix):
    model = tiny_lm[0]
    g = torch.Generator().manual_seed(3)
    prefix = torch.tensor([20, 21, 22])
    ids = torch.randint(3, 40, (8, 5), generator=g)
    mask = torch.ones(8, 5, dtype=torch.long)
    mask[0, :2] = 0
    mask[3, :4] = 0
    ids[mask == 0] = 0
    res = sample_sequences(model, ids, mask, 10, eos_token_ids=[EOS], generator=g, return_hidden=True,
                           prefix_ids=prefix if use_prefix else None)
    lengths = []
    for b in range(8):
        prompt = ids[b][mask[b].bool()]
        if use_prefix:
            prompt = torch.cat([prefix, prompt])
        lengths.append(full_forward_check(model, prompt, res["tokens"][b], res["logprob"][b], res["hidden"][b]))
    assert len(set(lengths)) > 2  # rows finished at different steps (dropping finished rows works)


@pytest.mark.parametrize("sampler", ["inverse_cdf", "multinomial"])
def test_sampling_is_ancestral(sampler):
    """Empirical next-token frequencies match the LM's softmax (no top-k / top-p / temperature)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=6, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, eos_token_id=5)).eval()
    ids = torch.tensor([[1, 2]]).repeat(2000, 1)
    res = sample_sequences(model, ids, torch.ones_like(ids), 1, eos_token_ids=[5],
                           generator=torch.Generator().manual_seed(0), sampler=sampler)
    with torch.no_grad():
        probs = torch.softmax(model(ids[:1]).logits[0, -1], -1)
    freq = torch.bincount(res["tokens"][:, 0], minlength=6).float() / 2000
    assert (freq - probs).abs().max() < 0.04


def test_inverse_cdf_draws_follow_softmax_and_skip_impossible_tokens():
    from scipy.stats import chisquare

    from ctrlg.hmm.sampling import draw_inverse_cdf

    logits = torch.tensor([[0.0, -float("inf"), 1.0, 2.0, -float("inf"), -1.0]]).repeat(20000, 1)
    drawn, logp = draw_inverse_cdf(logits, torch.Generator().manual_seed(0))
    probs = torch.softmax(logits[0], -1)
    counts = torch.bincount(drawn, minlength=6)
    assert counts[1] == 0 and counts[4] == 0
    keep = probs > 0
    expected = probs[keep].double() / probs[keep].double().sum() * 20000
    assert chisquare(counts[keep].double().numpy(), expected.numpy()).pvalue > 1e-3
    torch.testing.assert_close(logp, probs.log()[drawn])
    with pytest.raises(CtrlgError, match="sampler must be one of"):
        sample_sequences(None, torch.ones(1, 1, dtype=torch.long), torch.ones(1, 1), 1, eos_token_ids=[0],
                         generator=torch.Generator(), sampler="top_k")


def test_sample_to_disk_is_chunked_seeded_and_resumable(tiny_lm, tmp_path):
    model, tokenizer, _ = tiny_lm
    prompts = [f"w10 w11 w{i} w{i + 1}" for i in range(3, 30)]
    kwargs = dict(length=6, chunk_size=4, batch_size=3, seed=5)
    sample_to_disk(model, tokenizer, prompts, tmp_path / "a", num_sequences=10, **kwargs)
    sample_to_disk(model, tokenizer, prompts, tmp_path / "b", num_sequences=4, **kwargs)
    sample_to_disk(model, tokenizer, prompts, tmp_path / "b", num_sequences=10, **kwargs)  # resume
    sample_to_disk(model, tokenizer, prompts, tmp_path / "w", num_sequences=10, workers=2, **kwargs)
    sample_to_disk(model, tokenizer, prompts, tmp_path / "s", num_sequences=10, shard=(1, 2), **kwargs)
    assert [p.name for p in (tmp_path / "s").glob("chunk_*")] == ["chunk_00001.safetensors"]
    sample_to_disk(model, tokenizer, prompts, tmp_path / "s", num_sequences=10, shard=(0, 2), **kwargs)
    a = load_chunks(tmp_path / "a", ("tokens", "logprob", "hidden", "prompt_index"))
    b = load_chunks(tmp_path / "b", ("tokens", "logprob", "hidden", "prompt_index"))
    for other in ("w", "s"):  # threads or sharded processes make the same chunks
        c = load_chunks(tmp_path / other, ("tokens", "logprob", "hidden", "prompt_index"))
        assert all(torch.equal(a[k], c[k]) for k in a), other
    assert a["tokens"].shape == (10, 6) and a["hidden"].shape == (10, 6, 32)
    assert len(list((tmp_path / "a").glob("chunk_*"))) == 3
    for key in a:
        assert torch.equal(a[key], b[key]), key
    with torch.no_grad():  # spot-check one row against the full forward pass
        row = 7
        prompt = torch.tensor(tokenizer(prompts[int(a["prompt_index"][row])])["input_ids"])
        full_forward_check(model, prompt, a["tokens"][row], a["logprob"][row], a["hidden"][row].float(),
                           hidden_atol=2e-3)  # stored as float16
    with pytest.raises(CtrlgError, match="other settings"):
        sample_to_disk(model, tokenizer, prompts, tmp_path / "a", num_sequences=10,
                       **{**kwargs, "length": 7})
    with pytest.raises(CtrlgError, match="positive"):
        sample_to_disk(model, tokenizer, prompts, tmp_path / "c", num_sequences=0, length=4)


def test_prompt_helpers(tmp_path):
    assert commongen_prompts(["dog frisbee catch", "", "dog  frisbee catch", "a b"]) == [
        "Write a sentence using the words: dog, frisbee, catch.", "Write a sentence using the words: a, b."]
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 3], [1, 2, 5, 6]]) == [1, 2]
    assert shared_prefix([[1, 2], [1, 2]]) == [1]  # every suffix keeps at least one token
    (tmp_path / "p.txt").write_text("a b\n\n c d \n")
    assert read_prompts(tmp_path / "p.txt") == ["a b", "c d"]
    with pytest.raises(CtrlgError, match="does not exist"):
        read_prompts(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(CtrlgError, match="no non-empty lines"):
        read_prompts(tmp_path / "empty.txt")


def _tiny_distill_config(path, tmp_path, num_sequences: int = 24, **sections) -> dict:
    """The distillation config the pipeline tests share (the tiny LM, 30 raw prompts, 5-token
    samples in chunks of 8), with ``sections`` added or replaced."""
    return {
        "seed": 0, "device": "cpu", "threads": 1, "model": {"name": str(path)},
        "prompts": {"list": [f"w{i} w{i + 2}" for i in range(3, 33)], "format": "raw",
                    "heldout_fraction": 0.2},
        "sampling": {"num_sequences": num_sequences, "heldout_sequences": 8, "length": 5,
                     "batch_size": 8, "chunk_size": 8, "dir": str(tmp_path / "samples")},
        **sections,
    }


def test_distill_pipeline_end_to_end(tiny_lm, tmp_path):
    from ctrlg.hmm.distill import distill

    _, tokenizer, path = tiny_lm
    cfg = _tiny_distill_config(
        path, tmp_path, hidden_size=6,
        lvd={"kmeans_iters": 5, "pseudocount": 0.5},
        em={"schedule": [[2, 1], [3, 3]], "num_chunks": 3, "batch_size": 8, "pseudocount": 0.5,
            "emission_prior": "unigram", "keep_best": True},
        head={"inner_size": 8, "epochs": 3, "batch_size": 16, "valid_fraction": 0.25,
              "prefix_lengths": [0, 2]},
        output={"dir": str(tmp_path / "out"), "dtype": "float32"})
    metrics = distill(cfg)
    ll = metrics["heldout_ll_per_token"]
    assert ll["hmm"] == pytest.approx(ll["hmm_as_saved"], abs=1e-5)
    assert ll["lm"] < 0 and ll["unigram"] < 0 and ll["hmm"] < 0
    curve = json.loads((tmp_path / "out" / "curve.json").read_text())
    assert curve["step"] == list(range(6)) and curve["best_step"] == metrics["em_best_step"]
    assert metrics["valid_sequences"] == 4 and metrics["test_sequences"] == 4
    assert (tmp_path / "out" / "curve.png").stat().st_size > 1000
    hmm = HMM.load(tmp_path / "out" / "hmm", tokenizer=tokenizer)
    assert hmm.hidden_size == 6 and hmm.vocab_size == 40 and hmm.config["eos_pad_state"] == 5
    assert hmm.emission[5, EOS] == 1.0
    # the prior head ships with the HMM and its held-out table is recorded
    assert hmm.prior_head is not None and hmm.prior_head.lm_hidden_size == 32
    assert hmm.prior_head.config["lm_name"] == str(path)
    table = metrics["head"]["prefix_table"]
    assert [row["prefix_length"] for row in table][0] == 0
    assert table[0]["per_token"]["hmm"] == pytest.approx(ll["hmm_as_saved"], abs=1e-4)
    assert set(table[0]["per_token"]) == {"unigram", "lm", "hmm", "hmm_head"}


def test_head_only_pipeline_keeps_the_base_hmm_and_saves_a_head_apart(tiny_lm, tmp_path):
    """base_hmm: no LVD or EM; the head is trained against the given HMM, saved in its own folder,
    and attaches only to that HMM (its save_id), with the prefix table measured against it."""
    from ctrlg.errors import CheckpointError
    from ctrlg.hmm.distill import distill
    from ctrlg.hmm.em import heldout_ll_per_token
    from ctrlg.vocab import tokenizer_fingerprint
    from helpers import random_hmm

    _, tokenizer, path = tiny_lm
    base = random_hmm(5, 40, seed=3)
    base.config.update(tokenizer_hash=tokenizer_fingerprint(tokenizer))
    base.save(tmp_path / "base")
    base = HMM.load(tmp_path / "base")
    cfg = _tiny_distill_config(
        path, tmp_path, num_sequences=16, base_hmm=str(tmp_path / "base"),
        head={"inner_size": 8, "epochs": 2, "batch_size": 16, "valid_fraction": 0.25,
              "prefix_lengths": [0, 2]},
        output={"dir": str(tmp_path / "out"), "copy_to": str(tmp_path / "asset")})
    metrics = distill(cfg)
    assert metrics["hmm_save_id"] == base.config["save_id"] and metrics["train_sequences"] == 16
    test_tokens = torch.cat([load_chunks(tmp_path / "samples" / "heldout", ("tokens",))["tokens"]])[4:]
    assert metrics["heldout_ll_per_token"]["hmm"] == pytest.approx(
        heldout_ll_per_token(base, test_tokens), abs=1e-6)
    assert not (tmp_path / "out" / "hmm").exists()          # the HMM is not re-saved
    again = HMM.load(tmp_path / "base")
    assert again.prior_head is None
    head = again.attach_prior_head(tmp_path / "asset", tokenizer=tokenizer)
    assert again.prior_head is head and head.lm_hidden_size == 32 and head.hidden_size == 5
    assert head.config["lm_name"] == str(path)
    table = metrics["head"]["prefix_table"]
    assert table[0]["per_token"]["hmm"] == pytest.approx(metrics["heldout_ll_per_token"]["hmm"], abs=1e-4)
    other = random_hmm(5, 40, seed=4)
    other.save(tmp_path / "other")
    with pytest.raises(CheckpointError, match="save_id"):
        HMM.load(tmp_path / "other").attach_prior_head(tmp_path / "out" / "prior_head")


def test_warm_started_pipeline_starts_em_from_init_hmm_and_keeps_its_size(tiny_lm, tmp_path):
    """init_hmm: no LVD; the curve's first point is the given HMM's validation LL, EM's kept step
    is no worse than it, and the saved HMM keeps the given HMM's hidden size (not hidden_size)."""
    from ctrlg.hmm.distill import distill
    from ctrlg.hmm.em import heldout_ll_per_token
    from ctrlg.vocab import tokenizer_fingerprint
    from helpers import random_hmm

    _, tokenizer, path = tiny_lm
    base = random_hmm(5, 40, seed=3)
    emission = base.emission.clone()
    emission[4] = 0
    emission[4, EOS] = 1                                        # the padding state
    base = HMM.from_params(base.initial, base.transition, emission,
                           config={"tokenizer_hash": tokenizer_fingerprint(tokenizer)})
    base.save(tmp_path / "base")
    cfg = _tiny_distill_config(
        path, tmp_path, hidden_size=9, init_hmm=str(tmp_path / "base"),
        em={"schedule": [[3, 3]], "num_chunks": 3, "batch_size": 8, "pseudocount": 0.5,
            "emission_prior": "unigram", "keep_best": True},
        head={"enabled": False}, output={"dir": str(tmp_path / "out"), "dtype": "float32"})
    metrics = distill(cfg)
    heldout = load_chunks(tmp_path / "samples" / "heldout", ("tokens",))["tokens"]
    ll = metrics["heldout_ll_per_token"]
    assert ll["hmm_lvd_init"] == pytest.approx(heldout_ll_per_token(base, heldout[4:]), abs=1e-6)
    curve = json.loads((tmp_path / "out" / "curve.json").read_text())
    assert curve["heldout_ll"][0] == pytest.approx(heldout_ll_per_token(base, heldout[:4]), abs=1e-6)
    assert max(curve["heldout_ll"]) == curve["heldout_ll"][curve["best_step"]]
    saved = HMM.load(tmp_path / "out" / "hmm", tokenizer=tokenizer)
    assert saved.hidden_size == 5 and saved.config["init_hmm"] == str(tmp_path / "base")
    assert saved.config["eos_pad_state"] == 4 and saved.emission[4, EOS] == 1.0   # kept by EM
    assert not torch.equal(saved.transition, base.transition) or curve["best_step"] == 0


def test_distill_config_drives_the_pipeline(tiny_lm, tmp_path):
    """configs/distill.yaml (the Hydra config of `python -m experiments.distill`) with overrides."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from ctrlg.hmm.distill import distill

    configs = Path(__file__).resolve().parents[1] / "configs"
    prompts = "[" + ",".join(f"'w{i} w{i + 1}'" for i in range(3, 30)) + "]"
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        cfg = compose(config_name="distill", overrides=[
            f"model.name={tiny_lm[2]}", f"prompts.list={prompts}", "prompts.format=raw",
            "prompts.heldout_fraction=0.2", "sampling.num_sequences=16", "sampling.heldout_sequences=4",
            "sampling.length=4", "sampling.batch_size=8", "sampling.chunk_size=8",
            f"sampling.dir={tmp_path / 'samples'}", "hidden_size=4", "em.schedule=[[2,2]]",
            "em.num_chunks=2", "em.pseudocount=1.0", "lvd.kmeans_iters=3", f"output.dir={tmp_path / 'out'}",
            "head.epochs=2", "head.inner_size=4", "head.valid_fraction=0.25", "head.prefix_lengths=[0,2]",
            f"output.copy_to={tmp_path / 'asset'}"])
    assert cfg.em.emission_prior == "unigram" and cfg.em.keep_best
    metrics = distill(OmegaConf.to_container(cfg, resolve=True))
    assert metrics["train_sequences"] == 16 and metrics["hidden_size"] == 4
    saved = HMM.load(tmp_path / "asset", tokenizer=tiny_lm[1])
    assert saved.config["training"]["sampling"]["length"] == 4


def _reference_inverse_cdf(logits, generator):
    """The previous implementation of draw_inverse_cdf, kept as the reference."""
    lse = torch.logsumexp(logits, -1, keepdim=True)
    cdf = torch.cumsum((logits - lse).exp_(), -1)
    u = torch.rand(logits.shape[0], 1, generator=generator)
    drawn = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)[:, 0].clamp_max_(logits.shape[1] - 1)
    return drawn, (logits.gather(1, drawn[:, None]) - lse)[:, 0]


def test_inverse_cdf_with_reused_buffers_equals_the_reference_bit_for_bit():
    from ctrlg.hmm.sampling import DrawBuffers, draw_inverse_cdf

    g = torch.Generator().manual_seed(0)
    work = DrawBuffers()
    for rows in (7, 3, 7, 1):  # fewer rows than the buffers hold reuse their first rows
        logits = torch.randn(rows, 997, generator=g) * 4
        logits[0, ::3] = -float("inf")  # impossible tokens
        got = draw_inverse_cdf(logits, torch.Generator().manual_seed(rows), work)
        want = _reference_inverse_cdf(logits, torch.Generator().manual_seed(rows))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert got[0][0] % 3 != 0


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("use_prefix", [False, True])
def test_preallocated_kv_cache_gives_the_dynamic_caches_samples(tiny_lm, dtype, use_prefix):
    """40 rows finishing at different steps: finished rows stay in the batch (on padding) until
    they are 1/16 of it, so both the lazy and the immediate dropping of rows are exercised. The
    tokens are the same; attention over the buffer's masked columns only adds exact zeros, but a
    matmul over a longer K may round differently (a unit in the last place)."""
    from ctrlg.hmm.grouped_attention import GROUPED_ATTENTION, register

    register()
    model = tiny_lm[0].to(dtype)
    model.set_attn_implementation(GROUPED_ATTENTION)
    try:
        g = torch.Generator().manual_seed(4)
        ids = torch.randint(3, 40, (40, 4), generator=g)
        mask = torch.ones_like(ids)
        mask[::5, :2] = 0
        ids[mask == 0] = 0
        prefix = torch.tensor([20, 21]) if use_prefix else None
        out = {kv: sample_sequences(model, ids, mask, 12, eos_token_ids=[EOS],
                                    generator=torch.Generator().manual_seed(1), return_hidden=True,
                                    prefix_ids=prefix, kv_cache=kv)
               for kv in ("dynamic", "preallocated")}
    finally:
        model.float()
        model.set_attn_implementation("sdpa")
    assert torch.equal(out["dynamic"]["tokens"], out["preallocated"]["tokens"])
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # a few units in the last place
    for key in ("logprob", "hidden"):
        torch.testing.assert_close(out["dynamic"][key], out["preallocated"][key], rtol=tol, atol=tol)
    lengths = (out["dynamic"]["logprob"] != 0).sum(1)
    assert len(set(lengths.tolist())) > 3  # rows finished at many different steps
    with pytest.raises(CtrlgError, match="kv_cache must be one of"):
        sample_sequences(model, ids, mask, 2, eos_token_ids=[EOS], generator=g, kv_cache="static")


def test_preallocated_layer_refuses_to_overflow():
    from ctrlg.hmm.kv_cache import PreallocatedLayer

    layer = PreallocatedLayer.from_states(torch.ones(2, 1, 3, 4), torch.ones(2, 1, 3, 4), capacity=4)
    keys, _ = layer.update(torch.full((2, 1, 1, 4), 2.0), torch.full((2, 1, 1, 4), 2.0))
    assert keys.shape == (2, 1, 4, 4) and layer.get_seq_length() == 4 and keys[0, 0, 3, 0] == 2
    with pytest.raises(CtrlgError, match="holds 4 positions; 5 were asked"):
        layer.update(torch.zeros(2, 1, 1, 4), torch.zeros(2, 1, 1, 4))
    with pytest.raises(CtrlgError, match="capacity 2 is smaller"):
        PreallocatedLayer.from_states(torch.ones(1, 1, 3, 4), torch.ones(1, 1, 3, 4), capacity=2)


def test_distill_keeps_topk_rows_within_the_tokens_the_samples_hold(tiny_lm, tmp_path):
    """output.emission_support_min_count: the saved topk8-K rows keep only tokens the training
    samples hold at least m times (EOS always), and the checkpoint records the support's size."""
    from safetensors.torch import load_file

    from ctrlg.hmm.distill import distill

    _, tokenizer, path = tiny_lm
    cfg = _tiny_distill_config(
        path, tmp_path, hidden_size=4,
        lvd={"kmeans_iters": 3, "pseudocount": 0.5},
        em={"schedule": [[1, 3]], "num_chunks": 3, "batch_size": 8, "pseudocount": 0.5,
            "emission_prior": "unigram", "keep_best": True},
        head={"enabled": False},
        output={"dir": str(tmp_path / "out"), "dtype": "float32", "emission_quantization": "topk8-3",
                "emission_support_min_count": 2})
    distill(cfg)
    train = load_chunks(tmp_path / "samples" / "train", ("tokens",))["tokens"]
    counts = torch.bincount(train.flatten().long(), minlength=40)
    support = {v for v in range(40) if counts[v] >= 2} | {EOS}
    saved = HMM.load(tmp_path / "out" / "hmm", tokenizer=tokenizer)
    assert saved.config["emission_support_size"] == len(support)
    kept = load_file(str(tmp_path / "out" / "hmm" / "model.safetensors"))["emission_topk_index"].long()
    assert set((kept & 0xFFFF).flatten().tolist()) <= support


@pytest.mark.parametrize("quantization", [None, "log8"])
def test_a_support_without_topk_storage_is_refused_before_sampling(tmp_path, quantization):
    from ctrlg.hmm.distill import distill

    cfg = _tiny_distill_config(tmp_path / "no-such-lm", tmp_path,
                               output={"dir": str(tmp_path / "out"), "emission_quantization": quantization,
                                       "emission_support_min_count": 2})
    with pytest.raises(CtrlgError, match="emission_support_min_count needs output.emission_quantization"):
        distill(cfg)
    assert not (tmp_path / "samples").exists()
