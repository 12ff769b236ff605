"""Word counts, keywords, inflections and the CommonGen constraint.

Tiny in-memory tokenizers (byte-level BPE with ``Ġ`` and SentencePiece-style with ``▁``) allow
brute force over all token sequences; the real SmolLM2 tokenizer is checked on a few sentences.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrlg import dfa
from ctrlg.dfa.words import keyword_phrases, parse_concepts
from ctrlg.errors import ConstraintError
from ctrlg.vocab import token_bytes
from dfa_strategies import all_sequences, language


def reference_word_count(data: bytes) -> int:
    """Byte loop: a word is a run of non-whitespace with a letter, digit or non-ASCII byte."""
    words, counted = 0, False
    for b in data:
        if b in b" \t\n\r\x0b\x0c":
            counted = False
        elif not counted and (b >= 0x80 or chr(b).isalnum()):
            words, counted = words + 1, True
    return words


def _byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "a": 1, "b": 2, ",": 3, "Ġ": 4, "Ċ": 5, "Ġa": 6, "ab": 7, "Ġab": 8,
             ".": 9, "ĠaĠb": 10, "b.": 11}
    model = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "a"), ("a", "b"), ("Ġa", "b")]))
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=model, eos_token="<eos>")


def _sentencepiece_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "▁a": 1, "b": 2, ",": 3, "▁": 4, "<0x0A>": 5, "a": 6, "▁ab": 7, ".": 8,
             "▁a▁b": 9}
    model = Tokenizer(models.BPE(vocab=vocab, merges=[("▁", "a"), ("▁a", "b")], byte_fallback=True))
    model.pre_tokenizer = pre_tokenizers.Metaspace()
    model.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                       decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=model, eos_token="<eos>")


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece"])
def tiny_tokenizer(request):
    return _byte_level_tokenizer() if request.param == "byte_level" else _sentencepiece_tokenizer()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=12) | st.text(alphabet=" a,.\n-é\t", max_size=12))
def test_count_words_matches_byte_loop(text):
    data = text.encode("utf-8") if isinstance(text, str) else text
    assert dfa.count_words(text) == reference_word_count(data)


def test_count_words_rule_examples():
    assert dfa.count_words("The dog, a cat - and (birds).") == 6
    assert dfa.count_words(" , ... --") == 0
    assert dfa.count_words("naïve café 中文") == 3


@pytest.mark.parametrize("lo, hi", [(0, 0), (1, 2), (2, None), (0, 3)])
def test_word_count_dfa_by_brute_force(tiny_tokenizer, lo, hi):
    pieces = token_bytes(tiny_tokenizer)
    d = dfa.word_count(lo, hi, tiny_tokenizer)
    assert d.vocab_size == len(pieces)
    max_len = 4
    want = np.array([lo <= reference_word_count(b"".join(pieces[t] for t in s))
                     and (hi is None or reference_word_count(b"".join(pieces[t] for t in s)) <= hi)
                     for s in all_sequences(d.vocab_size, max_len)])
    assert (language(d, max_len) == want).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 11), min_size=5, max_size=12))
def test_word_count_dfa_on_longer_random_sequences(seq):
    tokenizer = _byte_level_tokenizer()
    pieces = token_bytes(tokenizer)
    d = dfa.word_count(2, 4, tokenizer)
    n = reference_word_count(b"".join(pieces[t] for t in seq))
    assert d.accepts(seq) == (2 <= n <= 4)


def test_word_count_is_small_over_letters(tiny_tokenizer):
    d = dfa.word_count(1, 3, tiny_tokenizer)
    assert d.has_letters and d.num_letters <= 8
    assert d.num_states <= 3 * 5 + 1


def test_word_count_padded_vocabulary():
    tokenizer = _byte_level_tokenizer()
    d = dfa.word_count(1, 1, tokenizer, vocab_size=16)
    assert d.vocab_size == 16
    assert d.accepts([6, 14, 15, 0]) and not d.accepts([14]) and not d.accepts([6, 6])
    with pytest.raises(ConstraintError, match="vocab_size=5"):
        dfa.word_count(1, 2, tokenizer, vocab_size=5)


def test_keywords_by_brute_force(tiny_tokenizer):
    groups = [["ab"], ["b", "a"]]
    d = dfa.keywords(groups, tiny_tokenizer)
    phrase_sets = [keyword_phrases(tiny_tokenizer, g) for g in groups]
    pieces = token_bytes(tiny_tokenizer)

    def ends_word(seq, end):   # the next token cannot continue the word
        return end == len(seq) or not pieces[seq[end]][:1].isalnum()

    def at(seq, i, p):
        return list(seq[i:i + len(p)]) == p and ends_word(seq, i + len(p))

    def ok(seq):
        return all(any(at(seq, i, p) for p in anywhere for i in range(len(seq)))
                   or any(at(seq, 0, p) for p in at_start)
                   for anywhere, at_start in phrase_sets)

    max_len = 4
    want = np.array([ok(s) for s in all_sequences(d.vocab_size, max_len)])
    assert (language(d, max_len) == want).all()
    assert want.any()


def test_keyword_phrases_on_smollm2(smollm2_tokenizer):
    tok = smollm2_tokenizer
    anywhere, at_start = keyword_phrases(tok, ["stand"])
    names = [tok.convert_ids_to_tokens(p) for p in anywhere]
    assert ["Ġstand"] in names and ["ĠStand"] in names
    assert ["stand"] in [tok.convert_ids_to_tokens(p) for p in at_start]


def test_keywords_must_end_a_word_on_smollm2(smollm2_tokenizer):
    tok = smollm2_tokenizer
    d = dfa.keywords([["look"]], tok)
    look, out = tok.convert_tokens_to_ids(["Ġlook", "out"])
    assert d.accepts(tok.encode("We look.", add_special_tokens=False))
    assert d.accepts(tok.encode("We look", add_special_tokens=False))
    assert d.accepts(tok.encode("look at it", add_special_tokens=False))
    assert not d.accepts([look, out])                                   # " lookout"
    assert d.accepts([look, out] + tok.encode(" look", add_special_tokens=False))
    assert d.accepts([look, tok.eos_token_id])


def test_word_count_on_smollm2_sentences(smollm2_tokenizer):
    tok = smollm2_tokenizer
    at_most_6, at_least_6 = dfa.word_count(0, 6, tok), dfa.word_count(6, None, tok)
    texts = ["The dog stood in the field.", "Hello, world! It's 3 p.m. - isn't it?",
             "  two   spaces\nand a newline", "naïve café — 中文 text", "a b c d e f g h i j k"]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        n = reference_word_count(text.encode("utf-8"))
        assert at_most_6.accepts(ids) == (n <= 6) and at_least_6.accepts(ids) == (n >= 6)


def test_inflections():
    assert set(dfa.inflections("stand", "V")) == {"stand", "stands", "stood", "standing"}
    assert set(dfa.inflections("field", "N")) == {"field", "fields"}
    assert dfa.inflections("look", "V")[0] == "look" and "looked" in dfa.inflections("look", "V")
    assert "looks" in dfa.inflections("look")
    assert "stood" in dfa.inflections("stood", "V") and "stand" in dfa.inflections("stood", "V")
    assert set(dfa.inflections("blorf", "V")) >= {"blorf", "blorfs", "blorfed", "blorfing"}
    with pytest.raises(ConstraintError, match="part of speech 'X'"):
        dfa.inflections("stand", "X")
    with pytest.raises(ConstraintError, match="non-empty word"):
        dfa.inflections("  ")


def test_parse_concepts():
    assert parse_concepts("field_N#look_V") == [("field", "N"), ("look", "V")]
    assert parse_concepts(["dog"]) == [("dog", None)]
    with pytest.raises(ConstraintError, match="empty concept"):
        parse_concepts("dog_N##cat_N")


def test_commongen_constraint_on_smollm2(smollm2_tokenizer):
    tok = smollm2_tokenizer
    eos = tok.eos_token_id
    d = dfa.commongen_constraint("field_N#look_V#stand_V", tok, min_words=5, max_words=20)
    assert d.vocab_size == len(token_bytes(tok)) and d.num_states < 2000

    def ids(text):
        return tok.encode(text, add_special_tokens=False)

    good = ids("The dog stood in the field and looked at the sky.")
    assert d.accepts(good + [eos]) and d.accepts(good + [eos, eos])
    assert not d.accepts(good)                                          # EOS required
    assert not d.accepts(good + [eos] + ids(" more"))                   # only EOS after EOS
    assert d.accepts(ids("Standing in a field, she looks up.") + [eos])  # capitalised, initial
    assert not d.accepts(ids("The dog stood in the meadow and looked.") + [eos])   # no field
    assert not d.accepts(ids("Look: field stands.") + [eos])            # 3 words < 5
    long = " and".join([" we looked at the field while we stood"] * 3)
    assert not d.accepts(ids(long.strip()) + [eos])                      # > 20 words
    relaxed = dfa.commongen_constraint(["field_N", "look_V", "stand_V"], tok, 5, 20,
                                       require_eos=False)
    assert relaxed.accepts(good)
    # a chat marker spells no text: banned by default, so a sentence cannot "end" with
    # <|im_start|> and go on as a new turn; special_tokens="allow" keeps the old language
    start = tok.convert_tokens_to_ids("<|im_start|>")
    assert start != eos and start in tok.all_special_ids
    marked = ids("The dog stood in the field") + [start] + ids(" and looked at it.") + [eos]
    assert not d.accepts(marked)
    allowed = dfa.commongen_constraint("field_N#look_V#stand_V", tok, min_words=5, max_words=20,
                                       special_tokens="allow")
    assert allowed.accepts(marked) and allowed.accepts(good + [eos])
    with pytest.raises(ConstraintError, match="special_tokens"):
        dfa.commongen_constraint("field_N", tok, special_tokens="drop")


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 4), st.lists(st.integers(0, 3), max_size=3), st.integers(0, 4))
def test_banned_tokens_by_enumeration(V, banned, n):
    banned = [b % V for b in banned]
    d = dfa.banned_tokens(banned, V)
    for seq in all_sequences(V, n):
        assert d.accepts(seq) == (not set(seq) & set(banned))


@pytest.mark.parametrize("call, message", [
    (lambda t: dfa.word_count(3, 2, t), "min_words=3 > max_words=2"),
    (lambda t: dfa.word_count(-1, 2, t), "min_words"),
    (lambda t: dfa.keywords([], t), "groups"),
    (lambda t: dfa.keywords([[]], t), "non-empty list"),
    (lambda t: dfa.keywords([[" ab"]], t), "surrounding whitespace"),
    (lambda t: dfa.keywords("ab", t), "groups"),
])
def test_bad_input(call, message):
    with pytest.raises(ConstraintError, match=message):
        call(_byte_level_tokenizer())


def _same_dfa(a, b) -> bool:
    """Identical automata: the same stored arrays (states, transitions, letters, accepting)."""
    x, y = a.to_arrays(), b.to_arrays()
    return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def test_builders_take_the_spec_first_and_warn_on_the_tokenizer_first_order():
    """word_count(min, max, tokenizer), keywords(groups, tokenizer),
    commongen_constraint(concepts, tokenizer, ...): no warning; the older tokenizer-first calls
    give the identical automaton with a DeprecationWarning naming the new order."""
    import warnings

    from ctrlg import Vocabulary

    tok = _byte_level_tokenizer()
    vocab = Vocabulary.from_tokenizer(tok)
    pairs = [  # (documented order, older order, what the warning shows)
        (lambda: dfa.word_count(1, 3, tok), lambda: dfa.word_count(tok, 1, 3),
         r"word_count\(min_words, max_words, tokenizer\)"),
        (lambda: dfa.word_count(2, None, vocab, vocab_size=14),
         lambda: dfa.word_count(vocab, 2, vocab_size=14), "word_count"),
        (lambda: dfa.word_count(0, 2, tok), lambda: dfa.word_count(tok, max_words=2), "word_count"),
        (lambda: dfa.word_count(tokenizer=tok, min_words=1), lambda: dfa.word_count(tok, min_words=1),
         "word_count"),
        (lambda: dfa.keywords([["ab"], ["b"]], tok, whole_word=False),
         lambda: dfa.keywords(tok, [["ab"], ["b"]], whole_word=False),
         r"keywords\(groups, tokenizer"),
        (lambda: dfa.commongen_constraint(["dog_N"], vocab, 1, 4),
         lambda: dfa.commongen_constraint(vocab, ["dog_N"], 1, 4),
         r"commongen_constraint\(concepts, tokenizer"),
    ]
    for new, old, message in pairs:
        with warnings.catch_warnings():
            warnings.simplefilter("error")              # the documented order never warns
            a = new()
        with pytest.warns(DeprecationWarning, match=message) as caught:
            b = old()
        assert caught[0].filename == __file__           # the warning points at the caller
        assert _same_dfa(a, b)
    # the documented order against brute force: [ab, Ġa, Ġb.] is "ab a b." = 3 words
    d = dfa.word_count(3, 3, tok)
    assert d.accepts([7, 6, 4, 11]) and not d.accepts([7, 6]) and not d.accepts([7, 10, 6])
    # the upper bound may be left out; the tokenizer may not
    assert _same_dfa(dfa.word_count(2, tok), dfa.word_count(2, None, tok))
    with pytest.raises(ConstraintError, match=r"word_count\(min_words, max_words, tokenizer\)"):
        dfa.word_count(1, 3)
    with pytest.raises(TypeError, match="max_word"):
        dfa.word_count(1, 3, tok, max_word=4)
