"""The stages of the distillation pipeline (ctrlg.hmm.distill) on hand-made data, checked against
brute force; the pipeline end to end is tested with a tiny LM in test_hmm_sampling.py."""

import itertools
import math
import os

import pytest
import torch
from safetensors.torch import save_file

from ctrlg.data._files import bundled_path
from ctrlg.errors import CtrlgError
from ctrlg.hmm import distill
from ctrlg.hmm.em import EMHistory
from ctrlg.hmm.sampling import read_prompts
from helpers import random_hmm


def brute_force_log_prob(hmm, row) -> float:
    """log Σ over every hidden path z of π_z1 B_z1,x1 Π_t A_z(t-1),z(t) B_z(t),x(t)."""
    pi, A, B = hmm.initial.double(), hmm.transition.double(), hmm.emission.double()
    total = 0.0
    for path in itertools.product(range(hmm.hidden_size), repeat=len(row)):
        p = pi[path[0]] * B[path[0], row[0]]
        for prev, z, x in zip(path, path[1:], row[1:]):
            p = p * A[prev, z] * B[z, x]
        total += float(p)
    return math.log(total)


def test_split_prompts_holds_out_the_last_fraction():
    prompts = [f"p{i}" for i in range(20)]
    train, heldout = distill._split_prompts({"prompts": {"heldout_fraction": 0.2}}, prompts)
    assert train == prompts[:16] and heldout == prompts[16:]
    # at least one prompt is held out, whatever the fraction
    assert distill._split_prompts({"prompts": {"heldout_fraction": 0.0}}, prompts)[1] == ["p19"]
    with pytest.raises(CtrlgError, match="1 prompts are too few to hold out 1"):
        distill._split_prompts({}, ["only"])
    # unconditional sampling: the BOS prompt serves both sets (held-out samples use another seed)
    assert distill._split_prompts({"prompts": {"format": "bos"}}, ["<bos>"]) == (["<bos>"], ["<bos>"])


def _write_chunks(folder, arrays: dict, chunk_size: int) -> None:
    folder.mkdir(parents=True)
    n = next(iter(arrays.values())).shape[0]
    for c, start in enumerate(range(0, n, chunk_size)):
        save_file({k: v[start:start + chunk_size].contiguous() for k, v in arrays.items()},
                  str(folder / f"chunk_{c:05d}.safetensors"))


def test_load_samples_reads_the_configured_chunks_and_halves_the_heldout_set(tmp_path):
    g = torch.Generator().manual_seed(0)
    train = {"tokens": torch.randint(0, 9, (10, 3), generator=g, dtype=torch.int32),
             "hidden": torch.randn(10, 3, 2, generator=g)}
    heldout = {"tokens": torch.randint(0, 9, (6, 3), generator=g, dtype=torch.int32),
               "logprob": -torch.rand(6, 3, generator=g), "hidden": torch.randn(6, 3, 2, generator=g),
               "prompt_index": torch.arange(6)}
    _write_chunks(tmp_path / "train", train, 4)
    _write_chunks(tmp_path / "heldout", heldout, 4)
    # 7 training sequences asked for: ceil(7 / 4) = 2 chunks (8 rows) are read, not the third
    cfg = {"sampling": {"chunk_size": 4, "num_sequences": 7, "heldout_sequences": 6}}
    got_train, valid, test = distill._load_samples(cfg, tmp_path)
    assert torch.equal(got_train["tokens"], train["tokens"][:8].long())
    assert torch.equal(got_train["hidden"], train["hidden"][:8])
    assert torch.equal(valid, heldout["tokens"][:3].long())
    assert sorted(test) == ["hidden", "logprob", "prompt_index", "tokens"]
    for key, value in test.items():
        assert torch.equal(value, heldout[key][3:].to(value.dtype))
    cfg["sampling"]["heldout_sequences"] = 1
    _write_chunks(tmp_path / "one" / "heldout", {k: v[:1] for k, v in heldout.items()}, 4)
    _write_chunks(tmp_path / "one" / "train", train, 4)
    with pytest.raises(CtrlgError, match="at least 2"):
        distill._load_samples(cfg, tmp_path / "one")


def test_heldout_metrics_match_brute_force():
    hmm = random_hmm(2, 4, seed=3)
    train = {"tokens": torch.tensor([[0, 1, 1], [3, 3, 0]])}
    test = {"tokens": torch.tensor([[1, 2, 3], [0, 0, 3]]),
            "logprob": torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, 0.0]])}
    valid = torch.tensor([[2, 2, 2]])
    history = EMHistory(best_step=4)
    metrics = distill._heldout_metrics(hmm, -9.0, train, valid, test, 4, 3, 3, history)
    ll = metrics["heldout_ll_per_token"]
    want_hmm = sum(brute_force_log_prob(hmm, row) for row in test["tokens"].tolist()) / 6
    assert ll["hmm"] == pytest.approx(want_hmm, rel=1e-5)
    # add-one unigram of the 6 training tokens: counts 2, 2, 0, 2 → (c + 1) / 10
    unigram = [3 / 10, 3 / 10, 1 / 10, 3 / 10]
    want_unigram = sum(math.log(unigram[t]) for t in [1, 2, 3, 0, 0, 3]) / 6
    assert ll["unigram"] == pytest.approx(want_unigram, rel=1e-6)
    assert ll["lm"] == pytest.approx(-4.0 / 6) and ll["hmm_lvd_init"] == -9.0
    assert metrics["eos_fraction_test"] == pytest.approx(2 / 6)
    assert (metrics["hidden_size"], metrics["vocab_size"], metrics["length"]) == (2, 4, 3)
    assert (metrics["train_sequences"], metrics["valid_sequences"], metrics["test_sequences"]) == (2, 1, 2)
    assert metrics["em_best_step"] == 4


def test_timed_records_the_block_and_sampling_options_read_the_config():
    timings = {}
    with distill._timed(timings, "step_s"):
        sum(range(1000))
    assert list(timings) == ["step_s"] and 0 <= timings["step_s"] < 5
    assert distill._sampling_options({"sampling": {"length": 7, "shard": [1, 4], "workers": 3}}) == dict(
        length=7, chunk_size=256, batch_size=32, sampler="inverse_cdf", shard=(1, 4))
    assert distill._sampling_workers(3) == 3
    cores = len(os.sched_getaffinity(0))
    assert distill._sampling_workers("auto") == distill._sampling_workers(None) == cores  # one per core
    assert distill._sampling_workers("auto", "cuda") == 1  # one accelerator
    assert distill._sampling_workers(2, "cuda") == 2
    for bad in (0, -2, "two", 1.5):
        with pytest.raises(CtrlgError, match="sampling.workers"):
            distill._sampling_workers(bad)


def test_extra_training_texts_are_the_adapted_targets_eos_padded(tmp_path, smollm2_tokenizer):
    tok = smollm2_tokenizer
    path = tmp_path / "targets.txt"
    path.write_text("A dog runs.\n\n  two   spaces here\n" + "word " * 40 + "\n", encoding="utf-8")
    eos = tok.eos_token_id
    out = distill.extra_training_tokens({"em": {"extra_texts": str(path)}}, tok, 8, eos)
    assert out.shape == (3, 8) and out.dtype == torch.long      # the blank line is skipped
    expected = tok(" A dog runs." + tok.eos_token, add_special_tokens=False)["input_ids"]
    assert out[0, :len(expected)].tolist() == expected
    assert (out[0, len(expected):] == eos).all()                # EOS-padded like a sample
    assert tok.decode(out[1][out[1] != eos]) == " two spaces here"   # whitespace as in training
    assert (out[2] != eos).all()                                # cut to the sample length
    limited = distill.extra_training_tokens({"em": {"extra_texts": str(path), "extra_limit": 1}},
                                            tok, 8, eos)
    assert limited.shape == (1, 8)
    assert distill.extra_training_tokens({"em": {}}, tok, 8, eos) is None
    bundled = distill.extra_training_tokens(
        {"em": {"extra_texts": "bundled:commongen.train.tgt.txt", "extra_limit": 2}}, tok, 32, eos)
    assert bundled.shape == (2, 32)
    with pytest.raises(CtrlgError, match="no file at"):
        distill.extra_training_tokens({"em": {"extra_texts": str(tmp_path / "nope")}}, tok, 8, eos)
    human = distill.extra_training_tokens(
        {"em": {"extra_texts": str(path), "extra_select": "sentence_case"}}, tok, 8, eos)
    assert human.tolist() == out[:1].tolist()                   # only "A dog runs."


def test_target_selection_keeps_the_sentence_case_lines_in_order():
    from ctrlg.data.commongen_targets import selected_indices
    lines = ["A man rides a horse.", "actor attends the premiere", "The dog sleeps", "illustration of a cat",
             "\u00c9t\u00e9 in Paris", "3 dogs run"]
    assert selected_indices(lines, "sentence_case") == [0, 2, 4]
    assert selected_indices(lines, "all") == selected_indices(lines, None) == list(range(6))
    with pytest.raises(CtrlgError, match="unknown target selection 'crowd'"):
        selected_indices(lines, "crowd")
    with pytest.raises(CtrlgError, match="keeps none of the 2 lines"):
        selected_indices(["lower", "case"], "sentence_case")
    bundled = read_prompts(bundled_path("commongen.train.tgt.txt"))
    kept = selected_indices(bundled, "sentence_case")
    assert len(kept) == 3302 and all(bundled[i][0].isupper() for i in kept)


def test_balanced_selection_caps_every_concept_against_a_brute_force_count(monkeypatch):
    from collections import Counter

    from ctrlg.data import commongen_targets
    from ctrlg.data.commongen_targets import CONCEPT_CAP, selected_indices
    lines = ["A dog runs.", "a dog sleeps", "A dog eats.", "A cat and a dog.", "A cat sits."]
    concepts = ["dog run", "dog sleep", "dog eat", "cat dog", "cat sit"]
    with monkeypatch.context() as patch:
        patch.setattr(commongen_targets, "CONCEPT_CAP", 2)
        # greedy in file order: "dog" reaches 2 at line 2, so line 3 (cat, dog) is dropped
        assert selected_indices(lines, "sentence_case_balanced", concepts) == [0, 2, 4]
    with pytest.raises(CtrlgError, match="needs one concept line per target"):
        selected_indices(lines, "sentence_case_balanced")
    with pytest.raises(CtrlgError, match="needs one concept line per target"):
        selected_indices(lines, "sentence_case_balanced", concepts[:2])
    targets = read_prompts(bundled_path("commongen.train.tgt.txt"))
    sets = read_prompts(bundled_path("commongen.train.src_alpha.txt"))
    kept = selected_indices(targets, "sentence_case_balanced", sets)
    human = selected_indices(targets, "sentence_case")
    assert len(kept) == 1807 and set(kept) <= set(human) and kept == sorted(kept)
    counts = Counter(w for i in kept for w in sets[i].split())
    assert max(counts.values()) == CONCEPT_CAP
    # maximal: every dropped caption has a concept already at the cap when it was reached
    for i in set(human) - set(kept):
        before = Counter(w for j in kept if j < i for w in sets[j].split())
        assert any(before[w] >= CONCEPT_CAP for w in sets[i].split())


def test_adaptation_texts_keep_concepts_aligned_with_the_selected_targets(tmp_path, smollm2_tokenizer):
    from ctrlg.tasks.commongen.adaptation import training_texts
    targets, concepts = tmp_path / "tgt.txt", tmp_path / "src.txt"
    targets.write_text("actor attends the premiere\nA dog runs in a field.\nThe cat sleeps.\n")
    concepts.write_text("actor premiere\ndog run field\ncat sleep\n")
    cfg = {"form": "supervised", "bos_token": "<|endoftext|>",
           "data": {"targets": str(targets), "concepts": str(concepts), "select": "sentence_case"}}
    prompts, texts = training_texts(cfg, smollm2_tokenizer)
    eos = smollm2_tokenizer.eos_token
    assert texts == [" A dog runs in a field." + eos, " The cat sleeps." + eos]
    assert "dog, run, field" in prompts[0] and "cat, sleep" in prompts[1]
    cfg["data"]["limit"] = 1
    assert len(training_texts(cfg, smollm2_tokenizer)[1]) == 1   # the limit counts selected lines


def test_warm_start_starts_em_from_the_given_hmm_and_checks_it(tmp_path, smollm2_tokenizer):
    from ctrlg.hmm.model import HMM
    tok = smollm2_tokenizer
    V, eos = len(tok), tok.eos_token_id
    generator = torch.Generator().manual_seed(0)
    emission = torch.rand(4, V, generator=generator)
    emission[0] = 0
    emission[0, eos] = 1                                         # the padding state
    hmm = HMM.from_params(torch.rand(4, generator=generator), torch.rand(4, 4, generator=generator),
                          emission, normalize=True)
    hmm.save(tmp_path / "hmm")
    warm = distill._warm_start_hmm(str(tmp_path / "hmm"), tok, V, eos, {"training": {"x": 1}})
    assert torch.equal(warm.transition, hmm.transition) and torch.equal(warm.emission, hmm.emission)
    assert warm.config["init_hmm"] == str(tmp_path / "hmm") and warm.config["training"] == {"x": 1}
    # the padding state is named as LVD names it: EM keeps its rows, the sampler checks the EOS
    assert warm.config["eos_pad_state"] == 0 and warm.config["eos_token_id"] == eos
    with pytest.raises(CtrlgError, match="vocabulary of"):
        distill._warm_start_hmm(str(tmp_path / "hmm"), tok, V + 1, eos, {})
    with pytest.raises(CtrlgError, match="padding token 5"):
        distill._warm_start_hmm(str(tmp_path / "hmm"), tok, V, 5, {})


def test_keyword_prompts_are_the_supervised_adapters_prompts(smollm2_tokenizer):
    """prompts.format=keywords: one prompt per distinct concept line, exactly the supervised
    decoding prompt (BOS + "Concepts: a, b, c.\\nSentence:")."""
    from ctrlg.data.commongen_prompts import prompt_text

    cfg = {"prompts": {"list": ["dog frisbee catch", "  dog  frisbee catch ", "", "field look"],
                       "format": "keywords", "bos_token": "<|endoftext|>"}}
    prompts = distill.build_prompts(cfg, smollm2_tokenizer)
    assert prompts == ["<|endoftext|>Concepts: dog, frisbee, catch.\nSentence:",
                       "<|endoftext|>Concepts: field, look.\nSentence:"]
    assert prompts[1] == prompt_text(["field", "look"], "keywords", smollm2_tokenizer)
    with pytest.raises(CtrlgError, match="'keywords'"):
        distill.build_prompts({"prompts": {"list": ["a"], "format": "markdown"}}, smollm2_tokenizer)


def test_chat_prompts_wrap_each_line_as_the_users_message(smollm2_tokenizer):
    """prompts.format=chat (the JSON HMM's prompts): each distinct line is the user's message
    under the tokenizer's chat template, with the assistant's turn opened."""
    lines = ['Write JSON. {"type": "object"}', 'Write JSON. {"type": "object"}', "Say hi."]
    prompts = distill.build_prompts({"prompts": {"list": lines, "format": "chat"}}, smollm2_tokenizer)
    want = [smollm2_tokenizer.apply_chat_template([{"role": "user", "content": line}], tokenize=False,
                                                   add_generation_prompt=True) for line in lines[1:]]
    assert prompts == want and len(set(prompts)) == 2
    assert all(lines[2] in prompts[1] and p.rstrip().endswith("assistant") for p in prompts[1:])
