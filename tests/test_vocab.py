"""The vocabulary index maps every token to the exact bytes it decodes to."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ctrlg.errors import VocabularyMismatchError
from ctrlg.vocab import UndecodableVocabularyError, VocabularyIndex, bytes_to_unicode, token_bytes

TEXTS = [
    "Hello world, the dog runs in the park.",
    "  two spaces\tand a tab\nnewline",
    "naïve café — 東京 😀 emoji",
    "numbers 12345 and symbols #$%&*()",
]


def _byte_level_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 5, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def _sentencepiece_like_tokenizer():
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<eos>"] + byte_tokens)
    tok.train_from_iterator(TEXTS * 5, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def test_bytes_to_unicode_is_a_bijection():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert table[ord(" ")] == "\u0120"  # 'Ġ'


@pytest.mark.parametrize("make", [_byte_level_tokenizer, _sentencepiece_like_tokenizer])
def test_decode_bytes_round_trips_text(make):
    tokenizer = make()
    index = VocabularyIndex.for_tokenizer(tokenizer)
    assert index.vocab_size == len(tokenizer)
    assert index.tokens[tokenizer.eos_token_id] == b""
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        decoded = index.decode_bytes(ids).decode("utf-8")
        assert decoded.strip() == text.strip()
        # SentencePiece decoders drop the space of the first "▁"; the index keeps the bytes.
        reference = tokenizer.decode(ids)
        assert decoded == reference or (decoded.startswith(" ") and decoded[1:] == reference)


def test_byte_level_tokens_include_partial_utf8():
    tokenizer = _byte_level_tokenizer()
    raw = token_bytes(tokenizer)
    # The byte alphabet has all 256 single bytes, including UTF-8 continuation bytes alone.
    assert bytes([0x9F]) in raw
    assert VocabularyIndex.for_tokenizer(tokenizer).ids_for_bytes(b"e") == [tokenizer.convert_tokens_to_ids("e")]


def test_smollm2_index_round_trips(smollm2_tokenizer):
    index = VocabularyIndex.for_tokenizer(smollm2_tokenizer)
    assert index.kind == "byte_level"
    assert index.vocab_size == 49152
    assert index.tokens[smollm2_tokenizer.eos_token_id] == b""
    for text in TEXTS:
        ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
        assert index.decode_bytes(ids) == text.encode("utf-8")


def test_undecodable_vocabulary_is_named():
    class Opaque:
        name_or_path = "opaque"
        eos_token_id = None
        all_special_ids = []

        def get_vocab(self):
            return {"a": 0, "\x00weird": 1}

        def __len__(self):
            return 2

        def convert_tokens_to_string(self, pieces):
            return "\ufffd"

    with pytest.raises(UndecodableVocabularyError, match="weird|cannot decode"):
        token_bytes(Opaque())


def test_vocabulary_is_built_once_per_tokenizer_and_padded_on_demand():
    from ctrlg import Vocabulary
    from ctrlg.vocab import as_vocabulary

    tokenizer = _byte_level_tokenizer()
    vocab = Vocabulary.from_tokenizer(tokenizer)
    assert Vocabulary.from_tokenizer(tokenizer) is vocab and as_vocabulary(vocab) is vocab
    assert VocabularyIndex is Vocabulary and VocabularyIndex.for_tokenizer(tokenizer) is vocab
    assert vocab.eos_token_ids == (tokenizer.eos_token_id,) and vocab.eos_token_id == tokenizer.eos_token_id
    assert vocab.num_tokenizer_tokens == vocab.vocab_size == len(tokenizer)
    wide = vocab.padded(len(tokenizer) + 3)
    assert wide is vocab.padded(len(tokenizer) + 3) and vocab.padded(len(tokenizer)) is vocab
    assert wide.tokens[:len(tokenizer)] == vocab.tokens and wide.tokens[-3:] == (b"",) * 3
    assert wide.fingerprint == vocab.fingerprint and wide.num_tokenizer_tokens == len(tokenizer)
    assert token_bytes(vocab) == list(vocab.tokens)


def test_one_eos_rule_and_one_lm_width_rule():
    import torch

    from ctrlg import Vocabulary
    from ctrlg.vocab import eos_token_ids, lm_vocab_size

    class Config:
        eos_token_id = [7, 3]
        vocab_size = 99

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = Config()
            self.generation_config = type("G", (), {"eos_token_id": 5})()
            self.head = torch.nn.Linear(2, 12)

        def get_output_embeddings(self):
            return self.head

    tokenizer = _byte_level_tokenizer()
    eos = tokenizer.eos_token_id
    model = Model()
    # the tokenizer's EOS first, then the generation config's, then the config's; no duplicates
    assert eos_token_ids(tokenizer, model) == list(dict.fromkeys([eos, 5, 7, 3]))
    assert eos_token_ids(tokenizer) == [eos] and eos_token_ids(None, model) == [5, 7, 3]
    # the width is the output embedding's row count, else config.vocab_size
    assert lm_vocab_size(model) == 12
    model.get_output_embeddings = lambda: None
    assert lm_vocab_size(model) == 99
    model.config.vocab_size = len(tokenizer) + 2
    vocab = Vocabulary.from_model(model, tokenizer)
    assert vocab.vocab_size == len(tokenizer) + 2 and vocab.eos_token_ids[0] == eos
    assert set(vocab.eos_token_ids) == {eos, 5, 7, 3}


def test_builders_accept_a_vocabulary_like_a_tokenizer():
    from ctrlg import Vocabulary, dfa

    tokenizer = _byte_level_tokenizer()
    vocab = Vocabulary.from_tokenizer(tokenizer)
    for build in (lambda t: dfa.regex("[a-z]+ (dog|park)", t),
                  lambda t: dfa.word_count(1, 3, t),
                  lambda t: dfa.keywords([["dog"], ["park"]], t),
                  lambda t: dfa.contains("park", t, "canonical")):
        a, b = build(tokenizer), build(vocab)
        assert a.num_states == b.num_states and a.vocab_size == b.vocab_size
        ids = tokenizer.encode("the dog runs in the park", add_special_tokens=False)
        assert a.accepts(ids) == b.accepts(ids)
    raw = Vocabulary.from_token_bytes([b"a", b"b", b""], eos_token_id=2)
    assert dfa.regex("ab", raw).accepts([0, 1, 2])
    with pytest.raises(VocabularyMismatchError, match="raw token bytes"):
        dfa.keywords([["a"]], raw)


def test_builders_take_the_spec_first_and_the_vocabulary_second():
    """As ``regex(pattern, vocab)``; the older vocabulary-first order gives the same automaton,
    with a DeprecationWarning."""
    from ctrlg import Vocabulary, dfa

    tokenizer = _byte_level_tokenizer()
    vocab = Vocabulary.from_tokenizer(tokenizer)
    ids = tokenizer.encode("the dog runs in the park", add_special_tokens=False)
    for new, old in ((lambda: dfa.keywords([["dog"], ["park"]], vocab),
                      lambda: dfa.keywords(tokenizer, [["dog"], ["park"]])),
                     (lambda: dfa.commongen_constraint(["dog_N", "park_N"], vocab, 2, 8),
                      lambda: dfa.commongen_constraint(tokenizer, ["dog_N", "park_N"], 2, 8))):
        a = new()
        with pytest.warns(DeprecationWarning, match="deprecated"):
            b = old()
        assert a.num_states == b.num_states and a.accepts(ids) == b.accepts(ids)
        assert a.accepts(ids + [tokenizer.eos_token_id]) == b.accepts(ids + [tokenizer.eos_token_id])
