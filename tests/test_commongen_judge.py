"""The CommonGen rerank with a judge LM: the pick against an explicit search over the shortlist,
decoding with a judge equal to re-picking the saved beams offline with it, and the errors."""

import math
import random

import pytest
from omegaconf import OmegaConf

from ctrlg.lm.judge import Judge, judge_log_likelihoods
from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks.commongen.items import judge_prompt_ids, judge_style
from ctrlg.tasks.commongen.methods import generation_settings
from ctrlg.tasks.commongen.pipeline import load_judge
from ctrlg.tasks.commongen.repick import repick_run
from ctrlg.tasks.commongen.rerank import lm_rule, pick_candidate, rerank_score
from test_commongen_rerank import _adapted, read_records
from test_experiments import compose, tiny_hmm_dir, tiny_lm_dir  # noqa: F401 (fixtures)


def explicit_pick(scores, lengths, accepted, texts, verdicts, p, a, k):
    """Every distinct satisfying text (all texts when none satisfies) with its best-scored
    candidate; the k best by log p / |y|^p; the one maximising that plus a · judge."""
    pool = [i for i in range(len(scores)) if accepted[i]] or list(range(len(scores)))
    best_of_text = {}
    for i in pool:
        value = scores[i] / lengths[i] ** p
        j = best_of_text.get(texts[i])
        if j is None or value > scores[j] / lengths[j] ** p:
            best_of_text[texts[i]] = i
    shortlist = sorted(best_of_text.values(), key=lambda i: (-scores[i] / lengths[i] ** p, i))[:k]
    return max(shortlist, key=lambda i: (scores[i] / lengths[i] ** p + a * verdicts[texts[i]],
                                         -shortlist.index(i)))


@pytest.mark.parametrize("seed", range(40))
def test_judged_pick_is_the_best_combined_score_of_the_shortlist(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 8)
    texts = [rng.choice("abcde") for _ in range(n)]           # repeated texts: one per text is judged
    scores = [-rng.uniform(1, 20) for _ in range(n)]
    lengths = [rng.randint(1, 12) for _ in range(n)]
    accepted = [rng.random() < 0.6 for _ in range(n)]
    verdicts = {t: -rng.uniform(1, 20) for t in "abcde"}
    p, a, k = rng.choice([0.0, 0.5]), rng.choice([0.25, 1.0, 4.0]), rng.randint(1, 5)
    asked = []

    def judge(chosen):
        asked.append(list(chosen))
        return [verdicts[t] for t in chosen]

    rule = {**lm_rule(p, a, k)}
    got = pick_candidate(scores, lengths, accepted, rule, texts, judge)
    assert got == explicit_pick(scores, lengths, accepted, texts, verdicts, p, a, k)
    assert len(asked) == 1 and len(set(asked[0])) == len(asked[0]) <= k   # each text judged once
    # a shortlist of one is the rule without a judge
    assert pick_candidate(scores, lengths, accepted, lm_rule(p, a, 1), texts, judge) == \
        pick_candidate(scores, lengths, accepted, p)


def test_a_heavy_judge_overrules_the_lm_within_the_shortlist():
    scores, lengths, accepted = [-5.0, -6.0, -30.0], [5, 5, 5], [True, True, True]
    texts = ["illustration of a dog", "a dog runs in the park", "dog dog dog"]
    verdicts = {"illustration of a dog": -40.0, "a dog runs in the park": -10.0, "dog dog dog": -1.0}
    judge = lambda chosen: [verdicts[t] for t in chosen]   # noqa: E731
    assert pick_candidate(scores, lengths, accepted, 0.0) == 0
    assert pick_candidate(scores, lengths, accepted, lm_rule(0.0, 1.0, 2), texts, judge) == 1
    assert pick_candidate(scores, lengths, accepted, lm_rule(0.0, 1.0, 3), texts, judge) == 1
    assert pick_candidate(scores, lengths, accepted, lm_rule(0.0, 4.0, 3), texts, judge) == 2
    with pytest.raises(ExperimentConfigError, match="needs a judge"):
        pick_candidate(scores, lengths, accepted, lm_rule(0.0, 1.0, 2), texts, None)


def test_judge_scores_each_text_once_with_its_eos(tiny_lm_dir, tmp_path):
    from ctrlg.lm.models import load

    model, tokenizer = load(str(tiny_lm_dir))
    judge = Judge(model, tokenizer)
    prompt = judge_prompt_ids(["dog", "run"], tokenizer, {"prompt_style": "instruct"})
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
    encoded = judge.encode("  a dog  runs ")
    assert encoded[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(encoded[:-1]) == "a dog runs"
    first = judge.score(prompt, ["a dog runs", "dogs run", "a dog runs"])
    assert first[0] == first[2]
    assert first == pytest.approx(judge_log_likelihoods(model, prompt, [judge.encode("a dog runs"),
                                                                        judge.encode("dogs run"),
                                                                        judge.encode("a dog runs")]))
    assert len(judge.memo) == 2
    judge.save_memo(tmp_path / "memo.jsonl")
    again = Judge(model, tokenizer)
    assert again.load_memo(tmp_path / "memo.jsonl") == 2 and again.memo == judge.memo


def test_judge_style_is_the_adapters_training_format_unless_set():
    from ctrlg.errors import CtrlgError

    assert judge_style({})["prompt_style"] == "instruct"
    supervised = judge_style({"adapter": "commongen-supervised"})
    assert supervised["prompt_style"] == "keywords" and supervised["bos_token"] == "<|endoftext|>"
    assert judge_style({"adapter": "commongen-human-balanced"})["prompt_style"] == "bos"
    assert judge_style({"adapter": "commongen-supervised",
                        "prompt_style": "instruct"})["prompt_style"] == "instruct"
    with pytest.raises(CtrlgError, match="prompt style must be one of"):
        judge_style({"prompt_style": "chat"})


@pytest.mark.parametrize("style", ["keywords", "bos"])
def test_an_adapted_judge_scores_exactly_the_text_its_adapter_was_trained_on(tiny_lm_dir, style):
    """prompt ⊕ the judge's candidate tokens = the tokens of the training text
    prompt_text + target_text (prompt, " " + sentence, EOS), and the score is its chain rule."""
    from ctrlg.data.commongen_prompts import prompt_text, target_prefix, target_text
    from ctrlg.lm.models import load
    from ctrlg.sampler import lm_log_likelihood

    model, tokenizer = load(str(tiny_lm_dir))
    judge = Judge(model, tokenizer, text_prefix=target_prefix(style))
    concepts, sentence = ["dog", "frisbee", "catch"], "  The dog  catches a frisbee. "
    prompt = judge_prompt_ids(concepts, tokenizer, {"prompt_style": style})
    trained = tokenizer(prompt_text(concepts, style, tokenizer) + target_text(sentence, tokenizer),
                        add_special_tokens=False)["input_ids"]
    candidate = judge.encode(sentence)
    assert prompt + candidate == trained
    assert judge.score(prompt, [sentence]) == pytest.approx(
        lm_log_likelihood(model, prompt, [candidate]), rel=1e-5, abs=1e-5)
    assert judge.identity != Judge(model, tokenizer).identity   # the prefix changes every score


def test_judge_cache_names_its_judge_and_refuses_another(tiny_lm_dir, tmp_path):
    import copy
    import json

    import torch

    from ctrlg.lm.judge import JudgeCacheError
    from ctrlg.lm.models import load

    model, tokenizer = load(str(tiny_lm_dir))
    judge = Judge(model, tokenizer)
    judge.score([1, 2], ["a dog runs"])
    judge.save_memo(tmp_path / "memo.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "memo.jsonl").read_text().splitlines()]
    assert rows[0] == {"judge": judge.identity} and len(rows) == 2
    other_model = copy.deepcopy(model)
    with torch.no_grad():
        other_model.get_input_embeddings().weight.mul_(1.5)
    other = Judge(other_model, tokenizer)
    with pytest.raises(JudgeCacheError, match="another judge"):
        other.load_memo(tmp_path / "memo.jsonl")
    assert other.memo == {}
    (tmp_path / "old.jsonl").write_text(json.dumps(rows[1]) + "\n")   # written before the line
    assert other.load_memo(tmp_path / "old.jsonl") == 1


def test_decoding_with_a_judge_equals_re_picking_the_saved_beams_with_it(tiny_lm_dir, tiny_hmm_dir,
                                                                        tmp_path):
    from experiments import commongen

    plain, judged = tmp_path / "plain", tmp_path / "judged"
    commongen.run(_adapted(tiny_lm_dir, tiny_hmm_dir), plain)
    with_judge = ["judge.weight=2.0", "judge.top_k=3", f"judge.model={tiny_lm_dir}", "judge.adapter=null"]
    commongen.run(_adapted(tiny_lm_dir, tiny_hmm_dir, *with_judge), judged)
    decoded = read_records(judged)
    for record in decoded:
        for method in ("logical", "ctrlg"):
            out = record[method]
            verdicts = {c["text"]: c["judge_log_likelihood"] for c in out["candidates"]
                        if "judge_log_likelihood" in c}
            assert 1 <= len(verdicts) <= 3 and out["judge_log_likelihood"] == verdicts[out["text"]]
            combined = {c["text"]: c["log_likelihood"] + 2.0 * verdicts[c["text"]]
                        for c in out["candidates"] if c["text"] in verdicts}
            assert math.isclose(combined[out["text"]], max(combined.values()))
    cfg = OmegaConf.load(judged / "config.yaml")
    judge = load_judge(cfg)
    repicked = read_records(repick_run(plain, tmp_path / "repicked", lm_rule(0.0, 2.0, 3),
                                       judge=judge, judge_cfg=OmegaConf.to_container(cfg.judge),
                                       keep_as="ctrlg_lm", methods=["ctrlg"]))
    names = OmegaConf.load(tmp_path / "repicked" / "config.yaml").differing_settings.rerank
    assert names == {"ctrlg": "p=0 judge a=2 K=3", "ctrlg_lm": "p=0"}
    for mine, theirs, own in zip(repicked, decoded, read_records(plain), strict=True):
        assert mine["ctrlg"]["text"] == theirs["ctrlg"]["text"]
        assert mine["ctrlg_lm"]["text"] == own["ctrlg"]["text"]
    # the judge's settings decide the generations: a resumed run must share them
    assert "judge" not in generation_settings(_adapted(tiny_lm_dir, tiny_hmm_dir))
    assert generation_settings(cfg)["judge"]["weight"] == 2.0


@pytest.mark.parametrize("override, named", [("judge.weight=-1", "judge.weight must be"),
                                             ("judge.top_k=0", "judge.top_k must be"),
                                             ("rerank=mbr", "does not combine")])
def test_bad_judge_settings_fail_before_the_lm_is_loaded(tmp_path, override, named):
    from experiments import commongen

    cfg = compose("commongen", ["model.name=/nonexistent/lm", "judge.weight=0.5", override])
    with pytest.raises(ExperimentConfigError, match=named):
        commongen.run(cfg, tmp_path)


def test_rerank_score_is_unchanged_without_a_judge():
    assert rerank_score(-12.0, 4, 0.0) == -12.0


def test_rerank_cli_reads_the_config_judge_prompt_and_refuses_a_foreign_cache(
        tiny_lm_dir, tiny_hmm_dir, tmp_path, capsys):
    import json

    from experiments import commongen
    from experiments.commongen_rerank import judge_defaults, main

    plain = tmp_path / "plain"
    commongen.run(_adapted(tiny_lm_dir, tiny_hmm_dir), plain)
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text(json.dumps({"judge": "weights 0000 tokenizer 0000 torch.float32"}) + "\n")
    common = [str(plain), "--judge-weight", "1", "--judge-top-k", "2", "--judge-model", str(tiny_lm_dir)]
    with pytest.raises(SystemExit) as stopped:
        main(common + ["--out", str(tmp_path / "a"), "--judge-cache", str(foreign)])
    assert stopped.value.code == 1 and "another judge" in capsys.readouterr().err
    cache = tmp_path / "cache.jsonl"
    main(common + ["--out", str(tmp_path / "b"), "--judge-cache", str(cache)])
    rows = [json.loads(line) for line in cache.read_text().splitlines()]
    assert set(rows[0]) == {"judge"} and len(rows) > 1
    cfg = OmegaConf.load(tmp_path / "b" / "config.yaml")
    judge = load_judge(cfg)
    first = read_records(plain)[0]
    expected = judge_prompt_ids(first["concepts"], judge.tokenizer, judge_defaults())
    assert any(row.get("prompt") == list(expected) for row in rows[1:])
    keywords = tmp_path / "keywords.jsonl"
    main(common + ["--out", str(tmp_path / "c"), "--judge-cache", str(keywords),
                   "--judge-prompt-style", "keywords"])
    rows = [json.loads(line) for line in keywords.read_text().splitlines()]
    assert rows[0]["judge"].endswith('prefix " "')
    expected = judge_prompt_ids(first["concepts"], judge.tokenizer, {"prompt_style": "keywords"})
    assert any(row.get("prompt") == list(expected) for row in rows[1:])
    assert all(row["text"] == " ".join(row["text"].split()) for row in rows[1:])
