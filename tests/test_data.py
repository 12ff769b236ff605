"""Dataset readers and the ILM-style hierarchical mask."""

import json

import numpy as np
import pytest

from ctrlg.data import (DatasetError, Granularity, calibrate_mask_probability, load_commongen,
                        load_lambada, load_lambada_passages, mask_document, mask_hierarchical,
                        mask_ratio, parse_concept_set, parse_hierarchy)


def test_bundled_commongen_dev():
    items = load_commongen()
    assert len(items) == 993
    assert sum(len(i.references) for i in items) == 4018
    first = items[0]
    assert first.concepts == ("field", "look", "stand")
    assert first.pos == ("NOUN", "VERB", "VERB")
    assert first.references[0].startswith("The player stood")
    assert len(load_commongen(limit=5)) == 5


def test_commongen_custom_path_and_errors(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"concept_set": "apple#tree", "scene": ["An apple tree."]}) + "\n\n")
    (item,) = load_commongen(path)
    assert item.concepts == ("apple", "tree") and item.pos == (None, None)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"concept_set": "a"}\nnot json\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:2"):
        load_commongen(bad)
    with pytest.raises(DatasetError, match="does not exist"):
        load_commongen(tmp_path / "missing.jsonl")
    with pytest.raises(DatasetError, match="limit"):
        load_commongen(limit=-1)
    with pytest.raises(DatasetError, match="empty concept"):
        parse_concept_set("a##b")


def test_lambada_context_and_target():
    items = load_lambada(limit=3)
    assert items[0].target == "signs"
    assert items[0].context.endswith("I don't care about")
    assert len(load_lambada()) == 5153
    passages = load_lambada_passages(limit=2)
    assert passages[0] == items[0].context + " " + items[0].target


TEXT = "One two three. Four five!\n\nSix seven eight. Nine ten eleven twelve?"


def test_parse_hierarchy_offsets():
    hierarchy = parse_hierarchy(TEXT)
    assert len(hierarchy) == 2
    (p0, sentences0), (p1, sentences1) = hierarchy
    assert TEXT[slice(*p0)] == "One two three. Four five!"
    assert [TEXT[slice(*s)] for s, _ in sentences1] == ["Six seven eight.", "Nine ten eleven twelve?"]
    assert [TEXT[slice(*w)] for w in sentences0[0][1]] == ["One", "two", "three."]


def test_mask_extremes():
    assert mask_hierarchical(TEXT, 0.0, np.random.default_rng(0)) == []
    (span,) = mask_hierarchical(TEXT, 1.0, np.random.default_rng(0))
    assert span.granularity is Granularity.DOCUMENT
    assert TEXT[span.start:span.end] == TEXT


class _ScriptedRng:
    """Replays chosen draws, so every branch of the hierarchy is exercised by hand."""

    def __init__(self, uniforms, integers=()):
        self.uniforms, self.ints = list(uniforms), list(integers)

    def random(self):
        return self.uniforms.pop(0)

    def integers(self, low, high):
        value = self.ints.pop(0)
        assert low <= value < high
        return value


def test_mask_each_granularity_by_script():
    p = 0.5
    draws = [0.9,            # document kept
             0.9,            # paragraph 0 kept
             0.1,            # sentence "One two three." masked
             0.9,            # sentence "Four five!" kept
             0.1, 0.9,       # word "Four" masked (n-gram length 1), "five!" kept
             0.1]            # paragraph 1 masked
    spans = mask_hierarchical(TEXT, p, _ScriptedRng(draws, integers=[1]))
    assert [(s.granularity, TEXT[s.start:s.end]) for s in spans] == [
        (Granularity.SENTENCE, "One two three."),
        (Granularity.WORD, "Four"),
        (Granularity.PARAGRAPH, "Six seven eight. Nine ten eleven twelve?"),
    ]
    # an n-gram longer than the rest of the sentence is clipped at its end
    draws = [0.9, 0.1, 0.9,  # document kept, paragraph 0 masked, paragraph 1 kept
             0.9, 0.1,       # sentence "Six seven eight." kept; n-gram of 8 from "Six" → clipped
             0.9, 0.1, 0.9]  # next sentence kept; 3-gram from "Nine"; "twelve?" kept
    spans = mask_hierarchical(TEXT, p, _ScriptedRng(draws, integers=[8, 3]))
    assert [(s.granularity, TEXT[s.start:s.end]) for s in spans] == [
        (Granularity.PARAGRAPH, "One two three. Four five!"),
        (Granularity.NGRAM, "Six seven eight."),
        (Granularity.NGRAM, "Nine ten eleven"),
    ]


def test_masked_document_reassembles_and_ratio():
    for seed in range(20):
        doc = mask_document(TEXT, 0.3, seed)
        pieces = doc.fragments
        rebuilt = pieces[0] + "".join(a + f for a, f in zip(doc.answers, pieces[1:]))
        assert rebuilt == TEXT
        starts = [s.start for s in doc.spans]
        assert starts == sorted(starts)
        assert all(a.end <= b.start for a, b in zip(doc.spans, doc.spans[1:]))
        words_masked = sum(len(a.split()) for a in doc.answers)
        assert mask_ratio(doc, "words") == pytest.approx(words_masked / 12)
        masked_chars = sum(len(a) for a in doc.answers)
        assert mask_ratio(doc) == pytest.approx(masked_chars / len(TEXT.strip()))
    assert mask_document(TEXT, 0.3, 7) == mask_document(TEXT, 0.3, 7)


def test_calibration_hits_target_ratio():
    texts = load_lambada_passages(limit=40)
    for target in (0.13, 0.32):
        p = calibrate_mask_probability(texts, target, seed=0, iterations=12)
        ratios = [mask_ratio(mask_document(t, p, i)) for i, t in enumerate(texts)]
        assert np.mean(ratios) == pytest.approx(target, abs=0.02)
    with pytest.raises(DatasetError, match="target_ratio"):
        calibrate_mask_probability(texts, 1.5)
    with pytest.raises(DatasetError, match="blank"):
        mask_document("   ", 0.5, 0)
