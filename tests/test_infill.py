"""experiments.infill: the benchmark's masks, records, resume and bad input, on a tiny random LM."""

import json

import numpy as np
import torch
import pytest

from ctrlg.data import DatasetError
from ctrlg.data.infill_mask import mask_ratio
from ctrlg.errors import ConstraintError, ExperimentConfigError
from test_experiments import compose, run_interrupted, tiny_hmm_dir, tiny_lm_dir  # noqa: F401 (fixtures)

STORIES = ["Tom had a red kite. It flew over the hill.\n\nThen the wind stopped and it fell.",
           "Anna baked bread in the morning. The kitchen smelled warm and sweet all day long."]


def overrides(lm_dir, hmm_dir, stories_path, *extra):
    return [f"model.name={lm_dir}", "model.adapter=null", f"ilm_model.name={lm_dir}",
            "ilm_model.adapter=null", f"hmm.path={hmm_dir}", f"data.path={stories_path}",
            "data.limit=2", "ratios=[0.3]", "generation.num_samples=2", "ilm.seeds=2",
            "bootstrap.resamples=20", *extra]


def write_stories(folder, stories):
    path = folder / "stories.jsonl"
    path.write_text("".join(json.dumps({"text": s}) + "\n" for s in stories))
    return path


def read_records(folder):
    return [json.loads(line) for line in (folder / "generations.jsonl").read_text().splitlines()]


def test_a_run_records_every_method_and_resume_reproduces_it(tiny_lm_dir, tiny_hmm_dir, tmp_path):
    from experiments import infill

    settings = overrides(tiny_lm_dir, tiny_hmm_dir, write_stories(tmp_path, STORIES))
    full = tmp_path / "full"
    table = infill.run(compose("infill", settings), full)
    records = read_records(full)
    assert [r["index"] for r in records] == [0, 1]
    for r in records:
        assert {"original", "masked", "mask_ratio", "logical", "ilm", "ctrlg", "ilm_seeds"} <= set(r)
        assert 0 < r["mask_ratio"] <= 1 and "___" in r["masked"]
        for method in ("logical", "ctrlg"):
            assert r[method]["accepted"] and set(r[method]) == {"text", "accepted"}
            position = 0        # every unmasked fragment reproduced, in order
            for fragment in r["masked"].split("___"):
                found = r[method]["text"].find(fragment, position)
                assert found >= position, (fragment, r[method]["text"])
                position = found + len(fragment)
    assert table["0.3/ctrlg"]["success"] == table["0.3/logical"]["success"] == 100.0
    assert "bleu4_sd" in table["0.3/ilm"]
    saved = json.loads((full / "metrics.json").read_text())
    assert {b["pair"] for b in saved["bootstrap"]} == {"ctrlg − logical", "ctrlg − ilm"}

    runs = tmp_path / "runs"
    from ctrlg.tasks.infill import pipeline
    run_interrupted(pipeline, "guided_completion", 3,  # the second passage's first guided method
                    lambda: infill.run(compose("infill", settings), runs / "2026-01-01_00-00-00"))
    assert [r["index"] for r in read_records(runs / "2026-01-01_00-00-00")] == [0]
    infill.run(compose("infill", settings + ["resume=true"]), runs / "2026-01-02_00-00-00")
    resumed = read_records(runs / "2026-01-02_00-00-00")
    assert [r["index"] for r in resumed] == [0, 1]
    for got, want in zip(resumed, records):   # same masks, same seeds: same outputs
        assert got["masked"] == want["masked"]
        assert [got[m] for m in ("logical", "ilm", "ctrlg")] == [want[m] for m in ("logical", "ilm", "ctrlg")]
    with pytest.raises(ExperimentConfigError, match="generation"):
        infill.run(compose("infill", settings + ["generation.num_samples=3", f"resume={full}"]),
                   tmp_path / "x")
    other_masks = tmp_path / "other_masks"                 # records masked with another p
    other_masks.mkdir()
    (other_masks / "config.yaml").write_text((full / "config.yaml").read_text())
    (other_masks / "generations.jsonl").write_text(
        json.dumps({**records[0], "p": records[0]["p"] / 2}) + "\n")
    with pytest.raises(ExperimentConfigError, match="was masked with p = .*start afresh"):
        infill.run(compose("infill", settings + [f"resume={other_masks}"]), tmp_path / "y")


def test_a_resume_keeps_only_one_complete_record_per_selected_passage_and_ratio(tmp_path):
    from ctrlg.data.stories import Story
    from ctrlg.tasks.records import read_records as read_run
    from experiments.infill import record_schema

    stories = [Story(0, STORIES[0]), Story(1, STORIES[1])]
    output = {"text": "x", "accepted": True}
    good = {"target_ratio": 0.3, "index": 0, "original": STORIES[0], "logical": output, "ctrlg": output}
    lines = [good,
             dict(good),                                          # a second record of (0.3, 0)
             dict(good, index=1),                                 # passage 1 with passage 0's text
             dict(good, index=1, original=STORIES[1], ctrlg=None),  # without ctrlg's output
             dict(good, target_ratio=0.5),                        # a ratio the run does not select
             dict(good, index="1", original=STORIES[1]),          # an index of the wrong type
             {"target_ratio": 0.3, "index": 1, "original": STORIES[1], "skipped": "ConstraintError: x"}]
    (tmp_path / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    kept = read_run(tmp_path, schema=record_schema(stories, ["logical", "ctrlg"]),
                    selection=[(0.3, 0), (0.3, 1)])
    assert kept == [lines[0], lines[-1]]


@pytest.mark.parametrize("extra, message", [
    (["ratios=[1.2]"], "ratios"),
    (["ratios=[0]"], "ratios"),
    (["methods=[ctrlg,magic]"], "unknown method"),
    (["ilm.top_p=0"], "ilm.top_p"),
    (["ilm.top_p=1.5"], "ilm.top_p"),
])
def test_bad_settings_are_refused_before_any_model_loads(tmp_path, monkeypatch, extra, message):
    from experiments import infill

    monkeypatch.setattr(infill, "load_lm", lambda *a, **k: pytest.fail("a model was loaded"))
    settings = overrides("nowhere", "nowhere", write_stories(tmp_path, STORIES), *extra)
    with pytest.raises(ExperimentConfigError, match=message):
        infill.run(compose("infill", settings), tmp_path / "run")


@pytest.mark.parametrize("content, error, message", [
    ('{"text": "Fine. Text."}\n{"text": "   "}\n', DatasetError, "passage 1 .* empty"),
    ('{"text": "Fine."}\n{"text": "... !!! ?"}\n', ExperimentConfigError, "passage 1 has no word"),
    (b'{"text": "caf\xe9"}\n', DatasetError, "not valid UTF-8"),
])
def test_bad_passages_are_named_before_any_model_loads(tmp_path, monkeypatch, content, error, message):
    from experiments import infill

    monkeypatch.setattr(infill, "load_lm", lambda *a, **k: pytest.fail("a model was loaded"))
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(error, match=message):
        infill.run(compose("infill", overrides("x", "y", path)), tmp_path / "run")


def test_calibrated_masks_reach_each_target_ratio_of_characters():
    from ctrlg.data.stories import load_stories
    from ctrlg.tasks.infill import pipeline

    texts = [s.text for s in load_stories("eval", limit=40)]
    for target in (0.13, 0.40):
        p = pipeline.calibrate(texts, target, seed=0, iterations=14)
        reached = np.mean([mask_ratio(pipeline.mask_passage(t, p, i)) for i, t in enumerate(texts)])
        assert reached == pytest.approx(target, abs=0.01)
        assert all(pipeline.mask_passage(t, p, i).spans for i, t in enumerate(texts))


def test_mask_calibration_redraws_a_selection_until_its_mean_ratio_is_within_a_point():
    """15 evaluation passages whose closest p misses 32 % by more than a point (the steps of
    whole-unit masks): the masks are redrawn with new seeds and land within the tolerance; a
    selection that the first draw already brings there keeps the plain calibration's masks."""
    from ctrlg.data.stories import load_stories
    from ctrlg.tasks.infill import pipeline

    texts = [s.text for s in load_stories("eval", offset=95, limit=15)]
    plain_p = pipeline.calibrate(texts, 0.32, seed=0)
    plain = np.mean([mask_ratio(pipeline.mask_passage(t, plain_p, i)) for i, t in enumerate(texts)])
    assert abs(plain - 0.32) > pipeline.RATIO_TOLERANCE                    # the step this is about
    calibration = pipeline.calibrate_masks(texts, 0.32, seed=0)
    assert calibration.draws > 1 and calibration.seed == pipeline.SELECTION_SEED_STRIDE * (calibration.draws - 1)
    documents = calibration.documents
    reached = np.mean([mask_ratio(d) for d in documents])
    assert reached == pytest.approx(calibration.reached) and abs(reached - 0.32) <= pipeline.RATIO_TOLERANCE
    assert [d.spans for d in documents] == [pipeline.mask_passage(t, calibration.p, calibration.seed + i).spans
                                            for i, t in enumerate(texts)]
    first = texts[:8]                                                       # hits on the first draw
    first_p = pipeline.calibrate(first, 0.32, seed=0)
    assert abs(np.mean([mask_ratio(pipeline.mask_passage(t, first_p, i))
                        for i, t in enumerate(first)]) - 0.32) <= pipeline.RATIO_TOLERANCE
    kept = pipeline.calibrate_masks(first, 0.32, seed=0)
    assert (kept.draws, kept.seed, kept.p) == (1, 0, first_p)
    closest = pipeline.calibrate_masks(texts[:1], 0.32, seed=0, tolerance=0.0, draws=3)
    assert closest.draws == 3                                               # none exact: the closest


def test_runs_split_by_ratio_merge_into_the_single_runs_report(tiny_lm_dir, tiny_hmm_dir, tmp_path):
    from benchmarks.merge_infill import merge, parse_run
    from experiments import infill

    path = write_stories(tmp_path, STORIES)
    base = overrides(tiny_lm_dir, tiny_hmm_dir, path, "methods=[logical,ctrlg]",
                     "bootstrap.baselines=[logical]")
    whole = infill.run(compose("infill", base + ["ratios=[0.3,0.5]"]), tmp_path / "whole")
    for ratio in ("0.3", "0.5"):
        infill.run(compose("infill", base + [f"ratios=[{ratio}]"]), tmp_path / ratio)
    merged = merge([tmp_path / "0.3", tmp_path / "0.5"], tmp_path / "merged")
    assert set(merged) == set(whole)
    for key, row in whole.items():
        assert {k: v for k, v in merged[key].items() if k != "seconds"} == \
            {k: v for k, v in row.items() if k != "seconds"}
    with pytest.raises(ExperimentConfigError, match="share"):
        merge([tmp_path / "0.3", tmp_path / "whole"], tmp_path / "again")
    # RUN@r takes only those ratios of a run: the whole run's 0.3 with the 0.5 run is the whole run
    assert parse_run(f"{tmp_path / 'whole'}@0.3:ctrlg") == (tmp_path / "whole", ["ctrlg"], [0.3])
    assert parse_run(f"{tmp_path / 'whole'}@0.3") == (tmp_path / "whole", None, [0.3])
    taken = merge([parse_run(f"{tmp_path / 'whole'}@0.3"), tmp_path / "0.5"], tmp_path / "by_ratio")
    assert {k: {m: v for m, v in row.items() if m != "seconds"} for k, row in taken.items()} == \
        {k: {m: v for m, v in row.items() if m != "seconds"} for k, row in whole.items()}
    assert [r["target_ratio"] for r in read_records(tmp_path / "by_ratio")] == [0.3, 0.3, 0.5, 0.5]
    with pytest.raises(ExperimentConfigError, match="did not run ratios"):
        merge([parse_run(f"{tmp_path / '0.3'}@0.5")], tmp_path / "none")
    with pytest.raises(ExperimentConfigError, match="after '@'"):
        parse_run(f"{tmp_path / 'whole'}@x")
    infill.run(compose("infill", base + ["ratios=[0.4]", "generation.num_samples=3"]), tmp_path / "other")
    with pytest.raises(ExperimentConfigError, match="generation"):
        merge([tmp_path / "0.3", tmp_path / "other"], tmp_path / "again")


def test_shards_of_passages_merge_into_one_report_of_their_union(tiny_lm_dir, tiny_hmm_dir, tmp_path):
    """Passages run in shards (data.offset / data.limit), each calibrating its own masks, merge into
    one report over the union; a shard that repeats a passage of the same method is refused."""
    from benchmarks.merge_infill import merge
    from experiments import infill
    from omegaconf import OmegaConf

    base = overrides(tiny_lm_dir, tiny_hmm_dir, write_stories(tmp_path, STORIES),
                     "methods=[logical,ctrlg]", "bootstrap.baselines=[logical]")
    for offset in (0, 1):
        infill.run(compose("infill", base + [f"data.offset={offset}", "data.limit=1"]),
                   tmp_path / f"shard{offset}")
    merged = merge([tmp_path / "shard1", tmp_path / "shard0"], tmp_path / "merged")
    assert merged["0.3/ctrlg"]["passages"] == merged["0.3/logical"]["passages"] == 2
    assert read_records(tmp_path / "merged") == read_records(tmp_path / "shard0") + read_records(tmp_path / "shard1")
    assert OmegaConf.load(tmp_path / "merged" / "config.yaml").data.shards == [[0, 1], [1, 1]]
    again = merge([tmp_path / "merged"], tmp_path / "again")       # a merged run merges again
    assert again["0.3/ctrlg"]["passages"] == 2
    infill.run(compose("infill", base + ["data.limit=2"]), tmp_path / "both")
    with pytest.raises(ExperimentConfigError, match="share"):
        merge([tmp_path / "shard0", tmp_path / "both"], tmp_path / "refused")


def test_a_runs_ilm_is_replaced_by_a_later_run_decoded_with_other_ilm_settings(tiny_lm_dir, tiny_hmm_dir,
                                                                             tmp_path):
    """RUN:m1,m2 takes only those methods of a run; the runs contributing ILM must agree on ILM's
    settings, the others' ILM settings are free (and an ILM run's generation settings are)."""
    from benchmarks.merge_infill import merge, parse_run
    from experiments import infill
    from omegaconf import OmegaConf

    base = overrides(tiny_lm_dir, tiny_hmm_dir, write_stories(tmp_path, STORIES), "ilm.top_p=1.0")
    infill.run(compose("infill", base), tmp_path / "all")
    infill.run(compose("infill", base[:-1] + ["ilm.top_p=0.5", "methods=[ilm]", "generation.num_samples=3"]),
               tmp_path / "ilm")
    with pytest.raises(ExperimentConfigError, match="'ilm'"):     # both contribute ILM
        merge([tmp_path / "all", tmp_path / "ilm"], tmp_path / "refused")
    assert parse_run(f"{tmp_path / 'all'}:logical,ctrlg") == (tmp_path / "all", ["logical", "ctrlg"], None)
    merged = merge([parse_run(f"{tmp_path / 'all'}:logical,ctrlg"), parse_run(str(tmp_path / "ilm"))],
                   tmp_path / "merged")
    assert merged["0.3/ilm"]["passages"] == merged["0.3/ctrlg"]["passages"] == 2
    records, ilm_records = read_records(tmp_path / "merged"), read_records(tmp_path / "ilm")
    assert [r["ilm_seeds"] for r in records] == [r["ilm_seeds"] for r in ilm_records]
    assert [r["ctrlg"] for r in records] == [r["ctrlg"] for r in read_records(tmp_path / "all")]
    config = OmegaConf.load(tmp_path / "merged" / "config.yaml")
    assert config.ilm.top_p == 0.5 and config.generation.num_samples == 2
    infill.run(compose("infill", base[:-1] + ["ilm.top_p=0.7", "methods=[ilm]", "ratios=[0.5]"]),
               tmp_path / "ilm7")
    with pytest.raises(ExperimentConfigError, match="'ilm'"):
        merge([(tmp_path / "ilm", None), (tmp_path / "ilm7", None)], tmp_path / "refused")
    with pytest.raises(ExperimentConfigError, match="after ':'"):
        parse_run(f"{tmp_path / 'all'}:magic")


def test_runs_split_by_method_join_per_passage_into_the_single_runs_report(tiny_lm_dir, tiny_hmm_dir,
                                                                          tmp_path):
    from benchmarks.merge_infill import merge
    from experiments import infill

    base = overrides(tiny_lm_dir, tiny_hmm_dir, write_stories(tmp_path, STORIES), "ratios=[0.3,0.5]")
    whole = infill.run(compose("infill", base), tmp_path / "whole")
    infill.run(compose("infill", base + ["methods=[logical,ctrlg]", "ratios=[0.3]"]), tmp_path / "g3")
    infill.run(compose("infill", base + ["methods=[logical,ctrlg]", "ratios=[0.5]"]), tmp_path / "g5")
    infill.run(compose("infill", base + ["methods=[ilm]"]), tmp_path / "ilm")
    runs = [tmp_path / "g3", tmp_path / "g5", tmp_path / "ilm"]
    merged = merge(runs, tmp_path / "merged")
    assert set(merged) == set(whole)
    for key, row in whole.items():
        assert {k: v for k, v in merged[key].items() if k != "seconds"} == \
            {k: v for k, v in row.items() if k != "seconds"}
    without_seconds = [{k: v for k, v in r.items() if k != "seconds"} for r in read_records(tmp_path / "merged")]
    assert without_seconds == [{k: v for k, v in r.items() if k != "seconds"}
                               for r in read_records(tmp_path / "whole")]

    ilm_records = (tmp_path / "ilm" / "generations.jsonl").read_text().splitlines()
    (tmp_path / "ilm" / "generations.jsonl").write_text(ilm_records[0] + "\n")   # ILM reached one passage
    partial = merge(runs, tmp_path / "partial")
    assert [(r["target_ratio"], r["index"]) for r in read_records(tmp_path / "partial")] == [(0.3, 0)]
    assert partial["0.3/ilm"]["passages"] == partial["0.3/ctrlg"]["passages"] == 1

    altered = json.loads(ilm_records[0])
    altered["masked"] = altered["masked"].replace("___", "", 1)
    (tmp_path / "ilm" / "generations.jsonl").write_text(json.dumps(altered) + "\n")
    with pytest.raises(ExperimentConfigError, match="another mask"):
        merge(runs, tmp_path / "again")
    # the first run's masks win: the other-masked ILM record is left out, ILM comes from a run
    # decoded on the first run's masks (a re-run of ILM alone), listed before the stale one
    infill.run(compose("infill", base + ["methods=[ilm]", "ratios=[0.3]"]), tmp_path / "ilm_again")
    with pytest.raises(ExperimentConfigError, match="another mask"):   # without the option: refused
        merge(runs + [tmp_path / "ilm_again"], tmp_path / "twice")
    redone = merge([tmp_path / "g3", tmp_path / "g5", tmp_path / "ilm_again", tmp_path / "ilm"],
                   tmp_path / "redone", first_mask_wins=True, resamples=0)
    assert json.loads((tmp_path / "redone" / "metrics.json").read_text()).get("bootstrap") in (None, [])
    assert [(r["target_ratio"], r["index"]) for r in read_records(tmp_path / "redone")] == [(0.3, 0), (0.3, 1)]
    assert redone["0.3/ilm"]["passages"] == 2 and "0.5/ilm" not in redone
    assert [r["ilm"] for r in read_records(tmp_path / "redone")] == \
        [r["ilm"] for r in read_records(tmp_path / "ilm_again")]


def test_ilm_decoding_writes_every_answer_when_the_answer_marker_is_the_lms_eos(smollm2_tokenizer):
    """[answer] is SmolLM2's <|im_end|>, also the LM's EOS: generate must not end a row at the
    first answer, and no answer may be empty (two markers in a row), as in training."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from ctrlg.tasks.infill import pipeline
    from ctrlg.tasks.infill.ilm_decoding import ilm_fill
    from ctrlg.tasks.stories.ilm import IlmTokens

    tokenizer = smollm2_tokenizer
    answer_id = IlmTokens().check(tokenizer)[IlmTokens().answer]
    assert answer_id == tokenizer.eos_token_id
    word_id = tokenizer(" the", add_special_tokens=False)["input_ids"][0]
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config).eval()
    head = torch.nn.Linear(16, len(tokenizer), bias=True)     # only [answer] and " the" are likely
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-100.0)
        head.bias[[answer_id, word_id]] = 0.0
    model.lm_head = head
    document = next(d for i in range(50)
                    if len((d := pipeline.mask_passage(STORIES[1], 0.3, i)).spans) >= 2)
    fills = ilm_fill(model, tokenizer, document, max_new_tokens=200, seed=0, num_samples=4,
                     eos_ids=[tokenizer.eos_token_id])
    for fill in fills:
        assert fill.complete and len(fill.answers) == len(document.spans)
        assert all(answer and set(answer.split()) == {"the"} for answer in fill.answers), fill.answers


def test_ilm_decoding_samples_from_the_nucleus_when_top_p_is_below_one(smollm2_tokenizer):
    """A model that writes " the" and [answer] with p ≈ 0.45 each and " a" with p ≈ 0.10 at every
    step (" the" 0.82 and " a" 0.18 at an answer's start, where [answer] is suppressed): with
    top_p = 0.8 the nucleus never holds " a"; plain sampling writes it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from ctrlg.tasks.infill import pipeline
    from ctrlg.tasks.infill.ilm_decoding import ilm_fill
    from ctrlg.tasks.stories.ilm import IlmTokens

    tokenizer = smollm2_tokenizer
    answer_id = IlmTokens().check(tokenizer)[IlmTokens().answer]
    the_id, a_id = (tokenizer(w, add_special_tokens=False)["input_ids"][0] for w in (" the", " a"))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config).eval()
    head = torch.nn.Linear(16, len(tokenizer), bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-100.0)
        head.bias[[answer_id, the_id]] = 1.0
        head.bias[a_id] = -0.5
    model.lm_head = head
    document = next(d for i in range(50)
                    if len((d := pipeline.mask_passage(STORIES[1], 0.3, i)).spans) >= 2)
    words = {}
    for top_p in (1.0, 0.8):
        fills = ilm_fill(model, tokenizer, document, max_new_tokens=200, seed=0, num_samples=16,
                         top_p=top_p, eos_ids=[tokenizer.eos_token_id])
        words[top_p] = {w for fill in fills for answer in fill.answers for w in answer.split()}
    assert words[1.0] == {"the", "a"} and words[0.8] == {"the"}
    with pytest.raises(ConstraintError, match="top_p"):
        ilm_fill(model, tokenizer, document, max_new_tokens=8, seed=0, top_p=0.0)


def test_a_target_ratio_the_masks_cannot_reach_is_said(capsys):
    """The quick default's 2 passages reach every target after a few draws; a one-sentence
    passage cannot reach 13 % (its units are 4 words of 15 characters), and the run says so."""
    from ctrlg.data.stories import load_stories
    from ctrlg.tasks.infill import pipeline
    from experiments.infill import _warn_if_missed

    quick = [s.text for s in load_stories("eval", limit=2)]
    for texts, target, said in ((quick, 0.40, False), (quick, 0.13, False), (["Tom had a kite."], 0.13, True)):
        calibration = pipeline.calibrate_masks(texts, target, seed=0)
        reached = float(np.mean([mask_ratio(d) for d in calibration.documents]))
        _warn_if_missed(target, calibration)
        err = capsys.readouterr().err
        assert (abs(reached - target) > 0.01) == said == bool(err), (target, reached, err)
        if said:
            assert f"after {pipeline.MAX_SELECTION_DRAWS} draws" in err and "data.limit" in err


def test_a_merge_that_misses_a_target_ratio_says_which_shards_pulled_it_away():
    from pathlib import Path

    from benchmarks.merge_infill import missed_ratios

    def rows(target, ratios):
        return [{"target_ratio": target, "index": i, "mask_ratio": r} for i, r in enumerate(ratios)]
    big = rows(0.21, [0.20, 0.22] * 5) + rows(0.4, [0.40] * 10)
    small = rows(0.21, [0.10, 0.12]) + rows(0.4, [0.41, 0.39])
    assert missed_ratios(big + small[2:], [(Path("big"), big), (Path("small"), small)]) == []
    [line] = missed_ratios(big + small, [(Path("big"), big), (Path("small"), small)])
    assert line.startswith("ratio 21%: the merged masks cover 19.3% of the characters of 12") and "small: 11.0% over 2" in line
