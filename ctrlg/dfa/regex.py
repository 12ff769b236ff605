"""Regex → token DFA over a tokenizer's vocabulary (the Outlines index, as a :class:`TokenDFA`).

``regex(pattern, tokenizer, encodings="all")`` accepts exactly the token sequences whose bytes,
concatenated, are the UTF-8 encoding of a string ``s`` with ``re.fullmatch(pattern, s)``,
optionally followed by EOS tokens:

    L_tok = { t_1..t_n (EOS)* : bytes(t_1)···bytes(t_n) = utf8(s), s ∈ L(pattern) }.

Construction. The pattern's minimal byte DFA ``(Q, δ, q0, F)`` (:mod:`ctrlg.dfa.bytes_dfa`)
gives the token DFA directly: its states are ``Q`` (0 = dead) plus one *ended* state, and

    δ_tok(q, t) = δ*(q, bytes(t))      if that byte path never dies,
    δ_tok(q, EOS) = ended              for q ∈ F,   δ_tok(ended, EOS) = ended,

every other token going to the dead state (the default successor). Tokens that act identically
on the byte DFA's live states (same transformation q ↦ δ*(q, bytes(t))) are one *letter*; the
transformations are computed once per distinct (prefix transformation, byte class) pair over a
byte trie of the vocabulary (:func:`vocab_trie.token_transformations`), so the cost does not grow
with the number of tokens a character class admits, and the DFA is stored over letters.
Byte-level BPE (``Ġ``), byte-fallback ``<0x..>`` tokens and tokens holding partial UTF-8
sequences need no special case: a token is just its bytes, and the byte DFA only accepts valid
UTF-8, so any accepted concatenation decodes to a matching string. Accepting states are ``F``
and *ended*: a sequence is accepted whether or not it ends with EOS.

``encodings="canonical"`` keeps only the tokenizer's own segmentation; see
:mod:`ctrlg.dfa.canonical`.
"""

from __future__ import annotations

import numpy as np

from ctrlg.dfa.bytes_dfa import ByteDFA, compile_bytes_dfa
from ctrlg.dfa.core import TokenDFA
from ctrlg.dfa.vocab_trie import VocabTrie, token_transformations, vocab_trie
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError

__all__ = ["regex", "token_dfa_from_bytes_dfa", "ENCODINGS"]

ENCODINGS = ("all", "canonical")
_AUTO = object()


def regex(pattern: str, tokenizer, encodings: str = "all", *, eos_token_id=_AUTO,
          vocab_size: int | None = None, max_pair_checks: int = 5_000_000,
          minimize: bool = True) -> TokenDFA:
    """Compile ``pattern`` (full-match semantics) into a :class:`TokenDFA` over the vocabulary.

    Args:
        pattern: a regular expression in the syntax of :mod:`ctrlg.dfa.regex_syntax`.
        tokenizer: a ``transformers`` tokenizer, a :class:`VocabTrie`, or a list of token bytes.
        encodings: ``"all"`` — every token sequence that decodes to a matching string;
            ``"canonical"`` — only ``tokenizer.encode(s, add_special_tokens=False)`` for matching
            strings ``s`` (needs a ``transformers`` tokenizer).
        eos_token_id: the EOS token allowed (repeatedly) after a full match; default the
            tokenizer's ``eos_token_id``; ``None`` disables EOS edges.
        vocab_size: V of the DFA (default: the tokenizer's vocabulary size); may exceed it when
            the LM's embedding matrix is padded.
        max_pair_checks: canonical mode only; raise instead of checking more token pairs.
        minimize: return the minimal DFA (:func:`ctrlg.dfa.minimize`), whose default successors
            are the most common ones: far fewer stored exceptions for permissive regexes such as
            ``[^\n]*`` (what the Ctrl-G guide pays for); ``False`` keeps the raw index, whose
            default is the dead state.

    Raises:
        RegexError / UnsupportedRegexError: empty, invalid or non-regular pattern.
        VocabularyMismatchError: the vocabulary cannot be decoded to bytes.
        UnsatisfiableConstraintError: no token sequence spells a matching string.
        ConstraintError: bad ``encodings`` or ``vocab_size``.
    """
    if encodings not in ENCODINGS:
        raise ConstraintError(f"encodings must be one of {ENCODINGS}, got {encodings!r}")
    bdfa = compile_bytes_dfa(pattern)
    if encodings == "canonical":
        from ctrlg.dfa.canonical import canonical_token_dfa

        return canonical_token_dfa(bdfa, tokenizer, eos_token_id=eos_token_id,
                                   vocab_size=vocab_size, max_pair_checks=max_pair_checks,
                                   what=f"regex {pattern!r}")
    dfa = token_dfa_from_bytes_dfa(bdfa, vocab_trie(tokenizer), eos_token_id=eos_token_id,
                                   vocab_size=vocab_size, what=f"regex {pattern!r}")
    if minimize:
        from ctrlg.dfa.minimize import minimize as minimize_dfa

        dfa = minimize_dfa(dfa)
    return dfa


def resolve_eos(trie: VocabTrie, eos_token_id) -> int | None:
    return trie.eos_token_id if eos_token_id is _AUTO else eos_token_id


def resolve_vocab_size(trie: VocabTrie, vocab_size: int | None, eos: int | None) -> int:
    V = trie.vocab_size if vocab_size is None else int(vocab_size)
    if V < trie.vocab_size:
        raise ConstraintError(
            f"vocab_size={vocab_size} is smaller than the tokenizer's {trie.vocab_size} tokens")
    if eos is not None and not 0 <= eos < V:
        raise ConstraintError(f"eos_token_id {eos} out of range [0, {V})")
    return V


def byte_classes(table: np.ndarray, live: np.ndarray) -> tuple[np.ndarray, int | None]:
    """``(byte_class [256], dead_class)``: bytes with equal columns in the byte DFA (restricted
    to live states) share a class; ``dead_class`` is the class that kills every live state
    (``None`` if there is none)."""
    cols = np.where(live[table], table, 0)[live].T     # [256, live states]
    cols = np.ascontiguousarray(cols)
    keys = cols.view(np.dtype((np.void, cols.dtype.itemsize * max(cols.shape[1], 1)))).ravel()
    _, byte_class = np.unique(keys, return_inverse=True)
    byte_class = byte_class.ravel().astype(np.int64)
    dead = np.flatnonzero(~cols.any(axis=1))
    return byte_class, (int(byte_class[dead[0]]) if len(dead) else None)


def token_dfa_from_bytes_dfa(bdfa: ByteDFA, trie: VocabTrie, *, eos_token_id=_AUTO,
                             vocab_size: int | None = None, what: str = "pattern") -> TokenDFA:
    """The all-encodings token DFA of a byte DFA (module docstring), over letters.

    States: byte-DFA states (0 dead) plus ``ended`` = Q. Bytes with equal columns form classes
    (:func:`byte_classes`); each token's transformation of the live states,
    ``q ↦ δ*(q, bytes(t))``, is computed once per distinct (prefix transformation, class) pair
    over the vocabulary trie (:func:`vocab_trie.token_transformations`). Tokens with the same
    transformation are one *letter*; the DFA stores its exceptions over letters (plus one
    letter for EOS, and one for tokens that are never an exception: no bytes, or dead from every
    state). Cost: O(trie nodes) vectorised for the keys, O(distinct pairs × live states) for the
    transformations, O(letters × live states) for the edges."""
    eos = resolve_eos(trie, eos_token_id)
    V = resolve_vocab_size(trie, vocab_size, eos)
    live = bdfa.live()
    if not live[bdfa.initial]:
        raise UnsatisfiableConstraintError(f"the {what} matches no string")
    Q = bdfa.num_states
    byte_class, _ = byte_classes(bdfa.table, live)
    C = int(byte_class.max()) + 1
    first_byte = np.zeros(C, dtype=np.int64)
    first_byte[byte_class[::-1]] = np.arange(255, -1, -1)
    class_table = np.where(live[bdfa.table], bdfa.table, 0)[:, first_byte]
    sources = np.nonzero(live)[0]
    tok_fid, F = token_transformations(trie, class_table, sources, byte_class)
    used = np.unique(tok_fid[tok_fid >= 0])
    A = len(used) + 1                       # letters 0..A-2: transformations; A-1: never
    letter_of_fid = np.full(len(F), A - 1, dtype=np.int64)
    letter_of_fid[used] = np.arange(len(used))
    letter_of_token = np.full(V, A - 1, dtype=np.int64)
    letter_of_token[:trie.vocab_size] = np.where(tok_fid >= 0, letter_of_fid[tok_fid], A - 1)
    let, i = np.nonzero(F[used])
    src, end = sources[i], F[used][let, i].astype(np.int64)
    ended = Q
    if eos is not None:
        letter_of_token[eos] = A           # EOS: a letter of its own
        acc = np.nonzero(bdfa.accepting & live)[0]
        src = np.concatenate([src, acc, [ended]])
        let = np.concatenate([let, np.full(len(acc) + 1, A)])
        end = np.concatenate([end, np.full(len(acc) + 1, ended)])
    order = np.lexsort((let, src))
    src, let, end = src[order], let[order], end[order]
    S = Q + 1
    exc_ptr = np.searchsorted(src, np.arange(S + 1)).astype(np.int64)
    accepting = np.zeros(S, dtype=bool)
    accepting[:Q] = bdfa.accepting & live
    accepting[ended] = eos is not None
    dfa = TokenDFA(vocab_size=V, initial=int(bdfa.initial), accepting=accepting,
                   default=np.zeros(S, dtype=np.int64), exc_ptr=exc_ptr,
                   exc_tokens=let, exc_next=end, letter_of_token=letter_of_token)
    if not _reaches_acceptance(dfa):
        raise UnsatisfiableConstraintError(
            f"the {what} matches strings, but no token sequence of this vocabulary spells one")
    return dfa


def _reaches_acceptance(dfa: TokenDFA) -> bool:
    return not dfa.is_empty()
