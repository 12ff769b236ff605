"""The vocabulary: the exact bytes each token id stands for, EOS ids and sizes, built once per tokenizer.

Tokenizer-aware builders (word counts, keywords, regex compilation), the sampler, ReLM and the
HMM's checks reason about the *bytes* a token contributes to the decoded text, not about its
display string:

* byte-level BPE (GPT-2, SmolLM2, Llama-3): token strings are bytes mapped to printable code
  points by GPT-2's ``bytes_to_unicode`` table (``Ġ`` is the space byte 0x20); we invert that table;
* SentencePiece-style (Llama-2, Mistral, T5): ``▁`` stands for a space and byte-fallback tokens
  ``<0xNN>`` for the single byte NN; other pieces are UTF-8 text;
* special tokens (BOS/EOS/pad, chat markers, any "special" added token) decode to ``b""``: they
  contribute no text, and constraints handle them by id.

A token may be a partial UTF-8 sequence (e.g. the first byte of a multi-byte character); that is why
the vocabulary stores bytes, not ``str``.

Two rules live here and nowhere else:

* **EOS** (:func:`eos_token_ids`): the tokenizer's ``eos_token_id`` first, then the model's
  ``generation_config.eos_token_id`` and ``config.eos_token_id`` entries, duplicates removed,
  order kept. The first id is *the* EOS (``Vocabulary.eos_token_id``: padding, ``dfa.eos``); all
  of them end a generation.
* **The LM's vocabulary width** (:func:`lm_vocab_size`): the number of rows of the model's output
  embedding (what ``scores`` has), else ``config.vocab_size``. LMs often pad it beyond the
  tokenizer's size; the padded ids are tokens with no text (``b""``).

:class:`Vocabulary` is built once per tokenizer (:meth:`Vocabulary.from_tokenizer` memoises it per
tokenizer object and per vocabulary fingerprint); artefacts derived from it (the byte trie, the
canonical pair checker, ...) are memoised on the object itself (:meth:`Vocabulary.memo`), so a
vocabulary and everything built from it live and die together.
"""

from __future__ import annotations

import hashlib
import json
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Sequence

from ctrlg.errors import ConstraintError, CtrlgError, VocabularyMismatchError

__all__ = ["Vocabulary", "VocabularyIndex", "as_vocabulary", "eos_token_ids", "lm_vocab_size", "tokenizer_of",
           "spec_then_vocabulary",
           "token_bytes", "tokenizer_fingerprint", "bytes_to_unicode", "UndecodableVocabularyError"]


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


def tokenizer_fingerprint(tokenizer) -> str:
    """A stable hash of a tokenizer's vocabulary (token strings in id order), used to check that a
    checkpoint is used with the tokenizer it was made for. A :class:`Vocabulary` gives its own."""
    if isinstance(tokenizer, Vocabulary):
        return tokenizer.fingerprint
    vocab = tokenizer.get_vocab()
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    digest = hashlib.sha256()
    for token, index in ordered:
        digest.update(f"{index}\t{token}\n".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:16]


def _as_id_list(value) -> list[int]:
    """``None`` / an int / a list / a tensor of ids → a list of ints."""
    if value is None:
        return []
    if hasattr(value, "reshape") and hasattr(value, "tolist"):   # torch / numpy arrays
        value = value.reshape(-1).tolist()
    if isinstance(value, (int,)) or hasattr(value, "__index__"):
        return [int(value)]
    return [int(v) for v in value]


def eos_token_ids(tokenizer=None, model=None) -> list[int]:
    """THE EOS rule (module docstring): the tokenizer's EOS first, then the model's
    ``generation_config`` and ``config`` EOS ids; duplicates removed, order kept. May be empty."""
    ids: list[int] = []
    if isinstance(tokenizer, Vocabulary):
        ids += list(tokenizer.eos_token_ids)
    elif tokenizer is not None:
        ids += _as_id_list(getattr(tokenizer, "eos_token_id", None))
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        ids += _as_id_list(getattr(source, "eos_token_id", None) if source is not None else None)
    return list(dict.fromkeys(ids))


def lm_vocab_size(model) -> int:
    """THE rule for the LM's (padded) vocabulary width: rows of the output embedding, else
    ``config.vocab_size`` (of the text config for multimodal models)."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if out is not None and hasattr(out, "weight"):
        return int(out.weight.shape[0])
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    size = getattr(config, "vocab_size", None)
    if size is None:
        raise VocabularyMismatchError(
            f"cannot tell the output vocabulary size of {type(model).__name__}: it has neither "
            "an output embedding nor config.vocab_size")
    return int(size)


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
class Vocabulary:
    """Per-tokenizer facts every tokenizer-aware component needs (module docstring).

    Build with :meth:`from_tokenizer` (memoised) or :meth:`from_model`; pass it wherever a
    tokenizer is accepted. ``vocab.padded(V)`` is the same vocabulary over an LM's wider output
    layer (ids ``≥ num_tokenizer_tokens`` decode to ``b""``).

    Attributes:
        tokens: ``tokens[i]`` is the byte string token id ``i`` contributes to the decoded text
            (``b""`` for special and padded ids). Length = ``vocab_size``.
        special_ids: ids of special tokens (contribute no text).
        eos_token_ids: the EOS ids (:func:`eos_token_ids`); ``eos_token_id`` is the first or None.
        kind: 'byte_level', 'sentencepiece' or 'unknown'.
        fingerprint: hash of the tokenizer's vocabulary (:func:`tokenizer_fingerprint`).
        num_tokenizer_tokens: the tokenizer's own size (``≤ vocab_size``).
        name: the tokenizer's ``name_or_path``.
        tokenizer: the tokenizer it was built from (None when built from bytes), for builders
            that must call ``encode`` (canonical encodings).
    """

    tokens: tuple[bytes, ...]
    special_ids: frozenset[int]
    eos_token_ids: tuple[int, ...]
    kind: str
    fingerprint: str
    num_tokenizer_tokens: int
    name: str = ""
    tokenizer: object = field(default=None, repr=False)
    _memo: dict = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_tokenizer(cls, tokenizer, *, vocab_size: int | None = None) -> "Vocabulary":
        """The vocabulary of a ``transformers`` tokenizer, built once per tokenizer object (and per
        fingerprint); a Vocabulary is returned as is. ``vocab_size`` pads it (:meth:`padded`)."""
        vocab = tokenizer if isinstance(tokenizer, Vocabulary) else _MEMO.get(tokenizer)
        return vocab if vocab_size is None else vocab.padded(vocab_size)

    @classmethod
    def from_model(cls, model, tokenizer) -> "Vocabulary":
        """The tokenizer's vocabulary padded to the LM's output width (:func:`lm_vocab_size`),
        with the model's EOS ids added (:func:`eos_token_ids`)."""
        base = cls.from_tokenizer(tokenizer).padded(lm_vocab_size(model))
        eos = tuple(eos_token_ids(base, model))
        if eos == base.eos_token_ids:
            return base
        return base.memo(("eos", eos), lambda: base._replace(eos_token_ids=eos))

    @classmethod
    def from_token_bytes(cls, tokens: Sequence[bytes], *, eos_token_id=None,
                         special_ids: Sequence[int] = ()) -> "Vocabulary":
        """A vocabulary from raw token bytes (tests, tokenizer-free use)."""
        tokens = tuple(bytes(t) for t in tokens)
        digest = hashlib.sha256(b"\0".join(tokens)).hexdigest()[:16]
        return cls(tokens=tokens, special_ids=frozenset(int(i) for i in special_ids),
                   eos_token_ids=tuple(_as_id_list(eos_token_id)), kind="bytes",
                   fingerprint=digest, num_tokenizer_tokens=len(tokens))

    def _replace(self, **changes) -> "Vocabulary":
        values = {k: getattr(self, k) for k in ("tokens", "special_ids", "eos_token_ids", "kind",
                                                "fingerprint", "num_tokenizer_tokens", "name",
                                                "tokenizer")}
        values.update(changes)
        return Vocabulary(**values)

    def padded(self, vocab_size: int) -> "Vocabulary":
        """This vocabulary over ``vocab_size ≥ self.vocab_size`` ids (extra ids decode to ``b""``);
        memoised, and ``self`` when the size is unchanged."""
        V = int(vocab_size)
        if V == self.vocab_size:
            return self
        if V < self.vocab_size:
            raise ConstraintError(
                f"vocab_size={V} is smaller than the tokenizer's {self.vocab_size} tokens")
        return self.memo(("padded", V),
                         lambda: self._replace(tokens=self.tokens + (b"",) * (V - self.vocab_size)))

    def memo(self, key, factory: Callable[[], object]):
        """``factory()`` computed once per vocabulary and ``key`` (derived artefacts: tries,
        pair checkers, padded copies)."""
        with _LOCK:
            if key not in self._memo:
                self._memo[key] = factory()
            return self._memo[key]

    # ------------------------------------------------------------------ queries
    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def eos_token_id(self) -> int | None:
        """The first EOS id (padding, ``dfa.eos``), or None."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @classmethod
    def for_tokenizer(cls, tokenizer) -> "Vocabulary":
        """Old name of :meth:`from_tokenizer`."""
        return cls.from_tokenizer(tokenizer)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """Concatenated bytes of a token sequence (special tokens contribute nothing)."""
        return b"".join(self.tokens[int(i)] for i in ids)

    def decode(self, ids: Sequence[int]) -> str:
        """The decoded text, with invalid UTF-8 replaced by U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def ids_for_bytes(self, data: bytes) -> list[int]:
        """All non-special token ids whose bytes equal ``data``."""
        def table() -> dict[bytes, list[int]]:
            out: dict[bytes, list[int]] = {}
            for index, raw in enumerate(self.tokens):
                if index not in self.special_ids:
                    out.setdefault(raw, []).append(index)
            return out
        return list(self.memo("by_bytes", table).get(data, []))


#: Old name of :class:`Vocabulary`.
VocabularyIndex = Vocabulary

_LOCK = threading.RLock()


class _Memo:
    """THE memo of :meth:`Vocabulary.from_tokenizer`: per tokenizer object (weakly; by id for
    objects that cannot be weakly referenced), then per fingerprint (the same tokenizer loaded
    twice shares one vocabulary). A tokenizer that grew (added tokens) is rebuilt."""

    def __init__(self):
        self.by_object: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self.by_id: dict[int, Vocabulary] = {}
        self.by_fingerprint: dict[str, Vocabulary] = {}

    def get(self, tokenizer) -> Vocabulary:
        with _LOCK:
            try:
                vocab = self.by_object.get(tokenizer)
            except TypeError:   # not weak-referenceable
                vocab = self.by_id.get(id(tokenizer))
            if vocab is not None and vocab.num_tokenizer_tokens == _size(tokenizer, vocab):
                return vocab
            vocab = self._build(tokenizer)
            try:
                self.by_object[tokenizer] = vocab
            except TypeError:
                self.by_id[id(tokenizer)] = vocab
            return vocab

    def _build(self, tokenizer) -> Vocabulary:
        try:
            fingerprint = tokenizer_fingerprint(tokenizer)
        except AttributeError as exc:
            raise UndecodableVocabularyError(
                f"{type(tokenizer).__name__} is not a tokenizer (it has no get_vocab()); pass a "
                "transformers tokenizer or a ctrlg.Vocabulary") from exc
        vocab = self.by_fingerprint.get(fingerprint)
        if vocab is None:
            vocab = self.by_fingerprint[fingerprint] = _build_vocabulary(tokenizer, fingerprint)
        return vocab


def _size(tokenizer, vocab: Vocabulary) -> int:
    try:
        return max(len(tokenizer), vocab.num_tokenizer_tokens)
    except TypeError:
        return vocab.num_tokenizer_tokens


_MEMO = _Memo()


def _build_vocabulary(tokenizer, fingerprint: str) -> Vocabulary:
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
    return Vocabulary(tokens=tuple(tokens), special_ids=frozenset(special),
                      eos_token_ids=tuple(eos_token_ids(tokenizer)), kind=kind,
                      fingerprint=fingerprint, num_tokenizer_tokens=len(tokens),
                      name=str(getattr(tokenizer, "name_or_path", "") or ""), tokenizer=tokenizer)


def as_vocabulary(tokenizer_or_vocab, vocab_size: int | None = None) -> Vocabulary:
    """A :class:`Vocabulary` from a Vocabulary or a tokenizer (converted once, memoised), padded to
    ``vocab_size`` when given. Failures to decode the vocabulary raise VocabularyMismatchError."""
    try:
        return Vocabulary.from_tokenizer(tokenizer_or_vocab, vocab_size=vocab_size)
    except CtrlgError:
        raise
    except Exception as exc:  # a tokenizer whose vocabulary has no byte decoding
        raise VocabularyMismatchError(
            f"cannot decode the vocabulary of {type(tokenizer_or_vocab).__name__} to bytes: "
            f"{exc}") from exc


def token_bytes(tokenizer) -> list[bytes]:
    """``[bytes of token 0, bytes of token 1, ...]`` for a tokenizer or Vocabulary."""
    return list(as_vocabulary(tokenizer).tokens)


def tokenizer_of(tokenizer_or_vocab, what: str = "this builder"):
    """The ``transformers`` tokenizer behind a tokenizer or Vocabulary, for builders that must
    call ``encode`` (keywords, canonical encodings). Raises VocabularyMismatchError for a
    Vocabulary built from raw bytes."""
    if not isinstance(tokenizer_or_vocab, Vocabulary):
        return tokenizer_or_vocab
    if tokenizer_or_vocab.tokenizer is None:
        raise VocabularyMismatchError(
            f"{what} needs a tokenizer's encode(); this Vocabulary was built from raw token bytes "
            "— build it with Vocabulary.from_tokenizer(tokenizer)")
    return tokenizer_or_vocab.tokenizer


def is_vocabulary_like(value) -> bool:
    """Whether ``value`` is a Vocabulary or a tokenizer (has ``get_vocab``)."""
    return isinstance(value, Vocabulary) or hasattr(value, "get_vocab")


def spec_then_vocabulary(first, second, builder: str = "this builder", spec: str = "spec"):
    """``(spec, vocabulary)`` from the two leading arguments of a tokenizer-aware builder, in
    either order: the documented order is what the constraint is about first, then the
    vocabulary (as ``regex(pattern, vocab)``); the older vocabulary-first order still works,
    with a DeprecationWarning naming ``builder``."""
    if is_vocabulary_like(first) and not is_vocabulary_like(second):
        warnings.warn(f"{builder}(tokenizer, {spec}, ...) is deprecated: give the {spec} first, "
                      f"{builder}({spec}, tokenizer, ...)", DeprecationWarning, stacklevel=3)
        return second, first
    return first, second
