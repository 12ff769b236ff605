"""Canonical-encoding token DFAs: only the tokenizer's own segmentation of each matching string.

Definition. A token sequence ``t = t_1..t_n`` (no special tokens) is **canonical** for a
tokenizer iff ``b = bytes(t_1)···bytes(t_n)`` is valid UTF-8 and

    tokenizer.encode(b.decode("utf-8"), add_special_tokens=False) == [t_1, ..., t_n].

``regex(pattern, tokenizer, encodings="canonical")`` accepts exactly the canonical sequences
whose string fully matches ``pattern`` (optionally followed by EOS tokens).

Characterisation used (byte-level BPE with a GPT-2-style pre-tokenizer). BPE encodes each
pre-token independently, no token spans a pre-token boundary, and within a pre-token a token
sequence is the BPE encoding iff every adjacent pair is (the bigram property of BPE: Berglund
& van der Merwe 2023; Vieira et al. 2025, "Language models over canonical byte-pair
encodings"). The pre-tokenizer's split decisions between two tokens are visible in the pair as
well (``"a"+" b"`` splits, ``" "+"b"`` does not), so we use the **bigram test**:

    t is canonical  ⇔  [t_1] is canonical  and  every pair [t_i, t_{i+1}] is canonical,

where a pair is canonical iff ``encode(bytes(t_i) + bytes(t_{i+1})) == [t_i, t_{i+1}]``. When the
pair's bytes are not valid UTF-8 (a multi-byte character split across more than two tokens) the
pair lies inside one pre-token and only the BPE model decides:
``model.tokenize(byte_level(bytes)) == [t_i, t_{i+1}]``. The tests check the characterisation
against ``tokenizer.encode`` by enumeration on the SmolLM2 tokenizer, in both directions.

Construction (Tran-Thien's CartesianMerge, restricted to reachable pairs). The product of the
all-encodings token DFA (state ``q``) with "the last token read" (``a``): states ``(q, a)``,
``δ((q, a), t) = (δ(q, t), t)`` if the pair ``(a, t)`` is canonical. Only pairs reachable from
the start are built, level by level, and each level's unknown pairs are checked with one batched
``encode_batch`` call; results are cached per tokenizer. States with identical outgoing edges are
merged by :func:`ctrlg.dfa.minimize`. The number of pair checks is bounded by
``max_pair_checks``; beyond it a :class:`~ctrlg.errors.ConstraintError` is raised (regexes over
large token classes such as ``[a-z]+`` can need millions of pairs).
"""

from __future__ import annotations

import numpy as np

from ctrlg.dfa.bytes_dfa import ByteDFA
from ctrlg.dfa.core import TokenDFA
from ctrlg.dfa.minimize import minimize
from ctrlg.dfa.regex_index import resolve_eos, token_dfa_from_bytes_dfa
from ctrlg.dfa.vocab_trie import vocab_trie, vocabulary_index
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError, VocabularyMismatchError
from ctrlg.vocab import bytes_to_unicode, tokenizer_of

__all__ = ["canonical_token_dfa", "PairChecker", "is_canonical"]

START = -1


class PairChecker:
    """Cached canonicality tests of single tokens and token pairs for one byte-level BPE
    tokenizer (see the module docstring)."""

    def __init__(self, tokenizer):
        tokenizer = tokenizer_of(tokenizer, "canonical encodings")
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise VocabularyMismatchError(
                f"canonical encodings need a fast (Rust-backed) tokenizer; got "
                f"{type(tokenizer).__name__}")
        self.index = vocabulary_index(tokenizer)
        if self.index.kind != "byte_level":
            raise VocabularyMismatchError(
                f"canonical encodings support byte-level BPE tokenizers; this tokenizer's "
                f"decoder is {self.index.kind!r}")
        self.backend = backend
        self.tokens = self.index.tokens
        self.byte_char = bytes_to_unicode()
        self.pre_tokenizer = backend.pre_tokenizer
        self.pair_cache: dict[tuple[int, int], int] = {}
        self.single_cache: dict[int, int] = {}
        self._starts_nonspace: np.ndarray | None = None

    # -- window checks -------------------------------------------------------------
    def _bpe_ids(self, data: bytes) -> list[int]:
        return [t.id for t in self.backend.model.tokenize("".join(self.byte_char[b] for b in data))]

    def _window_ok(self, parts: tuple[bytes, ...], ids: list[int], next_nonspace: bool) -> bool:
        """Tokens ``ids`` with bytes ``parts`` (one or two) are canonical in a text where they
        are followed by a non-whitespace character (``next_nonspace``) or not: no pre-token
        boundary falls strictly inside a token, and tokens inside one pre-token are the BPE
        bigram (or unigram) of their bytes."""
        data = b"".join(parts)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:   # inside one multi-byte character: one pre-token
            return self._bpe_ids(data) == ids
        if self.pre_tokenizer is not None:
            pieces = self.pre_tokenizer.pre_tokenize_str(text + ("x" if next_nonspace else ""))
            char_to_byte = np.concatenate([[0], np.cumsum([len(ch.encode("utf-8"))
                                                           for ch in text + "x"])])
            bounds = {int(char_to_byte[start]) for _, (start, _) in pieces}
        else:
            bounds = set()
        cuts = np.cumsum([len(p) for p in parts])
        begin = 0
        for end in cuts:
            if any(begin < b < end for b in bounds):
                return False   # a token would span a pre-token boundary
            begin = end
        if len(parts) == 2 and int(cuts[0]) in bounds:
            return True        # different pre-tokens: BPE never merges across
        return self._bpe_ids(data) == ids

    def _verdicts(self, parts: tuple[bytes, ...], ids: list[int]) -> int:
        """Flag of the last token: REJECT, FREE (any continuation), NEEDS_NONSPACE (only if
        the next token starts with a non-whitespace character) or NEEDS_OTHER (only if the
        next token starts with whitespace, or the text ends)."""
        other = self._window_ok(parts, ids, next_nonspace=False)
        if not _ends_with_space(parts[-1]):
            return FREE if other else REJECT
        nonspace = self._window_ok(parts, ids, next_nonspace=True)
        return {(True, True): FREE, (True, False): NEEDS_NONSPACE,
                (False, True): NEEDS_OTHER, (False, False): REJECT}[(nonspace, other)]

    def singles(self, tokens) -> np.ndarray:
        """Flag (see :meth:`_verdicts`) per token as the first token of a text."""
        out = np.empty(len(tokens), dtype=np.int8)
        for k, t in enumerate(np.asarray(tokens).tolist()):
            flag = self.single_cache.get(t)
            if flag is None:
                flag = self.single_cache[t] = self._verdicts((self.tokens[t],), [t])
            out[k] = flag
        return out

    def pairs(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """Flag per pair (a, b): the verdict on b following a."""
        out = np.empty(len(left), dtype=np.int8)
        for k, key in enumerate(zip(np.asarray(left).tolist(), np.asarray(right).tolist())):
            flag = self.pair_cache.get(key)
            if flag is None:
                a, b = key
                flag = self.pair_cache[key] = self._verdicts(
                    (self.tokens[a], self.tokens[b]), [a, b])
            out[k] = flag
        return out

    def starts_nonspace(self, tokens: np.ndarray) -> np.ndarray:
        if self._starts_nonspace is None:
            self._starts_nonspace = np.array([_starts_nonspace(t) for t in self.tokens])
        return self._starts_nonspace[tokens]


REJECT, FREE, NEEDS_NONSPACE, NEEDS_OTHER = 0, 1, 2, 3


def _ends_with_space(data: bytes) -> bool:
    text = data.decode("utf-8", errors="ignore")
    return bool(text) and text[-1].isspace() and data.endswith(text[-1].encode("utf-8"))


def _starts_nonspace(data: bytes) -> bool:
    text = data.decode("utf-8", errors="ignore")
    if not data:
        return False
    if not text or not data.startswith(text[0].encode("utf-8")):
        return True            # starts inside or with an incomplete multi-byte character
    return not text[0].isspace()


def pair_checker(tokenizer) -> PairChecker:
    """The :class:`PairChecker` of a tokenizer or Vocabulary (memoised on the vocabulary)."""
    return vocabulary_index(tokenizer).memo("pair_checker", lambda: PairChecker(tokenizer))


def is_canonical(ids, tokenizer) -> bool:
    """Whether ``ids`` is the tokenizer's own encoding of its decoded string (the definition in
    the module docstring, evaluated directly with ``tokenizer.encode``)."""
    data = vocabulary_index(tokenizer).decode_bytes(ids)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    encoded = tokenizer_of(tokenizer, "is_canonical").encode(text, add_special_tokens=False)
    return list(encoded) == [int(i) for i in ids]


def canonical_token_dfa(bdfa: ByteDFA, tokenizer, *, eos_token_id, vocab_size: int | None,
                        max_pair_checks: int = 5_000_000, what: str = "pattern") -> TokenDFA:
    """The canonical-encodings token DFA of the byte DFA ``bdfa`` (module docstring)."""
    checker = pair_checker(tokenizer)
    trie = vocab_trie(tokenizer)
    all_dfa = token_dfa_from_bytes_dfa(bdfa, trie, eos_token_id=eos_token_id,
                                       vocab_size=vocab_size, what=what)
    eos = resolve_eos(trie, eos_token_id)
    byte_accepting = np.zeros(all_dfa.num_states, dtype=bool)
    byte_accepting[:bdfa.num_states] = bdfa.accepting

    def out_edges(q: int) -> tuple[np.ndarray, np.ndarray]:
        tokens, nxt = all_dfa.exceptions(q)
        if eos is not None:
            keep = tokens != eos
            tokens, nxt = tokens[keep], nxt[keep]
        return tokens, nxt

    # product states (q, last token, flag of the last token); id 0 = dead, 1 = start
    ids: dict[tuple[int, int, int], int] = {(all_dfa.initial, START, FREE): 1}
    keys: list[tuple[int, int, int]] = [(0, START, REJECT), (all_dfa.initial, START, FREE)]
    edges_src: list[np.ndarray] = []
    edges_tok: list[np.ndarray] = []
    edges_dst_q: list[np.ndarray] = []
    frontier = [1]
    checks = 0
    while frontier:
        src_l, tok_l, nq_l, last_l, need_l = [], [], [], [], []
        for sid in frontier:
            q, last, flag = keys[sid]
            tokens, nxt = out_edges(q)
            checks += len(tokens)
            if checks > max_pair_checks:
                raise ConstraintError(
                    f"the canonical automaton of the {what} needs more than max_pair_checks="
                    f"{max_pair_checks} token-pair checks; use encodings='all' or raise the "
                    f"limit")
            src_l.append(np.full(len(tokens), sid, dtype=np.int64))
            tok_l.append(tokens)
            nq_l.append(nxt)
            last_l.append(np.full(len(tokens), last, dtype=np.int64))
            need_l.append(np.full(len(tokens), flag, dtype=np.int8))
        src = np.concatenate(src_l)
        tok = np.concatenate(tok_l)
        nq = np.concatenate(nq_l)
        last = np.concatenate(last_l)
        need = np.concatenate(need_l)
        # the previous token's requirement on how this token starts
        starts = checker.starts_nonspace(tok)
        ok = ~(((need == NEEDS_NONSPACE) & ~starts) | ((need == NEEDS_OTHER) & starts))
        flags = np.zeros(len(tok), dtype=np.int8)
        first = ok & (last == START)
        rest = ok & (last != START)
        if first.any():
            flags[first] = checker.singles(tok[first])
        if rest.any():
            flags[rest] = checker.pairs(last[rest], tok[rest])
        ok &= flags != REJECT
        src, tok, nq, flags = src[ok], tok[ok], nq[ok], flags[ok]
        frontier = []
        dst = np.empty(len(tok), dtype=np.int64)
        for k, key in enumerate(zip(nq.tolist(), tok.tolist(), flags.tolist())):
            sid = ids.get(key)
            if sid is None:
                sid = ids[key] = len(keys)
                keys.append(key)
                frontier.append(sid)
            dst[k] = sid
        edges_src.append(src)
        edges_tok.append(tok)
        edges_dst_q.append(dst)
    S = len(keys) + 1
    ended = S - 1
    src = np.concatenate(edges_src)
    tok = np.concatenate(edges_tok)
    dst = np.concatenate(edges_dst_q)
    accepting = np.zeros(S, dtype=bool)
    accepting[:-1] = [byte_accepting[q] and flag != NEEDS_NONSPACE for q, _, flag in keys]
    accepting[0] = False
    if eos is not None:
        acc = np.nonzero(accepting)[0]
        src = np.concatenate([src, acc, [ended]])
        tok = np.concatenate([tok, np.full(len(acc) + 1, eos)])
        dst = np.concatenate([dst, np.full(len(acc) + 1, ended)])
        accepting[ended] = True
    order = np.lexsort((tok, src))
    src, tok, dst = src[order], tok[order], dst[order]
    dfa = TokenDFA(vocab_size=all_dfa.vocab_size, initial=1, accepting=accepting,
                   default=np.zeros(S, dtype=np.int64),
                   exc_ptr=np.searchsorted(src, np.arange(S + 1)).astype(np.int64),
                   exc_tokens=tok.astype(np.int64), exc_next=dst.astype(np.int64))
    if dfa.is_empty():
        raise UnsatisfiableConstraintError(
            f"the {what} matches strings, but none has a canonical tokenization here")
    if dfa.num_states * min(dfa.num_exceptions, dfa.vocab_size) <= 20_000_000:
        dfa = minimize(dfa)   # merges (q, a) states with identical futures
    return dfa
