"""A tiny byte-level BPE tokenizer (GPT-2 pre-tokenizer, ~360 tokens) trained in memory, for
exhaustive canonical-encoding tests: small enough to enumerate every token pair and every token
sequence of a few tokens, with merges that interact across letters, digits and spaces."""

from functools import lru_cache

CORPUS = [
    "the cat sat on the mat", "a cat and a dog", "hello world", "the theme of the thesis",
    "at that time they sat there", "an ant ate an apple at ten", "tea at three",
    "john.doe@example.com", "mail me at ann@site.org", "data 2024 10 12 and 123 456",
    '{"name": "ann", "age": 30}', '{"id": 12, "ok": true}', "a.b.c", "hat heat he the",
]


@lru_cache(maxsize=1)
def tiny_bpe_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=360, special_tokens=["<eos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(CORPUS * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
