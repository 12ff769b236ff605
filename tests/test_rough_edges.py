"""Bad input that used to be silently misread or reported under the wrong name: CommonGen
concepts, the experiment's decoding settings, blank keyphrases and an empty word range in the
editor's API. Each must be a clear 4xx / ConstraintError / ExperimentConfigError naming the input."""

import re

import pytest

from ctrlg import dfa
from ctrlg.dfa.words import parse_concepts
from ctrlg.errors import ConstraintError
from ctrlg.errors import ExperimentConfigError
from test_experiments import compose


@pytest.mark.parametrize("concepts, named", [
    ([" _N", "dog_N"], "' _N'"),                 # before: silently the concept word "N"
    (["_V"], "'_V'"),
    (["dog_"], "'dog_'"),
    ("dog_N#  _V", "'  _V'"),
    (["dog_N", 3], "3"),
    (["dog_X"], "'X'"),
    (None, "None"),                               # before: TypeError
    (42, "42"),
])
def test_a_malformed_concept_is_named(smollm2_tokenizer, concepts, named):
    with pytest.raises(ConstraintError, match=re.escape(named)):
        dfa.commongen_constraint(concepts, smollm2_tokenizer, min_words=1, max_words=8)


def test_well_formed_concepts_still_parse():
    assert parse_concepts(["dog_N", " cat_N ", "run", "ice_cream_N"]) == \
        [("dog", "N"), ("cat", "N"), ("run", None), ("ice_cream", "N")]
    assert parse_concepts(("look_VERB",)) == [("look", "VERB")]


def run_config(tmp_path, *overrides):
    from experiments import commongen

    cfg = compose("commongen", ["model.name=/nonexistent/lm", "hmm.path=/nonexistent/hmm",
                                *overrides])
    return commongen.run(cfg, tmp_path)


def test_num_beams_zero_is_named_as_num_beams(tmp_path):
    """The default pipeline sets num_samples to ${generation.num_beams}: the error used to name
    num_samples, which the user never set."""
    with pytest.raises(ExperimentConfigError, match=r"generation\.num_beams must be a positive"):
        run_config(tmp_path, "generation.num_beams=0")


@pytest.mark.parametrize("override, named", [
    ("generation.temperature=0", "generation.temperature"),
    ("generation.temperature=-1", "generation.temperature"),
    ("generation.top_p=0", "generation.top_p"),
    ("generation.top_p=1.5", "generation.top_p"),
])
def test_sampling_settings_are_refused_before_the_model_loads(tmp_path, override, named):
    """Before: transformers' traceback after the LM was loaded (a missing model folder here
    would have been reported first)."""
    with pytest.raises(ExperimentConfigError, match=named.replace(".", r"\.")) as info:
        run_config(tmp_path, "pipeline=instruct", override)
    if "temperature" in named:
        assert "generation.num_beams" in str(info.value)   # what to use instead


def test_beam_search_ignores_the_temperature(tmp_path):
    """Beam search does not sample: temperature=0 is not an error there (the missing model
    is)."""
    from ctrlg.errors import CtrlgError

    with pytest.raises(CtrlgError, match="nonexistent"):
        run_config(tmp_path, "generation.temperature=0", "generation.num_beams=4")


@pytest.fixture(scope="module")
def editor(smollm2_tokenizer):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from app_fixtures import live_server, tiny_model
    from ctrlg.app import create_app

    model, hmm = tiny_model(smollm2_tokenizer)
    with live_server(create_app(model, smollm2_tokenizer, hmm)) as base:
        yield base


@pytest.mark.parametrize("body, field", [
    ({"prefix": "a", "keyphrases": ["   "]}, "keyphrases[0]"),   # before: 200, unconstrained
    ({"prefix": "a", "keyphrases": ["dog", "\t"]}, "keyphrases[1]"),
    ({"prefix": "a", "banned": [" "]}, "banned[0]"),
    ({"prefix": "a", "max_words": 0}, "max_words"),              # before: 200, no candidates
])
def test_the_editor_refuses_blank_phrases_and_an_empty_word_range(editor, body, field):
    from test_app import call

    status, response = call(editor, "/api/generate", body)
    assert status == 422 and field in response["error"], (status, response)
    assert call(editor, "/api/health")[1]["status"] == "ok"
