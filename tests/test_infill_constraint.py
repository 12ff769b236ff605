"""The infilling constraint against Python's ``re`` (the independent checker) on random masked
passages: the original and every fill of the right shape are accepted, fills of the wrong shape
are refused, and what the guided sampler draws always passes the checker."""

import random
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from ctrlg.data import Granularity, MaskedDocument, MaskedSpan, mask_document
from ctrlg.errors import ConstraintError
from ctrlg.tasks.infill.constraint import (build_constraint, completion_ok, completion_pattern,
                                           constraint_pieces)
from tiny_bpe import tiny_bpe_tokenizer

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ate", "hello", "world", "theme", "at",
         "tea", "ten", "ant", "apple", "john", "mail"]


def passage(rng: random.Random) -> str:
    paragraphs = []
    for _ in range(rng.randint(1, 2)):
        sentences = []
        for _ in range(rng.randint(1, 3)):
            words = [rng.choice(WORDS) for _ in range(rng.randint(2, 6))]
            if rng.random() < 0.3:
                words[rng.randrange(len(words))] += ","
            sentences.append(" ".join(words) + rng.choice([".", "!", "?"]))
        paragraphs.append(" ".join(sentences))
    text = "\n\n".join(paragraphs)
    return text[:-1] if rng.random() < 0.3 else text      # LAMBADA's unfinished last sentence


def fill(document: MaskedDocument, rng: random.Random, wrong: bool = False) -> str:
    """The passage with each span replaced by random text of its shape (``wrong``: one span gets
    one word too many or too few)."""
    bad = rng.randrange(len(document.spans)) if wrong else -1
    pieces = document.fragments
    out = [pieces[0]]
    for i, (span, fragment) in enumerate(zip(document.spans, pieces[1:])):
        n = len(document.text[span.start:span.end].split())
        if span.granularity == Granularity.SENTENCE:
            n = rng.randint(1, 5)
        if i == bad:
            n = n + 1 if n == 1 or rng.random() < 0.5 else n - 1
        words = [rng.choice(WORDS) for _ in range(n)]
        if span.granularity == Granularity.SENTENCE:
            words[-1] += "."
        out += [" ".join(words), fragment]
    return "".join(out)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_bpe_tokenizer()


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), p=st.sampled_from([0.1, 0.25, 0.5]))
def test_original_and_fills_of_the_right_shape_are_accepted_others_refused(tokenizer, seed, p):
    rng = random.Random(seed)
    document = mask_document(passage(rng), p, seed)
    if not document.spans or any(s.granularity == Granularity.DOCUMENT for s in document.spans):
        return
    constraint = build_constraint(document, tokenizer, len(tokenizer), tokenizer.eos_token_id)
    assert completion_ok(document, document.text)
    assert constraint.dfa.accepts(encode(tokenizer, document.text))
    for _ in range(4):
        good = fill(document, rng)
        assert completion_ok(document, good), (document.with_blanks("_"), good)
        assert constraint.dfa.accepts(encode(tokenizer, good))
        if all(s.granularity in (Granularity.WORD, Granularity.NGRAM) for s in document.spans):
            bad = fill(document, rng, wrong=True)
            assert not completion_ok(document, bad)
            assert not constraint.dfa.accepts(encode(tokenizer, bad))


def test_pieces_move_the_whitespace_before_a_blank_into_its_gap():
    text = "He ate the apple quickly.\n\nThen he slept well"
    document = MaskedDocument(text, (MaskedSpan(Granularity.WORD, 11, 16),
                                     MaskedSpan(Granularity.SENTENCE, 27, 45)))
    kinds = [(p.kind, p.text or p.pattern[:4]) for p in constraint_pieces(document)]
    assert kinds == [("text", "He ate the"), ("gap", r"\ \S"), ("text", " quickly."),
                     ("gap", re.escape("\n\n"))]
    # two blanks with only a space between them are one gap
    joined = MaskedDocument("a b c d", (MaskedSpan(Granularity.WORD, 2, 3),
                                        MaskedSpan(Granularity.WORD, 4, 5)))
    assert [p.kind for p in constraint_pieces(joined)] == ["text", "gap", "text"]
    assert completion_ok(joined, "a x y d") and not completion_ok(joined, "a x d")
    with pytest.raises(ConstraintError, match="no masked span"):
        constraint_pieces(MaskedDocument("a b", ()))


def test_a_sentence_gap_holds_exactly_one_sentence():
    document = MaskedDocument("It rained. We stayed in. Then it stopped.",
                              (MaskedSpan(Granularity.SENTENCE, 11, 24),))
    assert completion_ok(document, "It rained. We sat and read all day. Then it stopped.")
    assert completion_ok(document, 'It rained. "Stay," she said. Then it stopped.')
    assert not completion_ok(document, "It rained. We sat. We read. Then it stopped.")
    assert not completion_ok(document, "It rained.  Then it stopped.")
    assert re.fullmatch(completion_pattern(document), document.text)


def test_every_guided_sample_passes_the_independent_check(tokenizer):
    from ctrlg.fast_forward import sample_fast_forward
    from helpers import random_hmm, tiny_llama

    V = len(tokenizer)
    model = tiny_llama(V, seed=1, hidden=16)
    rng = random.Random(5)
    hmm = random_hmm(6, V, seed=2)
    checked = 0
    for seed in range(6):
        document = mask_document(passage(rng), 0.3, seed)
        if not document.spans:
            continue
        constraint = build_constraint(document, tokenizer, V, tokenizer.eos_token_id)
        for h in (None, hmm):
            samples = sample_fast_forward(model, [tokenizer.eos_token_id], constraint.dfa, hmm=h,
                                          num_samples=3, max_new_tokens=constraint.budget,
                                          eos_token_id=tokenizer.eos_token_id, seed=seed)
            for s in samples:
                assert s.accepted and s.token_ids[-1] == tokenizer.eos_token_id
                assert completion_ok(document, tokenizer.decode(s.token_ids[:-1]))
                checked += 1
    assert checked >= 20
    torch.manual_seed(0)
