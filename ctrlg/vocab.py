"""The vocabulary index: the exact bytes each token id stands for, built once per tokenizer.

Tokenizer-aware builders (word counts, keywords, regex compilation) reason about the *bytes* a
token contributes to the decoded text, not about its display string:

* byte-level BPE (GPT-2, SmolLM2, Llama-3): token strings are bytes mapped to printable code
  points by GPT-2's ``bytes_to_unicode`` table (``Ġ`` is the space byte 0x20); we invert that table;
* SentencePiece-style (Llama-2, Mistral, T5): ``▁`` stands for a space and byte-fallback tokens
  ``<0xNN>`` for the single byte NN; other pieces are UTF-8 text;
* special tokens (BOS/EOS/pad, chat markers, any "special" added token) decode to ``b""``: they
  contribute no text, and constraints handle them by id.

A token may be a partial UTF-8 sequence (e.g. the first byte of a multi-byte character); that is why
the index stores bytes, not ``str``. The index is cached per tokenizer fingerprint.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

from ctrlg.errors import VocabularyMismatchError

__all__ = ["VocabularyIndex", "token_bytes", "bytes_to_unicode", "UndecodableVocabularyError"]


class UndecodableVocabularyError(VocabularyMismatchError):
    """A tokenizer whose tokens cannot be mapped to bytes."""


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters:
    printable Latin-1 bytes map to themselves, the others to code points 256, 257, ..."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _decoder_kind(tokenizer) -> str:
    """'byte_level', 'sentencepiece' or 'unknown', read from the fast tokenizer's JSON."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        text = json.dumps(spec.get("decoder")) + json.dumps(spec.get("pre_tokenizer"))
        if '"ByteLevel"' in text:
            return "byte_level"
        if '"Metaspace"' in text or '"ByteFallback"' in text or "\u2581" in text:
            return "sentencepiece"
    if hasattr(tokenizer, "byte_decoder"):
        return "byte_level"
    if hasattr(tokenizer, "sp_model"):
        return "sentencepiece"
    return "unknown"


def _special_ids(tokenizer) -> set[int]:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    for index, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(token, "special", False):
            special.add(int(index))
    return special


def _piece_bytes(piece: str, kind: str, byte_decoder: dict[str, int], tokenizer) -> bytes:
    if kind == "byte_level":
        try:
            return bytes(byte_decoder[ch] for ch in piece)
        except KeyError as err:
            raise UndecodableVocabularyError(
                f"byte-level token {piece!r} has the character {err.args[0]!r}, which is not in "
                "the byte-to-unicode table") from None
    if kind == "sentencepiece":
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode("utf-8")
    text = tokenizer.convert_tokens_to_string([piece])
    if "\ufffd" in text:
        raise UndecodableVocabularyError(
            f"cannot decode token {piece!r} of tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} "
            "to bytes: its decoder is neither byte-level BPE nor SentencePiece")
    return text.encode("utf-8")


@dataclass(frozen=True, eq=False)
class VocabularyIndex:
    """Per-tokenizer facts every tokenizer-aware builder needs.

    Attributes:
        tokens: ``tokens[i]`` is the byte string token id ``i`` contributes to the decoded text
            (``b""`` for special tokens). Length = ``vocab_size``.
        special_ids: ids of special tokens (contribute no text).
        eos_token_id: the tokenizer's EOS id (or None).
        kind: 'byte_level', 'sentencepiece' or 'unknown'.
        fingerprint: hash of the vocabulary (see ``ctrlg.hmm.tokenizer_fingerprint``).
    """

    tokens: tuple[bytes, ...]
    special_ids: frozenset[int]
    eos_token_id: int | None
    kind: str
    fingerprint: str
    _by_bytes: dict = field(default_factory=dict, repr=False)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @classmethod
    def for_tokenizer(cls, tokenizer) -> "VocabularyIndex":
        """The (cached) index of ``tokenizer``."""
        from ctrlg.hmm.model import tokenizer_fingerprint

        try:  # memoised per tokenizer object (hashing 50k tokens takes ~1 s)
            cached = _BY_TOKENIZER.get(tokenizer)
        except TypeError:  # not weak-referenceable
            cached = None
        if cached is not None and cached.vocab_size == max(len(tokenizer), cached.vocab_size):
            return cached
        index = _build_index(tokenizer_fingerprint(tokenizer), tokenizer)
        try:
            _BY_TOKENIZER[tokenizer] = index
        except TypeError:
            pass
        return index

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """Concatenated bytes of a token sequence (special tokens contribute nothing)."""
        return b"".join(self.tokens[int(i)] for i in ids)

    def decode(self, ids: Sequence[int]) -> str:
        """The decoded text, with invalid UTF-8 replaced by U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def ids_for_bytes(self, data: bytes) -> list[int]:
        """All non-special token ids whose bytes equal ``data``."""
        if not self._by_bytes:
            table: dict[bytes, list[int]] = {}
            for index, raw in enumerate(self.tokens):
                if index not in self.special_ids:
                    table.setdefault(raw, []).append(index)
            self._by_bytes.update(table)
        return list(self._by_bytes.get(data, []))


_INDEX_CACHE: dict[str, VocabularyIndex] = {}
_BY_TOKENIZER: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _build_index(fingerprint: str, tokenizer) -> VocabularyIndex:
    cached = _INDEX_CACHE.get(fingerprint)
    if cached is not None:
        return cached
    kind = _decoder_kind(tokenizer)
    byte_decoder = {ch: b for b, ch in bytes_to_unicode().items()}
    vocab = tokenizer.get_vocab()
    size = max(len(tokenizer), max(vocab.values()) + 1)
    pieces: list[str | None] = [None] * size
    for piece, index in vocab.items():
        pieces[index] = piece
    special = _special_ids(tokenizer)
    added_text = {int(i): t.content for i, t in
                  (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()
                  if not getattr(t, "special", False)}
    tokens = []
    for index, piece in enumerate(pieces):
        if piece is None or index in special:
            tokens.append(b"")
        elif index in added_text:  # added tokens are stored as plain text, not byte-mapped
            tokens.append(added_text[index].encode("utf-8"))
        else:
            tokens.append(_piece_bytes(piece, kind, byte_decoder, tokenizer))
    index = VocabularyIndex(tokens=tuple(tokens), special_ids=frozenset(special),
                            eos_token_id=tokenizer.eos_token_id, kind=kind, fingerprint=fingerprint)
    _INDEX_CACHE[fingerprint] = index
    return index


def token_bytes(tokenizer) -> list[bytes]:
    """``[bytes of token 0, bytes of token 1, ...]`` for ``tokenizer`` (special tokens → ``b""``)."""
    return list(VocabularyIndex.for_tokenizer(tokenizer).tokens)
