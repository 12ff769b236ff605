"""experiments.commongen beyond the smoke tests: configuration errors before anything is loaded,
finished items kept when a run is interrupted, resume, unsatisfiable items skipped and reported,
and the per-row bookkeeping of batched items."""

import json

import pytest
import torch

from ctrlg.errors import ExperimentConfigError
from test_experiments import compose, run_interrupted, tiny_hmm_dir, tiny_lm_dir  # noqa: F401 (fixtures)


def small_overrides(lm_dir, hmm_dir, *extra):
    return ["pipeline=instruct", f"model.name={lm_dir}", f"hmm.path={hmm_dir}", "generation.num_samples=2",
            "generation.max_new_tokens=10", "metrics.meteor=false", "bootstrap.resamples=0",
            "methods=[logical,ctrlg]", *extra]


def read_records(folder):
    return [json.loads(line) for line in (folder / "generations.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("override, named", [
    ("generation.num_samples=0", "generation.num_samples"),
    ("data.limit=0", "data.limit"),
    ("batch_size=0", "batch_size"),
    ("methods=[logical,nonsense]", "nonsense"),
    ("+method_specs.bad={guide: ctrlg, strength: -1}", "strength"),
])
def test_bad_sizes_and_methods_fail_before_the_lm_is_loaded(tmp_path, override, named):
    """A missing model folder would fail later: the configuration error must come first."""
    from experiments import commongen

    extra = ["methods=[logical,bad]"] if "bad=" in override else []
    cfg = compose("commongen", ["model.name=/nonexistent/lm", "hmm.path=/nonexistent/hmm",
                                override, *extra])
    with pytest.raises(ExperimentConfigError, match=named.replace(".", r"\.")):
        commongen.run(cfg, tmp_path)
    assert not (tmp_path / "generations.jsonl").exists()


def test_interrupted_run_keeps_finished_items_and_resume_completes_it(tiny_lm_dir, tiny_hmm_dir,
                                                                      tmp_path):
    from ctrlg.tasks.commongen import pipeline
    from experiments import commongen

    overrides = small_overrides(tiny_lm_dir, tiny_hmm_dir, "data.limit=4", "batch_size=2")
    full = tmp_path / "full"
    commongen.run(compose("commongen", overrides), full)

    runs = tmp_path / "runs"
    run_interrupted(pipeline, "generate_batch", 3,  # the second batch's first method
                    lambda: commongen.run(compose("commongen", overrides),
                                          runs / "2026-01-01_00-00-00"))
    kept = read_records(runs / "2026-01-01_00-00-00")
    assert [r["index"] for r in kept] == [0, 1]  # the first batch survived the interruption

    # resume=true finds the newest earlier run of this configuration next to the new folder
    table = commongen.run(compose("commongen", overrides + ["resume=true"]),
                          runs / "2026-01-02_00-00-00")
    resumed, reference = read_records(runs / "2026-01-02_00-00-00"), read_records(full)
    assert [r["index"] for r in resumed] == [0, 1, 2, 3]
    for got, want in zip(resumed, reference):  # same batches, same seeds: same outputs
        assert [got[m]["text"] for m in ("logical", "ctrlg")] == \
            [want[m]["text"] for m in ("logical", "ctrlg")]
    assert table["ctrlg"]["success"] == 100.0

    # a resume folder made with other settings is refused, naming what differs
    with pytest.raises(ExperimentConfigError, match="generation"):
        commongen.run(compose("commongen", overrides + ["generation.num_samples=3",
                                                        f"resume={full}"]), tmp_path / "x")


def test_a_run_kept_gzip_compressed_is_read_and_resumed_as_it_was(tiny_lm_dir, tiny_hmm_dir,
                                                                   tmp_path):
    """Runs kept in the repository are ``generations.jsonl.gz``: reading and resume see the same
    records as from the plain file."""
    import gzip
    import shutil

    from ctrlg.tasks.commongen import pipeline
    from ctrlg.tasks.records import read_records as read_run, records_path
    from experiments import commongen

    overrides = small_overrides(tiny_lm_dir, tiny_hmm_dir, "data.limit=4", "batch_size=2")
    full = tmp_path / "full"
    commongen.run(compose("commongen", overrides), full)
    part = tmp_path / "part"
    run_interrupted(pipeline, "generate_batch", 3,
                    lambda: commongen.run(compose("commongen", overrides), part))
    plain = part / "generations.jsonl"
    with open(plain, "rb") as src, gzip.open(part / "generations.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    expected = read_records(part)
    plain.unlink()
    assert records_path(part) == part / "generations.jsonl.gz"
    assert read_run(part) == expected and [r["index"] for r in expected] == [0, 1]

    commongen.run(compose("commongen", overrides + [f"resume={part}"]), tmp_path / "resumed")
    resumed, reference = read_records(tmp_path / "resumed"), read_records(full)
    assert [r["index"] for r in resumed] == [0, 1, 2, 3]
    for got, want in zip(resumed, reference):
        assert [got[m]["text"] for m in ("logical", "ctrlg")] == \
            [want[m]["text"] for m in ("logical", "ctrlg")]


def test_unsatisfiable_item_is_reported_and_the_others_go_on(tiny_lm_dir, tiny_hmm_dir, tmp_path,
                                                             capsys):
    from experiments import commongen

    items = tmp_path / "items.jsonl"
    rows = [{"concept_set": "dog_N#cat_N", "scene": ["The dog and the cat."]},
            {"concept_set": "dog_N#cat_N#bird_N#horse_N#cow_N#pig_N", "scene": ["x"]},
            {"concept_set": "sun_N#sky_N", "scene": ["The sun is in the sky."]}]
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = compose("commongen", small_overrides(tiny_lm_dir, tiny_hmm_dir, f"data.path={items}",
                                               "data.limit=3", "constraint.min_words=1",
                                               "generation.max_new_tokens=5"))
    table = commongen.run(cfg, tmp_path / "run")
    err = capsys.readouterr().err
    assert "item 1 (dog, cat, bird, horse, cow, pig): skipped" in err
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["items"] == 2 and [s["index"] for s in saved["skipped"]] == [1]
    assert table["ctrlg"]["success"] == 100.0 and table["logical"]["success"] == 100.0
    assert [r["index"] for r in read_records(tmp_path / "run") if "skipped" not in r] == [0, 2]


def test_head_methods_run_with_per_row_dfas_and_need_a_head(tiny_lm_dir, tiny_hmm_dir, tmp_path):
    """prior=head reads the LM-conditioned prior saved beside the HMM; with one DFA per item in
    a batch every guided output still satisfies its constraint. Without a head: a clear error."""
    from ctrlg import HMM
    from ctrlg.hmm.prior_head import PriorHead
    from experiments import commongen

    hmm = HMM.load(tiny_hmm_dir)
    assert isinstance(hmm.prior_head, PriorHead)
    overrides = small_overrides(tiny_lm_dir, tiny_hmm_dir, "data.limit=2", "batch_size=2",
                                "methods=[ctrlg_head,ctrlg_head_w05,ctrlg]")
    table = commongen.run(compose("commongen", overrides), tmp_path / "run")
    assert all(table[m]["success"] == 100.0 for m in ("ctrlg_head", "ctrlg_head_w05", "ctrlg"))
    hmm.prior_head = None
    without_head = tmp_path / "hmm-without-head"
    hmm.save(without_head)
    for method in ("ctrlg_head", "ctrlg"):  # the recommended method reads the head too
        with pytest.raises(ExperimentConfigError, match="no prior head"):
            commongen.run(compose("commongen", small_overrides(tiny_lm_dir, without_head,
                                                               "data.limit=1",
                                                               f"methods=[{method}]")),
                          tmp_path / f"none-{method}")


def test_prepare_batch_keeps_satisfiable_items_and_reports_the_others(smollm2_tokenizer, capsys):
    """One item's record, constraint and prompt, checked against a hand-written sentence; the
    same item under a 3-token budget is passed to ``keep`` as skipped."""
    from ctrlg.data.commongen import CommonGenExample
    from ctrlg.tasks.commongen import items, pipeline

    tok = smollm2_tokenizer
    eos = [tok.eos_token_id]
    example = CommonGenExample(("dog", "catch"), ("NOUN", "VERB"), ("A dog catches a ball.",), "k")
    cfg = compose("commongen", ["pipeline=instruct", "constraint.min_words=3",
                                "constraint.max_words=8"])
    kept = []
    (ready,) = pipeline.prepare_batch([(7, example)], cfg, tok, len(tok), eos, kept.append)
    record, constraint, prompt = ready
    assert kept == [] and record["index"] == 7 and record["seconds"] == {}
    assert record["keyword_groups"] == items.keyword_groups(example, cfg.constraint)
    assert record["dfa_states"] == constraint.num_states
    assert prompt == items.prompt_ids(example, tok, cfg.model)
    ids = lambda text: tok.encode(text, add_special_tokens=False) + eos  # noqa: E731
    assert constraint.accepts(ids("The dog caught the ball."))
    assert not constraint.accepts(ids("The dog ran."))                      # no form of "catch"
    assert not constraint.accepts(ids("The dog caught the ball on a sunny day."))  # 9 words
    cfg.generation.max_new_tokens = 3
    assert pipeline.prepare_batch([(7, example)], cfg, tok, len(tok), eos, kept.append) == []
    assert len(kept) == 1 and "max_new_tokens=3" in kept[0]["skipped"]
    assert {k: v for k, v in kept[0].items() if k not in ("skipped", "dfa_seconds")} == {
        k: v for k, v in record.items() if k not in ("seconds", "dfa_seconds")}
    assert "item 7 (dog, catch): skipped" in capsys.readouterr().err


def test_prompt_styles_bos_alone_keywords_and_instruction(smollm2_tokenizer):
    """The adapted pipeline prompts with the BOS token alone (the constraint carries the
    concepts), the supervised one with BOS + the concepts, the instruct one with the chat-template
    instruction the instruct HMM was distilled on."""
    from ctrlg.data.commongen import CommonGenExample
    from ctrlg.data.commongen_prompts import commongen_prompts, prompt_text
    from ctrlg.tasks.commongen import items

    tok = smollm2_tokenizer
    example = CommonGenExample(("dog", "catch"), ("NOUN", "VERB"), (), "k")
    adapted = compose("commongen", ["pipeline=adapted"])
    assert adapted.model.prompt_style == "bos" and adapted.model.adapter == "commongen-human-balanced"
    assert adapted.model.dtype == "float32"        # the held-out figures' dtype, on every machine
    assert items.prompt_ids(example, tok, adapted.model) == [tok.convert_tokens_to_ids("<|endoftext|>")]
    supervised = compose("commongen", ["pipeline=supervised"]).model
    assert items.prompt_ids(example, tok, supervised) == tok(
        "<|endoftext|>Concepts: dog, catch.\nSentence:", add_special_tokens=False)["input_ids"]
    assert prompt_text(example.concepts, "keywords", tok).endswith("Concepts: dog, catch.\nSentence:")
    instruct = compose("commongen", ["pipeline=instruct"]).model
    (chat,) = commongen_prompts(["dog catch"], tok)
    assert items.prompt_ids(example, tok, instruct) == tok(chat, add_special_tokens=False)["input_ids"]


def test_adapted_pipeline_runs_beams_from_bos_and_reranks_every_beam(tiny_lm_dir, tiny_hmm_dir, tmp_path):
    """The paper's decoding on a tiny LM: BOS-only prompts, guided beam search with a length
    penalty and no repeated 4-grams, at least 5 new tokens, every beam reranked; the guided
    methods satisfy every constraint and each output is its item's best-scoring accepted beam."""
    from experiments import commongen

    cfg = compose("commongen", ["pipeline=adapted", f"model.name={tiny_lm_dir}", "model.adapter=null",
                                f"hmm.path={tiny_hmm_dir}", "data.limit=2", "batch_size=2",
                                "generation.num_beams=3", "generation.max_new_tokens=12",
                                "metrics.meteor=false", "bootstrap.resamples=0",
                                "methods=[unconstrained,logical,ctrlg_filter]"])
    assert cfg.generation.num_samples == 3 and cfg.generation.length_penalty == 0.2
    table = commongen.run(cfg, tmp_path)
    assert table["logical"]["success"] == 100.0 and table["ctrlg_filter"]["success"] == 100.0
    for record in read_records(tmp_path):
        for method in ("logical", "ctrlg_filter"):
            assert record[method]["accepted"] and record[method]["log_likelihood"] is not None


def test_iterative_widening_keeps_the_best_of_the_narrow_and_the_wide_search(tiny_lm_dir, tiny_hmm_dir,
                                                                            tmp_path):
    """generation.widen_below_loglik: items whose kept beam scores below τ are searched again
    with widen_factor × the beams, and the kept output is the best-scoring accepted candidate of
    both searches; τ above every score widens every ctrlg item (logical never), τ below every
    score changes nothing, and the widened candidates are exactly a separate wide run's."""
    from experiments import commongen

    def run(folder, *extra):
        cfg = compose("commongen", ["pipeline=adapted", f"model.name={tiny_lm_dir}", "model.adapter=null",
                                    f"hmm.path={tiny_hmm_dir}", "data.limit=3", "batch_size=3",
                                    "generation.max_new_tokens=10", "metrics.meteor=false",
                                    "bootstrap.resamples=0", "save_candidates=true",
                                    "methods=[logical,ctrlg]", "rerank_length_penalty=0",
                                    "judge.weight=0", *extra])
        commongen.run(cfg, folder)
        return {r["index"]: r for r in read_records(folder)}

    narrow = run(tmp_path / "narrow", "generation.num_beams=2", "generation.widen_below_loglik=null")
    wide = run(tmp_path / "wide", "generation.num_beams=4", "generation.widen_below_loglik=null")
    every = run(tmp_path / "every", "generation.num_beams=2", "generation.widen_below_loglik=1e9")
    none = run(tmp_path / "none", "generation.num_beams=2", "generation.widen_below_loglik=-1e9")
    for i, record in every.items():
        assert record["ctrlg"]["widened"] and "widened" not in record["logical"]
        assert not none[i]["ctrlg"]["widened"]
        assert none[i]["ctrlg"]["text"] == narrow[i]["ctrlg"]["text"]
        assert record["logical"]["text"] == narrow[i]["logical"]["text"]
        union = narrow[i]["ctrlg"]["candidates"] + wide[i]["ctrlg"]["candidates"]
        got = record["ctrlg"]["candidates"]
        assert [c["text"] for c in got] == [c["text"] for c in union]
        assert [c["log_likelihood"] for c in got] == pytest.approx([c["log_likelihood"] for c in union],
                                                                  abs=1e-4)
        best = max((c for c in union if c["accepted"]), key=lambda c: c["log_likelihood"])
        assert record["ctrlg"]["log_likelihood"] == pytest.approx(best["log_likelihood"], abs=1e-4)
        assert record["ctrlg"]["log_likelihood"] >= narrow[i]["ctrlg"]["log_likelihood"] - 1e-4


class _DigitsTokenizer:
    """Token i spells "t<i> "; EOS = 1 = pad."""
    eos_token_id = pad_token_id = 1

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"t{i} " for i in ids if not (skip_special_tokens and i == 1))


def test_ended_candidate_pool_adds_the_searchs_ended_hypotheses():
    """generation.candidate_pool=ended: each item's candidates are the returned beams (as with
    ``beams``: same order and values), then the accepted hypotheses the search scored ending with
    EOS, marked ``ended``, each token sequence once and each with its LM log-likelihood (a second
    pass); the kept output is the best accepted one of all (the paper's rule here)."""
    from ctrlg import dfa
    from ctrlg.sampler import lm_log_likelihood
    from ctrlg.tasks.commongen.decoding import generate_batch
    from helpers import random_hmm, tiny_llama

    V = 12
    model, hmm = tiny_llama(V, seed=3), random_hmm(4, V, seed=3)
    model.generation_config.eos_token_id = 1
    prompts = [[0, 5], [0]]
    constraints = [dfa.any_phrase([[3]], V), dfa.any_phrase([[4], [6, 7]], V)]
    spec = {"guide": "ctrlg", "prior": "filter", "strength": 1.0}

    def run(pool):
        cfg = compose("commongen", ["pipeline=adapted", "judge.weight=0", "rerank_length_penalty=0",
                                    "generation.num_beams=4", "generation.max_new_tokens=6",
                                    "generation.widen_below_loglik=null", "constraint.min_new_tokens=1",
                                    "save_candidates=true", f"generation.candidate_pool={pool}"])
        return generate_batch(spec, model, _DigitsTokenizer(), prompts, constraints, hmm, cfg, seed=0)

    beams, pooled = run("beams"), run("ended")
    added = 0
    for prompt, kept, got in zip(prompts, beams, pooled):
        n = len(kept["candidates"])
        assert got["candidates"][:n] == kept["candidates"]
        extra = got["candidates"][n:]
        assert all(c["ended"] and c["accepted"] for c in extra)
        assert len({c["text"] for c in got["candidates"]}) == len(got["candidates"])
        tokens = [[int(t[1:]) for t in c["text"].split()] + [1] for c in extra]
        assert [c["log_likelihood"] for c in extra] == pytest.approx(
            lm_log_likelihood(model, prompt, tokens), abs=1e-4)
        best = max(c["log_likelihood"] for c in got["candidates"] if c["accepted"])
        assert got["log_likelihood"] == pytest.approx(best, abs=1e-6)
        added += len(extra)
    assert added > 0
    model.generation_config.repetition_penalty = 1.2    # the search's scores are not the LM's
    with pytest.raises(ExperimentConfigError, match="candidate_pool=ended needs"):
        run("ended")


@pytest.mark.parametrize("override, named", [
    ("generation.candidate_pool=all", "candidate_pool"),
    ("generation.widen_factor=1", "widen_factor"),
    ("generation.widen_below_loglik=nan", "widen_below_loglik"),
    ("rerank=none", "rerank=none"),
    ("generation.candidate_pool=ended generation.widen_below_loglik=null rerank=none judge.weight=0",
     "candidate_pool"),
    ("generation.candidate_pool=ended generation.widen_below_loglik=null generation.num_beams=1",
     "candidate_pool"),
    ("generation.candidate_pool=ended generation.widen_below_loglik=null rerank_pass=full",
     "candidate_pool"),
])
def test_bad_widening_settings_are_named_before_the_lm_is_loaded(tmp_path, override, named):
    from experiments import commongen

    cfg = compose("commongen", ["pipeline=adapted", "model.name=/nonexistent/lm", "data.limit=1",
                                "methods=[ctrlg]", *override.split()])
    with pytest.raises(ExperimentConfigError, match=named):
        commongen.run(cfg, tmp_path)
