"""The vocabulary index maps every token to the exact bytes it decodes to."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

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
