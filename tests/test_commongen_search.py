"""The search options of experiments.commongen (generation.fast_search / beam_score /
sibling_penalty, ctrlg.tasks.search_options) on a tiny LM: fast_search keeps every output, the
other options run with every constraint met, and bad values fail with the key's name."""

import json

import pytest

from ctrlg.tasks.search_options import SearchOptionError, SearchOptions
from test_experiments import compose, tiny_hmm_dir, tiny_lm_dir  # noqa: F401 (fixtures)


def _run(tmp_path, lm_dir, hmm_dir, name, *extra):
    from experiments import commongen

    cfg = compose("commongen", ["pipeline=adapted", f"model.name={lm_dir}", "model.adapter=null",
                                f"hmm.path={hmm_dir}", "data.limit=2", "batch_size=2",
                                "generation.num_beams=4", "generation.max_new_tokens=12",
                                "metrics.meteor=false", "bootstrap.resamples=0",
                                "methods=[logical,ctrlg]", "save_candidates=true", *extra])
    table = commongen.run(cfg, tmp_path / name)
    lines = (tmp_path / name / "generations.jsonl").read_text().splitlines()
    return table, [json.loads(line) for line in lines]


def _outputs(records):
    return [(r[m]["text"], [c["text"] for c in r[m]["candidates"]]) for r in records
            for m in ("logical", "ctrlg")]


def test_fast_search_keeps_every_candidate_and_the_options_run(tiny_lm_dir, tiny_hmm_dir, tmp_path):
    _, slow = _run(tmp_path, tiny_lm_dir, tiny_hmm_dir, "slow", "generation.fast_search=false")
    _, fast = _run(tmp_path, tiny_lm_dir, tiny_hmm_dir, "fast", "generation.fast_search=true")
    assert _outputs(slow) == _outputs(fast)
    for extra in (["generation.beam_score=lookahead"], ["generation.sibling_penalty=1.0"]):
        table, records = _run(tmp_path, tiny_lm_dir, tiny_hmm_dir, extra[0].split("=")[0][11:], *extra)
        assert table["ctrlg"]["success"] == 100.0 and table["logical"]["success"] == 100.0
    # options at their defaults leave a run's identity (and so resume) unchanged
    from ctrlg.tasks.commongen.methods import generation_settings

    plain = compose("commongen", ["pipeline=instruct"])
    named = compose("commongen", ["pipeline=instruct", "generation.beam_score=guided",
                                  "generation.sibling_penalty=0.0", "generation.fast_search=false"])
    assert generation_settings(plain) == generation_settings(named)
    ahead = compose("commongen", ["pipeline=instruct", "generation.beam_score=lookahead"])
    assert generation_settings(ahead) != generation_settings(plain)
    # the adapted pipeline ranks beams by the HMM's lookahead: a run kept from before it did is
    # reproduced (and resumed) with generation.beam_score=guided named
    adapted = compose("commongen", ["pipeline=adapted"])
    assert adapted.generation.beam_score == "lookahead"
    kept = compose("commongen", ["pipeline=adapted", "generation.beam_score=guided"])
    assert generation_settings(kept) != generation_settings(adapted)
    assert "beam_score" not in generation_settings(kept)["generation"]


@pytest.mark.parametrize("key, value, beams", [
    ("fast_search", "yes", 4), ("beam_score", "best", 4), ("sibling_penalty", -1.0, 4),
    ("score_kept_only", "on", 4),
    ("sibling_penalty", float("inf"), 4), ("sibling_penalty", 0.5, 1)])
def test_bad_search_options_name_the_key(key, value, beams):
    with pytest.raises(SearchOptionError, match=f"generation.{key}"):
        SearchOptions.from_config({key: value}, beams, beams)


def test_score_kept_only_keeps_every_candidate(tiny_lm_dir, tiny_hmm_dir, tmp_path, monkeypatch):
    """The guide scoring only the entries the search can keep gives the same beams and
    candidates as scoring every entry (up to float rounding: equal texts on the tiny LM)."""
    import ctrlg.sampler as sampler

    calls = []
    kept_scores = sampler.top_lookahead_scores

    def counted(*args, **kwargs):
        calls.append(1)
        return kept_scores(*args, **kwargs)

    monkeypatch.setattr(sampler, "top_lookahead_scores", counted)
    settings = ["generation.beam_score=lookahead", "generation.fast_search=true"]
    _, every = _run(tmp_path, tiny_lm_dir, tiny_hmm_dir, "every", *settings,
                    "generation.score_kept_only=false")
    assert not calls
    _, kept = _run(tmp_path, tiny_lm_dir, tiny_hmm_dir, "kept", *settings,
                   "generation.score_kept_only=true")
    assert calls                                  # the kept path ran
    assert _outputs(every) == _outputs(kept)
    assert all(r["ctrlg"]["candidates"] for r in kept)


@pytest.mark.parametrize("options, keep", [
    ({"score_kept_only": True, "beam_score": "lookahead"}, 32),
    ({"score_kept_only": False, "beam_score": "lookahead"}, None),
    ({"score_kept_only": True, "beam_score": "guided"}, None),       # needs every token's score
    ({"score_kept_only": True, "beam_score": "lookahead", "sibling_penalty": 0.5}, None)])
def test_keep_top_applies_only_to_lookahead_beams_without_a_sibling_penalty(options, keep):
    assert SearchOptions.from_config(options, 8, 8).keep_top() == keep
    if not options.get("sibling_penalty"):
        assert SearchOptions.from_config(options, 1, 8).keep_top() is None   # sampling


def test_processors_run_bans_first_and_the_sibling_penalty_last():
    from ctrlg.lm.beam_search import InPlaceBans, SiblingRankPenalty
    options = SearchOptions.from_config({"fast_search": True, "sibling_penalty": 0.5}, 8, 8)
    decoding = {"no_repeat_ngram_size": 4, "num_beams": 8}
    bans, extra = options.bans(decoding, {"min_new_tokens": 5}, 1, [2])
    assert isinstance(bans, InPlaceBans) and extra == {} and "no_repeat_ngram_size" not in decoding
    chain = options.processors(bans, ["recorder", "guide"])
    assert chain[0] is bans and chain[1:3] == ["recorder", "guide"]
    assert isinstance(chain[3], SiblingRankPenalty) and chain[3].top >= 2 * 8
    sampling = SearchOptions.from_config({"fast_search": True}, 1, 8)
    assert sampling.bans({"no_repeat_ngram_size": 4}, {"min_new_tokens": 5}, 1, [2])[0] is None


def test_a_bad_search_option_fails_before_the_lm_is_loaded(tmp_path):
    from experiments import commongen
    cfg = compose("commongen", ["model.name=/nonexistent/lm", "hmm.path=/nonexistent/hmm",
                                "generation.num_beams=4", "generation.sibling_penalty=-2"])
    with pytest.raises(SearchOptionError, match="generation.sibling_penalty"):
        commongen.run(cfg, tmp_path)
