"""The CommonGen rerank's length exponent: the pick against brute force, re-picking a run's saved
candidates equal to decoding with that exponent, the sentence-BLEU oracle, and the errors."""

import itertools
import json

import pytest
from omegaconf import OmegaConf

from ctrlg import metrics
from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks.commongen.methods import generation_settings
from ctrlg.tasks.commongen.repick import repick_run, returned_beams_only, sweep
from ctrlg.tasks.commongen.rerank import (_output, lm_rule, mbr_rule, oracle_pick, pick_candidate,
                                          rerank_score)
from experiments.merge_runs import merge_runs
from test_experiments import compose, tiny_hmm_dir, tiny_lm_dir  # noqa: F401 (fixtures)


def read_records(folder):
    return [json.loads(line) for line in (folder / "generations.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("exponent", [0.0, 0.5, 1.0, 2.0])
def test_pick_is_the_best_score_among_the_satisfying_candidates(exponent):
    """Every assignment of accepted flags over four candidates, against an explicit search."""
    scores, lengths = [-10.0, -12.0, -6.0, -15.0], [5, 10, 2, 20]
    for accepted in itertools.product([False, True], repeat=4):
        pool = [i for i in range(4) if accepted[i]] or list(range(4))
        values = {i: scores[i] / lengths[i] ** exponent for i in pool}
        expected = min(i for i in pool if values[i] == max(values.values()))
        assert pick_candidate(scores, lengths, list(accepted), exponent) == expected
    assert rerank_score(-12.0, 4, 0.0) == -12.0 and rerank_score(-12.0, 4, 1.0) == -3.0


def test_the_exponent_decides_between_a_short_and_a_long_candidate():
    # summed: the short one (-6 > -12); per token: the long one (-12/12 = -1 > -6/3 = -2)
    assert pick_candidate([-6.0, -12.0], [3, 12], [True, True], 0.0) == 0
    assert pick_candidate([-6.0, -12.0], [3, 12], [True, True], 1.0) == 1


# the paper's rule (the highest summed log p_lm), which the adapted pipeline's default replaces
# with p = 0.2 and a judge: the tests of the rerank's mechanics start from it
PAPER_RULE = ("rerank_length_penalty=0", "judge.weight=0")


def test_the_adapted_pipeline_reranks_with_the_supervised_judge_by_default():
    from ctrlg.tasks.commongen.rerank import rerank_rule

    cfg = compose("commongen", [])
    assert rerank_rule(cfg) == {"rerank": "lm_loglik", "length_penalty": 0.2, "judge_weight": 0.5,
                                "judge_top_k": 32}
    assert cfg.judge.adapter == "commongen-supervised" and cfg.judge.model is None
    assert rerank_rule(compose("commongen", list(PAPER_RULE))) == {"rerank": "lm_loglik",
                                                                  "length_penalty": 0.0}


def test_a_zero_exponent_keeps_the_settings_of_runs_from_before_it():
    """resume=true compares settings: a run saved without the key equals p = 0, not p = 0.5."""
    base = compose("commongen", list(PAPER_RULE))
    assert "rerank_length_penalty" not in generation_settings(base) and "judge" not in generation_settings(base)
    assert generation_settings(base) == generation_settings(compose("commongen", [*PAPER_RULE, "rerank_length_penalty=0.0"]))
    assert generation_settings(compose("commongen", ["judge.weight=0", "rerank_length_penalty=0.5"]))["rerank_length_penalty"] == 0.5


def _adapted(lm_dir, hmm_dir, *extra):
    return compose("commongen", ["pipeline=adapted", f"model.name={lm_dir}", "model.adapter=null",
                                 f"hmm.path={hmm_dir}", "data.limit=4", "batch_size=2",
                                 "generation.num_beams=4", "generation.max_new_tokens=12",
                                 "metrics.meteor=false", "bootstrap.resamples=0",
                                 "methods=[logical,ctrlg]", "save_candidates=true",
                                 *PAPER_RULE, *extra])


def test_re_picking_saved_candidates_equals_decoding_with_the_exponent(tiny_lm_dir, tiny_hmm_dir, tmp_path):
    from experiments import commongen

    summed, per_token = tmp_path / "summed", tmp_path / "per_token"
    commongen.run(_adapted(tiny_lm_dir, tiny_hmm_dir), summed)
    commongen.run(_adapted(tiny_lm_dir, tiny_hmm_dir, "rerank_length_penalty=1.0"), per_token)
    decoded = read_records(per_token)
    for record in read_records(summed):   # the kept output is the best summed candidate
        for method in ("logical", "ctrlg"):
            candidates = record[method]["candidates"]   # 4 beams, + 8 where ctrlg widened
            assert len(candidates) == (4 + 8 if record[method].get("widened") else 4)
            best = max(c["log_likelihood"] for c in candidates if c["accepted"])
            assert record[method]["log_likelihood"] == best
    repicked = read_records(repick_run(summed, tmp_path / "repicked", 1.0))
    assert [r["index"] for r in repicked] == [r["index"] for r in decoded]
    for mine, theirs in zip(repicked, decoded):
        for method in ("logical", "ctrlg"):
            want = {k: v for k, v in theirs[method].items() if k != "candidates"}
            assert mine[method] == want
    config = OmegaConf.load(tmp_path / "repicked" / "config.yaml")
    assert config.rerank_length_penalty == 1.0 and not config.save_candidates
    # a re-picked run and a run decoded with the same exponent merge; other exponents are refused
    merge_runs(tmp_path / "merged", [tmp_path / "repicked", per_token], ["ctrlg"])
    with pytest.raises(ExperimentConfigError, match="rerank_length_penalty"):
        merge_runs(tmp_path / "refused", [summed, per_token])


def test_re_picking_by_mbr_equals_decoding_with_mbr(tiny_lm_dir, tiny_hmm_dir, tmp_path):
    from experiments import commongen

    summed, mbr = tmp_path / "summed", tmp_path / "mbr"
    commongen.run(_adapted(tiny_lm_dir, tiny_hmm_dir), summed)
    commongen.run(_adapted(tiny_lm_dir, tiny_hmm_dir, "rerank=mbr", "mbr_temperature=2.0"), mbr)
    repicked = read_records(repick_run(summed, tmp_path / "repicked", mbr_rule(2.0)))
    for mine, theirs in zip(repicked, read_records(mbr), strict=True):
        for method in ("logical", "ctrlg"):
            assert mine[method] == {k: v for k, v in theirs[method].items() if k != "candidates"}
    config = OmegaConf.load(tmp_path / "repicked" / "config.yaml")
    assert config.rerank == "mbr" and config.mbr_temperature == 2.0
    merge_runs(tmp_path / "merged", [tmp_path / "repicked", mbr], ["ctrlg"])
    with pytest.raises(ExperimentConfigError, match="mbr_temperature"):
        merge_runs(tmp_path / "refused", [tmp_path / "repicked",
                                         repick_run(summed, tmp_path / "cold", mbr_rule(0.5))])


def test_an_unknown_rerank_fails_before_the_lm_is_loaded(tmp_path):
    from experiments import commongen

    for override, named in (("rerank=best", "rerank must be one of"),
                            ("mbr_temperature=0", "mbr_temperature must be > 0")):
        cfg = compose("commongen", ["model.name=/nonexistent/lm", "rerank=mbr", "judge.weight=0", override])
        with pytest.raises(ExperimentConfigError, match=named):
            commongen.run(cfg, tmp_path)


def _candidate_run(folder, items):
    folder.mkdir()
    OmegaConf.save(OmegaConf.create({"methods": ["ctrlg"], "method_specs": {"ctrlg": {"guide": "ctrlg"}}}),
                   folder / "config.yaml")
    with open(folder / "generations.jsonl", "w") as handle:
        for index, (references, candidates) in enumerate(items):
            output = {"text": candidates[0]["text"], "candidates": candidates}
            handle.write(json.dumps({"index": index, "concepts": ["dog"], "references": references,
                                     "ctrlg": output}) + "\n")
    return folder


def _candidate(text, log_likelihood, accepted=True):
    return {"text": text, "log_likelihood": log_likelihood, "tokens": len(text.split()) + 1,
            "accepted": accepted}


def test_oracle_is_the_best_sentence_bleu_among_the_satisfying_candidates():
    references = ["a dog runs across the green field", "the dog is running in a field"]
    candidates = [_candidate("dog", -1.0), _candidate("a dog runs across the field", -9.0),
                  _candidate("a dog runs across the green field", -20.0, accepted=False),
                  _candidate("the dog runs in a field", -8.0)]
    sentence = [metrics.bleu4([c["text"]], [references]) for c in candidates]
    expected = max((i for i in range(4) if candidates[i]["accepted"]), key=lambda i: sentence[i])
    assert oracle_pick(candidates, references) == expected == 1


def test_sweep_scores_each_exponent_and_the_oracle(tmp_path):
    references = ["a dog runs across the green field", "the dog is running in a field"]
    items = [(references, [_candidate("dog runs", -2.0),
                           _candidate("a dog runs across the green park", -4.0)])] * 3
    run = _candidate_run(tmp_path / "run", items)
    result = sweep(run, [lm_rule(0.0), lm_rule(1.0), mbr_rule(1.0)], [(0, 3)])["0:3"]["methods"]["ctrlg"]
    short = metrics.evaluate_generations(["dog runs"] * 3, [references] * 3, with_meteor=False)
    long = metrics.evaluate_generations(["a dog runs across the green park"] * 3, [references] * 3,
                                        with_meteor=False)
    assert result["p=0"]["bleu4"] == pytest.approx(short["bleu4"]) and result["p=0"]["words"] == 2
    # summed: -2 > -4 keeps the short one; per token: -4/8 > -2/3 the long one
    assert result["p=1"]["bleu4"] == pytest.approx(long["bleu4"]) and result["p=1"]["words"] == 7
    assert result["p=1"]["rouge_l"] == pytest.approx(long["rouge_l"]) and long["rouge_l"] > short["rouge_l"]
    assert result["oracle"]["bleu4"] == pytest.approx(long["bleu4"])
    assert set(result) == {"p=0", "p=1", "mbr T=1", "oracle"}


def test_the_beams_pool_leaves_the_ended_hypotheses_out(tmp_path):
    """pool="beams" re-picks a ``candidate_pool=ended`` run among its returned beams alone (the
    candidates not marked ``ended``), in the sweep, its oracle and ``repick_run``; the default
    keeps every candidate; another pool name is refused."""
    references = ["a dog runs across the green field"]
    ended = {**_candidate("a dog runs across the green field", -1.0), "ended": True}
    items = [(references, [_candidate("dog runs", -2.0), ended])] * 2
    run = _candidate_run(tmp_path / "run", items)
    every = sweep(run, [lm_rule(0.0)], [(0, 2)])["0:2"]["methods"]["ctrlg"]
    beams = sweep(run, [lm_rule(0.0)], [(0, 2)], pool="beams")["0:2"]["methods"]["ctrlg"]
    assert every["p=0"]["words"] == 7 and every["oracle"]["words"] == 7
    assert beams["p=0"]["words"] == 2 and beams["oracle"]["words"] == 2
    out = repick_run(run, tmp_path / "out", 0.0, pool="beams")
    assert [r["ctrlg"]["text"] for r in read_records(out)] == ["dog runs"] * 2
    assert OmegaConf.load(out / "config.yaml").generation.candidate_pool == "beams"
    assert returned_beams_only(read_records(run)[0])["ctrlg"]["candidates"] == [items[0][1][0]]
    with pytest.raises(ExperimentConfigError, match="pool"):
        sweep(run, [lm_rule(0.0)], [(0, 2)], pool="all")


def test_a_run_without_candidates_is_refused_by_name(tmp_path):
    run = _candidate_run(tmp_path / "run", [(["a dog"], [_candidate("dog", -1.0)])])
    records = read_records(run)
    del records[0]["ctrlg"]["candidates"]
    (run / "generations.jsonl").write_text(json.dumps(records[0]) + "\n")
    with pytest.raises(ExperimentConfigError, match="save_candidates=true"):
        repick_run(run, tmp_path / "out", 0.5)
    with pytest.raises(ExperimentConfigError, match="did not decode"):
        repick_run(run, tmp_path / "out", 0.5, ["logical"])


def test_keep_as_pairs_the_new_rule_with_the_decoded_pick_on_the_same_items(tmp_path):
    """--keep-as NAME: the re-picked method and the run's own pick side by side, and
    commongen_report's paired interval of the two equals the difference of their scores."""
    from experiments.commongen_report import report_ranges

    references = ["a dog runs across the green field", "the dog is running in a field"]
    items = [(references, [_candidate("dog runs", -2.0),
                           _candidate("a dog runs across the green field", -4.0)]),
             (references, [_candidate("the dog runs in a field", -3.0),
                           _candidate("dog", -1.0, accepted=False)])]
    run = tmp_path / "run"
    run.mkdir()
    cfg = compose("commongen", ["bootstrap.resamples=50", "metrics.meteor=false", "methods=[ctrlg]",
                                *PAPER_RULE])
    OmegaConf.save(cfg, run / "config.yaml")
    with open(run / "generations.jsonl", "w") as handle:   # as decoded: the summed pick kept
        for index, (refs, candidates) in enumerate(items):
            best = pick_candidate([c["log_likelihood"] for c in candidates],
                                  [c["tokens"] for c in candidates],
                                  [c["accepted"] for c in candidates], 0.0)
            output = {**_output(candidates, best), "candidates": candidates}
            handle.write(json.dumps({"index": index, "concepts": ["dog"], "references": refs,
                                     "keyword_groups": [["dog"]], "seconds": {"ctrlg": 1.0},
                                     "ctrlg": output}) + "\n")
    out = repick_run(run, tmp_path / "out", 1.0, keep_as="ctrlg_sum")
    rows = read_records(out)
    assert [r["ctrlg_sum"]["text"] for r in rows] == ["dog runs", "the dog runs in a field"]
    assert [r["ctrlg"]["text"] for r in rows] == ["a dog runs across the green field",
                                                  "the dog runs in a field"]
    saved = OmegaConf.load(out / "config.yaml")
    assert list(saved.methods) == ["ctrlg_sum", "ctrlg"]
    assert dict(saved.differing_settings.rerank) == {"ctrlg": "p=1", "ctrlg_sum": "p=0"}
    result = report_ranges(out, [(0, 2)], baseline="ctrlg_sum")["0:2"]
    gap = result["methods"]["ctrlg"]["bleu4"] - result["methods"]["ctrlg_sum"]["bleu4"]
    assert gap > 0
    interval = result["intervals"]["ctrlg"]["bleu4"]
    assert interval["delta"] == pytest.approx(gap) and interval["low"] <= gap <= interval["high"]
    with pytest.raises(ExperimentConfigError, match="keep_as"):
        repick_run(run, tmp_path / "again", 1.0, keep_as="ctrlg")


def test_an_unguided_beam_search_decodes_each_distinct_prompt_once(tiny_lm_dir, tiny_hmm_dir,
                                                                    tmp_path, monkeypatch):
    """With the BOS-only prompt the unconstrained LM's beams do not depend on the item: the run
    decodes them once and each item judges the same beams by its own constraint."""
    from ctrlg.tasks.commongen import decoding
    from experiments import commongen

    calls = []
    decode = decoding.decode_candidates

    def counted(spec, model, tokenizer, prompts, constraints, *rest, **kw):
        found = decode(spec, model, tokenizer, prompts, constraints, *rest, **kw)
        calls.append((spec["guide"], [list(p) for p in prompts], list(constraints), found))
        return found

    monkeypatch.setattr(decoding, "decode_candidates", counted)
    cfg = _adapted(tiny_lm_dir, tiny_hmm_dir, "methods=[unconstrained,logical]", "batch_size=1")
    commongen.run(cfg, tmp_path / "run")
    unguided = [c for c in calls if c[0] == "none"]
    masked = [c for c in calls if c[0] == "logical"]
    assert len(unguided) == 1 and len(masked) == 4
    ((samples, scores),) = unguided[0][3]
    records = read_records(tmp_path / "run")
    assert len(records) == 4
    for record, (_, prompts, (constraint,), _) in zip(records, masked, strict=True):
        assert prompts == unguided[0][1]          # every item has the same (BOS) prompt
        candidates = record["unconstrained"]["candidates"]
        assert [c["tokens"] for c in candidates] == [len(s) for s in samples]
        assert [c["log_likelihood"] for c in candidates] == scores
        assert [c["accepted"] for c in candidates] == [constraint.accepts(s) for s in samples]
    # sampling is seeded per batch, so a sampled method is never memoised
    assert not decoding.prompt_determines_output({"guide": "none"},
                                                  compose("commongen", ["generation.num_beams=1"]))


class _CountingJudge:
    """A stand-in for ctrlg.lm.judge.Judge: a text's verdict is minus its length; counts the
    batched calls and the texts that reach the per-item path unscored."""

    def __init__(self):
        from types import SimpleNamespace

        self.tokenizer = SimpleNamespace(apply_chat_template=None)
        self.memo, self.batched_calls, self.unscored = {}, 0, 0

    def score_many(self, requests):
        self.batched_calls += 1
        for prompt, texts in requests:
            self.memo.update({(tuple(prompt), t): -float(len(t)) for t in texts})
        return [[self.memo[(tuple(p), t)] for t in texts] for p, texts in requests]

    def score(self, prompt, texts):
        self.unscored += sum((tuple(prompt), t) not in self.memo for t in texts)
        return [-float(len(t)) for t in texts]


def test_re_picking_with_a_judge_scores_ten_items_per_judge_call(tmp_path, monkeypatch):
    """repick_run and sweep score every shortlisted candidate before picking, ten records per
    batched judge call (as decoding scores a batch), and pick what the judge's verdicts say."""
    from ctrlg.tasks.commongen import rerank, repick

    monkeypatch.setattr(rerank, "judge_prompt_ids", lambda concepts, tokenizer, cfg: [0, 1])
    references = ["a dog runs"]
    items = [(references, [_candidate("a dog runs in the big park", -2.0),
                           _candidate(f"dog runs {i}", -3.0), _candidate("dogs", -9.0, accepted=False)])
             for i in range(23)]
    run = _candidate_run(tmp_path / "run", items)
    judge = _CountingJudge()
    rule = lm_rule(0.0, judge_weight=1.0, judge_top_k=2)
    out = repick.repick_run(run, tmp_path / "out", rule, judge=judge, judge_cfg={"weight": 1.0})
    assert judge.batched_calls == 3 and judge.unscored == 0          # 23 items, 10 per call
    picked = [json.loads(line)["ctrlg"]["text"] for line in (out / "generations.jsonl").read_text().splitlines()]
    assert picked == [f"dog runs {i}" for i in range(23)]               # −3 − 10 beats −2 − 26
    judge = _CountingJudge()
    repick.sweep(run, [rule, lm_rule(0.5, judge_weight=2.0, judge_top_k=1)], [(0, 23)], judge=judge,
                 judge_cfg={"weight": 1.0}, oracle=False)
    assert judge.batched_calls == 3 and judge.unscored == 0
