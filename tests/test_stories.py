"""The story corpus's split, the story LMs' text formats and ILM's format."""

import numpy as np
import pytest

from ctrlg.data import DatasetError, mask_document
from ctrlg.data.stories import (EVAL_RANGE, check_disjoint, leaking_train_indices, load_stories,
                                normalise, shingles)
from ctrlg.data import story_prompts as formats
from ctrlg.tasks.stories import ilm


def test_the_split_is_by_index_and_no_evaluation_passage_is_in_anything_trained_on():
    train, evaluation = load_stories("train"), load_stories("eval")
    assert [s.index for s in evaluation] == list(EVAL_RANGE)
    assert all(s.index < 4000 for s in train)
    # windows of the same novels overlap across the split: those training passages are left out
    leaking = leaking_train_indices()
    assert len(train) == 4000 - len(leaking) and 0 < len(leaking) < 40
    assert not leaking & {s.index for s in train}
    eval_texts = [s.text for s in evaluation]
    check_disjoint([s.text for s in train], eval_texts)
    with pytest.raises(DatasetError, match="overlaps the training data"):
        check_disjoint([s.text for s in train] + [eval_texts[7].upper()], eval_texts)


def test_what_each_story_form_trains_on_holds_no_evaluation_text(smollm2_tokenizer):
    """The adapters' examples (prompts and targets) are cut from training passages only."""
    from ctrlg.tasks.stories.adaptation import form_examples

    train = [s.text for s in load_stories("train", limit=300)]
    cfg = {"data": {"examples_per_passage": 2}, "bos_token": "<|endoftext|>"}
    evaluation = [s.text for s in load_stories("eval")]
    for form in formats.FORMS:
        prompts, targets = form_examples(form, train, smollm2_tokenizer, cfg, seed=0)
        assert len(prompts) == len(targets) > 250
        check_disjoint([p + t for p, t in zip(prompts, targets)], evaluation, form)


def test_normalise_and_shingles():
    assert normalise("“Hi,”  she SAID —\nok") == normalise('"hi," she said -\tOK')
    words = " ".join(f"w{i}" for i in range(14))
    assert len(shingles(words)) == 3 and shingles("a b") == {"a b"}


def test_a_user_file_is_read_whole_and_empty_passages_are_named(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "One. Two."}\n{"text": "Three."}\n')
    assert [s.text for s in load_stories("eval", path)] == ["One. Two.", "Three."]
    path.write_text('{"text": "One."}\n{"text": "  "}\n')
    with pytest.raises(DatasetError, match="passage 1 .* is empty"):
        load_stories("eval", path)
    with pytest.raises(DatasetError, match="split"):
        load_stories("dev")


def test_continuation_spans_are_whole_sentences_after_a_prefix():
    text = ("He came home late. The door was open and the lights were off. "
            "She waited.\n\n“Where were you?” she asked him quietly. He did not answer")
    spans = formats.continuation_spans(text)
    got = [text[s.start:s.end] for s in spans]
    assert "The door was open and the lights were off." in got
    assert "“Where were you?” she asked him quietly." in got
    assert all(s.start > 0 for s in spans)
    assert not any("He did not answer" in g for g in got)      # unfinished: never a span
    assert not any("\n" in g for g in got)                     # within one paragraph
    assert all(5 <= s.words <= 40 for s in spans)
    assert "She waited." not in got                            # too short alone …
    assert any(g.startswith("The door") and g.endswith("She waited.") for g in got)  # … but joined


def test_ilm_format_round_trips(smollm2_tokenizer):
    text = "Tom had a red kite. It flew over the hill.\n\nThen the wind stopped and it fell."
    document = mask_document(text, 0.3, seed=3)
    assert document.spans
    tokens = ilm.IlmTokens()
    ids = tokens.check(smollm2_tokenizer)
    prompt, target = ilm.ilm_example(document, tokens, "<|endoftext|>")
    assert prompt.startswith("<|endoftext|>") and prompt.endswith(tokens.sep)
    assert target.count(tokens.answer) == len(document.spans)
    assert ilm.complete(document, document.answers) == text
    encoded = smollm2_tokenizer(target, add_special_tokens=False)["input_ids"]
    answers = ilm.split_answers(encoded, ids[tokens.answer], len(document.spans))
    assert [smollm2_tokenizer.decode(a) for a in answers] == document.answers
    assert ilm.split_answers(encoded[:-1], ids[tokens.answer], len(document.spans)) is None
    with pytest.raises(Exception, match="not one token"):
        ilm.IlmTokens(sep="[sep]").check(smollm2_tokenizer)


def test_continuation_prompt_has_no_trailing_space(smollm2_tokenizer):
    prompt = formats.continuation_prompt("It was late. ", smollm2_tokenizer)
    assert prompt == "<|endoftext|>Continue the given text:\n\nIt was late."
    span = formats.choose_span("It was late. The rain had not stopped all day.",
                               np.random.default_rng(0))
    assert span is not None and span.words == 7


def test_the_tune_split_is_what_the_adapters_hold_out():
    from ctrlg.tasks.stories.adaptation import split_passages

    tune = [s.text for s in load_stories("tune")]
    trained, heldout = split_passages({"data": {}})
    assert heldout == tune and len(tune) == 200
    assert not set(tune) & set(trained)
    assert [s.index for s in load_stories("train")][-200:] == [s.index for s in load_stories("tune")]
