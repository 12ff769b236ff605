"""Canonical-encoding regex DFAs, checked against ``tokenizer.encode`` on the real SmolLM2
tokenizer in both directions: the canonical encoding of every matching string up to a length
bound is accepted, and every accepted token sequence up to a length bound is canonical."""

import itertools
import re

import pytest

from ctrlg import dfa
from ctrlg.dfa.canonical import is_canonical
from ctrlg.errors import ConstraintError, VocabularyMismatchError


@pytest.fixture(scope="module")
def tok():
    from ctrlg.models import load_tokenizer

    return load_tokenizer()


def _strings(pattern, alphabet, max_len):
    for n in range(max_len + 1):
        for chars in itertools.product(alphabet, repeat=n):
            s = "".join(chars)
            if re.fullmatch(pattern, s):
                yield s


def _accepted_sequences(d, max_len, eos, cap=20_000):
    out, stack = [], [(d.initial, ())]
    live = d.live_states()
    while stack and len(out) < cap:
        s, seq = stack.pop()
        if d.is_accepting(s) and seq:
            out.append(list(seq))
        if len(seq) >= max_len:
            continue
        tokens, nxt = d.exceptions(s)
        for t, n in zip(tokens.tolist(), nxt.tolist()):
            if t != eos and live[n]:
                stack.append((n, seq + (t,)))
    return out


CASES = [
    ("a|ab", "ab", 3),
    ("(ab|a)c?", "abc", 4),
    ("[0-9]{1,4}", "0129", 4),
    (" ?[a-c]{1,3}", " abc", 4),
    (r"\s?x\s*", " x\n\t", 4),
    ("é+|ü", "éüe", 3),
    ("(the|a) (cat|dog)s?", None, 0),
    (r"\d+\.\d*", "01.", 4),
    ("[,.!? ]{1,4}", ",.!? ", 4),
    ("'s|'t|x's", "'stx", 3),
    ("[a-c]+ [a-c]+", "abc ", 4),
]


@pytest.mark.parametrize("pattern, alphabet, max_len", CASES)
def test_canonical_is_exactly_the_tokenizers_segmentation(tok, pattern, alphabet, max_len):
    d = dfa.regex(pattern, tok, encodings="canonical")
    if alphabet is None:
        strings = [f"{a} {b}{s}" for a in ("the", "a") for b in ("cat", "dog") for s in ("", "s")]
    else:
        strings = list(_strings(pattern, sorted(set(alphabet)), max_len))
    assert strings
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False)
        assert d.accepts(ids), (pattern, s, ids)
        assert d.accepts(ids + [tok.eos_token_id])
    sequences = _accepted_sequences(d, 4, tok.eos_token_id)
    assert sequences
    for seq in sequences:
        assert is_canonical(seq, tok), (pattern, tok.convert_ids_to_tokens(seq))
    # canonical ⊆ all encodings
    d_all = dfa.regex(pattern, tok, encodings="all")
    for seq in sequences[:500]:
        assert d_all.accepts(seq)


def test_non_canonical_split_is_rejected(tok):
    d_all = dfa.regex("hello", tok, encodings="all")
    d_can = dfa.regex("hello", tok, encodings="canonical")
    canonical = tok.encode("hello", add_special_tokens=False)
    split = [tok.convert_tokens_to_ids(c) for c in "hello"]
    assert d_all.accepts(canonical) and d_all.accepts(split)
    assert d_can.accepts(canonical) and not d_can.accepts(split)


def test_pair_budget_raises_a_clear_error(tok):
    with pytest.raises(ConstraintError, match="max_pair_checks"):
        dfa.regex("[a-z]+", tok, encodings="canonical", max_pair_checks=1000)


def test_canonical_needs_a_byte_level_tokenizer():
    with pytest.raises(VocabularyMismatchError):
        dfa.regex("a", [b"a"], encodings="canonical")
