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
against ``tokenizer.encode`` by enumeration on the SmolLM2 tokenizer, in both directions, and
exhaustively on a tiny trained BPE tokenizer. Pairs that lie inside one pre-token by
construction (inside one multi-byte character; ASCII letter or digit runs under GPT-2's
pattern) are decided without encoding, from the merge ranks (:mod:`ctrlg.dfa.bpe_merges`:
BPE merges across the junction iff the two tokens' junction signatures intersect).

Construction (Tran-Thien's CartesianMerge, restricted to reachable pairs). The product of the
all-encodings token DFA (state ``q``) with "the last token read" (``a``): states ``(q, a)``,
``δ((q, a), t) = (δ(q, t), t)`` if the pair ``(a, t)`` is canonical. Only pairs reachable from
the start are built, level by level, and each level's unknown pairs are checked with one batched
``encode_batch`` call; results are cached per tokenizer. States with identical outgoing edges are
merged by :func:`ctrlg.dfa.minimize`. The number of pair checks is bounded by
``max_pair_checks``; beyond it :class:`PairBudgetExceeded` is raised (regexes over large token
classes such as ``[a-z]+`` can need millions of pairs). That is a property of the language, not
of the search: any DFA accepting exactly the canonical sequences of a ``[a-z]+`` loop on SmolLM2
has ≥ 4,188 states and ≥ 15.3M transitions (:func:`ctrlg.dfa.bpe_merges.loop_transition_bound`).
:mod:`ctrlg.dfa.canonical_filter` keeps such languages as the all-encodings DFA plus this
module's bigram test, decided at decode time.
"""

from __future__ import annotations

import json
import unicodedata
from itertools import accumulate

import numpy as np

from ctrlg.dfa.bpe_merges import MergeTables
from ctrlg.dfa.bytes_dfa import ByteDFA
from ctrlg.dfa.core import TokenDFA, ragged_indices
from ctrlg.dfa.minimize import minimize
from ctrlg.dfa.regex_index import resolve_eos, token_dfa_from_bytes_dfa
from ctrlg.dfa.vocab_trie import vocab_trie, vocabulary_index
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError, VocabularyMismatchError
from ctrlg.vocab import bytes_to_unicode, tokenizer_of

__all__ = ["canonical_token_dfa", "PairChecker", "is_canonical", "PairBudgetExceeded",
           "token_verdicts", "START"]


class PairBudgetExceeded(ConstraintError):
    """The product automaton needs more token-pair checks than allowed (``max_pair_checks``)."""

START = -1   # the "last token" before the first token of a text
# Building MergeTables costs ~1 s on a 49k-token vocabulary and saves ~2–5 µs per pair against
# BPE through the model (measured on SmolLM2), so a batch of pairs builds them from this size on.
PAIRS_FOR_MERGE_TABLES = 200_000


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
        self._byte_level: dict[bytes, str] = {}
        self._whole: dict[int, bool] = {}
        self._merge_tables: MergeTables | bool | None = None
        self._ascii_runs: list[int] | None = None
        self._gpt2: bool | None = None
        self._edges: tuple | None = None
        self._single_arr: np.ndarray | None = None
        self._whole_arr: np.ndarray | None = None
        self._run_arr: np.ndarray | None = None

    # -- window checks -------------------------------------------------------------
    def _bpe_ids(self, *parts: bytes) -> list[int]:
        """BPE of the bytes ``parts`` concatenated, as one pre-token (the model alone)."""
        text = []
        for part in parts:
            mapped = self._byte_level.get(part)
            if mapped is None:
                mapped = self._byte_level[part] = "".join(self.byte_char[b] for b in part)
            text.append(mapped)
        return [t.id for t in self.backend.model.tokenize("".join(text))]

    def _is_whole(self, token: int) -> bool:
        """BPE of the token's bytes alone is the token (it can form a pre-token by itself)."""
        whole = self._whole.get(token)
        if whole is None:
            whole = self._whole[token] = self._bpe_ids(self.tokens[token]) == [token]
        return whole

    def _window_ok(self, parts: tuple[bytes, ...], ids: list[int], next_nonspace: bool) -> bool:
        """Tokens ``ids`` with bytes ``parts`` (one or two) are canonical in a text where they
        are followed by a non-whitespace character (``next_nonspace``) or not: no pre-token
        boundary falls strictly inside a token, and tokens inside one pre-token are the BPE
        bigram (or unigram) of their bytes."""
        data = b"".join(parts)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:   # inside one multi-byte character: one pre-token
            return self._bpe_ids(*parts) == ids
        if self.pre_tokenizer is not None:
            pieces = self.pre_tokenizer.pre_tokenize_str(text + ("x" if next_nonspace else ""))
            if len(text) == len(data):       # ASCII: character offsets are byte offsets
                bounds = {start for _, (start, _) in pieces}
            else:
                char_to_byte = [0, *accumulate(len(ch.encode("utf-8")) for ch in text + "x")]
                bounds = {char_to_byte[start] for _, (start, _) in pieces}
        else:
            bounds = set()
        cuts = list(accumulate(len(p) for p in parts))
        begin = 0
        for end in cuts:
            if any(begin < b < end for b in bounds):
                return False   # a token would span a pre-token boundary
            begin = end
        if len(parts) == 2 and cuts[0] in bounds:
            # different pre-tokens: BPE never merges across; the left one was checked with its
            # own left neighbour (bigram property), the right one starts a pre-token and is
            # checked with its right neighbour, or must be BPE's encoding of itself if alone
            return self._is_whole(ids[1])
        return self._bpe_ids(*parts) == ids

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
        """Flag per pair (a, b): the verdict on b following a.

        Pairs inside one pre-token by construction (ASCII letter or digit runs,
        :meth:`ascii_runs`) and pairs inside one multi-byte character are BPE's alone, decided
        from the merge ranks (:meth:`_bpe_pairs`). Other pairs whose right token does not end
        with whitespace and whose bytes are valid UTF-8 are decided in one batched
        ``encode_batch`` call: then the verdict is FREE iff
        ``encode(a + b) == [a, b]`` (equivalent to the window test, since every token of a
        canonical sequence is BPE's encoding of its own bytes); pairs ending with whitespace use
        the window test (:meth:`_verdicts`)."""
        keys = list(zip(np.asarray(left).tolist(), np.asarray(right).tolist()))
        cache = self.pair_cache
        todo = {key for key in keys if key not in cache}
        batch, texts, inside = [], [], []
        run = self.ascii_runs()
        for key in todo:
            a, b = key
            if run[b] in (2, 4) and run[a] in (run[b], run[b] - 1):
                inside.append(key)       # " ?[A-Za-z]+" + "[A-Za-z]+" (or digits): one pre-token
                continue
            data = self.tokens[a] + self.tokens[b]
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:   # inside one multi-byte character: one pre-token
                inside.append(key)
                continue
            if _ends_with_space(self.tokens[b]):
                cache[key] = self._verdicts((self.tokens[a], self.tokens[b]), [a, b])
            else:
                texts.append(text)
                batch.append(key)
        if inside:
            for key, ok in zip(inside, self._bpe_pairs(inside)):
                cache[key] = FREE if ok else REJECT
        if batch:
            encodings = self.backend.encode_batch(texts, add_special_tokens=False)
            for key, enc in zip(batch, encodings):
                cache[key] = FREE if enc.ids == list(key) else REJECT
        return np.fromiter((cache[key] for key in keys), dtype=np.int8, count=len(keys))

    def verdicts_after(self, left, right) -> np.ndarray:
        """:meth:`pairs` for many pairs at once (``left``, ``right`` broadcast), with the pairs
        that straddle a forced pre-token boundary (:meth:`forced_boundary`) decided without
        encoding: after a forced boundary the right token starts a pre-token, and GPT-2's
        pattern has no look-behind, so its verdict is the one it gets at the start of a text
        (:meth:`singles`)."""
        left, right = np.broadcast_arrays(np.asarray(left, dtype=np.int64),
                                          np.asarray(right, dtype=np.int64))
        out = np.empty(len(right), dtype=np.int8)
        cut = self.forced_boundary(left, right)
        if cut.any():
            out[cut] = self.singles_array(right[cut])
        inside = self._run_pairs(left, right) & ~cut
        if inside.any():   # inside one letter or digit run: the merge ranks decide, in bulk
            a, b = left[inside], right[inside]
            ok = self.whole_array(a) & self.whole_array(b) & ~self._merges_across(a, b)
            out[inside] = np.where(ok, FREE, REJECT)
        rest = ~(cut | inside)
        if rest.any():
            out[rest] = self.pairs(left[rest], right[rest])
        return out

    def _merges_across(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """:meth:`MergeTables.merges_across`, through one token's inverted signature when all
        pairs share their left (a row of verdicts) or their right token (a column)."""
        tables = self._merge_tables
        if len(a) > 64 and (a == a[0]).all():
            return tables.forbidden_after(int(a[0]))[b]
        if len(b) > 64 and (b == b[0]).all():
            return tables.forbidden_before(int(b[0]))[a]
        return tables.merges_across(a, b)

    def _run_pairs(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """Bool per pair inside one ASCII letter or digit run (:meth:`ascii_runs`), when the merge
        tables are built (else all False: :meth:`pairs` decides them)."""
        if not self._merge_tables:
            return np.zeros(len(right), dtype=bool)
        if self._run_arr is None:
            self._run_arr = np.asarray(self.ascii_runs(), dtype=np.int8)
        run_a, run_b = self._run_arr[left], self._run_arr[right]
        return ((run_b == 2) | (run_b == 4)) & ((run_a == run_b) | (run_a == run_b - 1))

    def whole_array(self, tokens: np.ndarray) -> np.ndarray:
        """Bool per token: BPE of its bytes alone is the token (cached per vocabulary)."""
        if self._whole_arr is None:
            self._whole_arr = np.full(len(self.tokens), -1, dtype=np.int8)
        out = self._whole_arr[tokens]
        missing = out < 0
        if missing.any():
            todo = np.unique(tokens[missing]).tolist()
            self._whole_arr[todo] = [self._is_whole(t) for t in todo]
            out = self._whole_arr[tokens]
        return out.astype(bool)

    def forced_boundary(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """Bool per pair: GPT-2's pre-tokenizer splits between the two tokens in every context.
        With x the left token's last character and y the right one's first (both complete):
        x a letter and y not; x a digit and y not; or x other than whitespace, letter, digit
        and ``'`` and y a letter, digit or whitespace. (No alternative of the pattern
        `` '(s|t|re|ve|m|ll|d)| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`` can
        contain such x and y together, and x always ends the match it belongs to.) All False
        unless the pre-tokenizer is exactly GPT-2's."""
        first, last = self._edge_categories()
        if first is None:
            return np.zeros(len(right), dtype=bool)
        x, y = last[left], first[right]
        return (((x == _LETTER) & (y != _LETTER) & (y != _PARTIAL))
                | ((x == _DIGIT) & (y != _DIGIT) & (y != _PARTIAL))
                | ((x == _OTHER) & ((y == _LETTER) | (y == _DIGIT) | (y == _SPACE))))

    def _edge_categories(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Per token: the category of its first and of its last character (letter, digit,
        whitespace, other, ``'``, or partial: an incomplete UTF-8 sequence); (None, None) when the
        pre-tokenizer is not GPT-2's."""
        if self._edges is None:
            if not self.gpt2_pre_tokenizer():
                self._edges = (None, None)
            else:
                first = np.empty(len(self.tokens), dtype=np.int8)
                last = np.empty(len(self.tokens), dtype=np.int8)
                for t, data in enumerate(self.tokens):
                    first[t], last[t] = _edge_category(data, 0), _edge_category(data, -1)
                self._edges = (first, last)
        return self._edges

    def singles_array(self, tokens) -> np.ndarray:
        """:meth:`singles` through a per-vocabulary array (vectorised once computed)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if self._single_arr is None:
            self._single_arr = np.full(len(self.tokens), -1, dtype=np.int8)
        out = self._single_arr[tokens]
        missing = out < 0
        if missing.any():
            todo = np.unique(tokens[missing])
            self._single_arr[todo] = self.singles(todo)
            out = self._single_arr[tokens]
        return out

    def gpt2_pre_tokenizer(self) -> bool:
        """Whether the pre-tokenizer is exactly GPT-2's (``ByteLevel`` with ``use_regex``)."""
        if self._gpt2 is None:
            pre = json.loads(self.backend.to_str()).get("pre_tokenizer") or {}
            self._gpt2 = pre.get("type") == "ByteLevel" and bool(pre.get("use_regex", True))
        return self._gpt2

    def ascii_runs(self) -> list[int]:
        """Per token: 2 for tokens ``[A-Za-z]+``, 1 for `` [A-Za-z]+``, 4 for ``[0-9]+``, 3 for
        `` [0-9]+``, else 0. A pair (a, b) with ``run[b] ∈ {2, 4}`` and ``run[a] ∈ {run[b],
        run[b] − 1}`` lies inside one pre-token of the GPT-2 pattern (`` ?\\p{L}+`` or
        `` ?\\p{N}+``), so ``encode`` is BPE alone there. All 0 (no shortcut) unless the
        pre-tokenizer is exactly GPT-2's (``ByteLevel`` with ``use_regex``)."""
        if self._ascii_runs is None:
            runs = [0] * len(self.tokens)
            if self.gpt2_pre_tokenizer():
                for t, data in enumerate(self.tokens):
                    spaced = data[:1] == b" "
                    body = data[1:] if spaced else data
                    if body and body.isascii() and (body.isalpha() or body.isdigit()):
                        runs[t] = (2 if body.isalpha() else 4) - int(spaced)
            self._ascii_runs = runs
        return self._ascii_runs

    def _bpe_pairs(self, keys: list[tuple[int, int]]) -> list[bool]:
        """Whether BPE (the model alone) encodes each pair's bytes as the pair: both tokens
        are BPE's encoding of themselves and no merge fires across the junction
        (:meth:`MergeTables.merges_across`, from the merge ranks); per pair through the model
        when the merge tables do not apply to this tokenizer, or are not built yet and this batch
        is too small to pay for them (:data:`PAIRS_FOR_MERGE_TABLES`)."""
        build = self._merge_tables is not None or len(keys) >= PAIRS_FOR_MERGE_TABLES
        tables = self.merge_tables() if build else None
        if tables is None:
            return [self._bpe_ids(self.tokens[a], self.tokens[b]) == [a, b] for a, b in keys]
        left, right = (np.array(side, dtype=np.int64) for side in zip(*keys))
        whole = np.array([self._is_whole(a) and self._is_whole(b) for a, b in keys])
        return (whole & ~tables.merges_across(left, right)).tolist()

    def merge_tables(self) -> MergeTables | None:
        """The tokenizer's :class:`MergeTables` (built on first use), or None where the merge
        rank test does not apply (not a plain BPE model)."""
        if self._merge_tables is None:
            try:
                self._merge_tables = MergeTables(self.backend, len(self.tokens))
            except (VocabularyMismatchError, KeyError, ValueError):
                self._merge_tables = False
        return self._merge_tables or None

    def starts_nonspace(self, tokens: np.ndarray) -> np.ndarray:
        if self._starts_nonspace is None:
            self._starts_nonspace = np.array([_starts_nonspace(t) for t in self.tokens])
        return self._starts_nonspace[tokens]


REJECT, FREE, NEEDS_NONSPACE, NEEDS_OTHER = 0, 1, 2, 3
_LETTER, _DIGIT, _SPACE, _OTHER, _APOSTROPHE, _PARTIAL = range(6)
# str.isspace() is true for the information separators U+001C..U+001F; the regex class \s
# (Unicode White_Space) is not
_NOT_REGEX_SPACE = "\x1c\x1d\x1e\x1f"


def _edge_category(data: bytes, end: int) -> int:
    """Category of the first (``end`` = 0) or last (−1) character of a token's bytes, in the
    classes of GPT-2's pre-tokenizer pattern (``\\p{L}``, ``\\p{N}``, ``\\s``, ``'``, other)."""
    text = data.decode("utf-8", errors="ignore")
    if not text or not (data.startswith if end == 0 else data.endswith)(text[end].encode("utf-8")):
        return _PARTIAL
    ch = text[end]
    if ch == "'":
        return _APOSTROPHE
    if ch.isspace() and ch not in _NOT_REGEX_SPACE:
        return _SPACE
    major = unicodedata.category(ch)[0]
    return _LETTER if major == "L" else _DIGIT if major == "N" else _OTHER


def token_verdicts(checker: PairChecker, last, need, tokens) -> np.ndarray:
    """Flag (REJECT / FREE / NEEDS_NONSPACE / NEEDS_OTHER) of each token of ``tokens`` read
    after the token ``last`` (``START``: the first token of the text) whose own flag is
    ``need`` (arrays or scalars, broadcast): REJECT when ``need``'s requirement on how the next
    token starts fails or the pair is not canonical (:meth:`PairChecker.verdicts_after`;
    :meth:`PairChecker.singles_array` after ``START``)."""
    last, need, tokens = np.broadcast_arrays(np.asarray(last, dtype=np.int64),
                                             np.asarray(need, dtype=np.int8),
                                             np.asarray(tokens, dtype=np.int64))
    out = np.zeros(tokens.shape, dtype=np.int8)
    if not tokens.size:
        return out
    starts = checker.starts_nonspace(tokens)
    ok = ~(((need == NEEDS_NONSPACE) & ~starts) | ((need == NEEDS_OTHER) & starts))
    first = ok & (last == START)
    rest = ok & (last != START)
    if first.any():
        out[first] = checker.singles_array(tokens[first])
    if rest.any():
        out[rest] = checker.verdicts_after(last[rest], tokens[rest])
    return out


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
                        max_pair_checks: int = 5_000_000, what: str = "pattern",
                        all_dfa: TokenDFA | None = None) -> TokenDFA:
    """The canonical-encodings token DFA of the byte DFA ``bdfa`` (module docstring): the
    product search (:class:`_ProductSearch`), then EOS edges, acceptance and minimisation
    (:func:`_assemble`). ``all_dfa``: the unminimised all-encodings DFA of ``bdfa`` if the
    caller has it (built here otherwise). Raises :class:`PairBudgetExceeded` beyond
    ``max_pair_checks`` pair checks."""
    checker = pair_checker(tokenizer)
    trie = vocab_trie(tokenizer)
    if all_dfa is None:
        all_dfa = token_dfa_from_bytes_dfa(bdfa, trie, eos_token_id=eos_token_id,
                                           vocab_size=vocab_size, what=what)
    search = _ProductSearch(all_dfa, checker, resolve_eos(trie, eos_token_id))
    while len(search.frontier):
        search.expand_level(max_pair_checks, what)
    byte_accepting = np.zeros(all_dfa.num_states, dtype=bool)
    byte_accepting[:bdfa.num_states] = bdfa.accepting
    return _assemble(search, byte_accepting, what)


class _ProductSearch:
    """Breadth-first search of the product (all-encodings state q, last token, its flag).

    State 0 is dead, 1 the start. A product state is the int key
    ``((q · (V + 1)) + last + 1) · 4 + flag``; known keys are kept sorted, and each BFS level
    looks its new keys up with one vectorised binary search."""

    def __init__(self, all_dfa: TokenDFA, checker: PairChecker, eos: int | None):
        self.all_dfa, self.checker, self.eos = all_dfa, checker, eos
        self.key_q = [np.array([0, all_dfa.initial], dtype=np.int64)]
        self.key_flag = [np.array([REJECT, FREE], dtype=np.int8)]
        self.known_keys = np.zeros(0, dtype=np.int64)
        self.known_ids = np.zeros(0, dtype=np.int64)
        self.num_states = 2
        self.frontier = np.array([1], dtype=np.int64)
        self.f_q, self.f_last, self.f_flag = (self.key_q[0][1:], np.array([START], dtype=np.int64),
                                              self.key_flag[0][1:])
        self.edges: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.checks = 0

    def expand_level(self, max_pair_checks: int, what: str) -> None:
        """All canonical out-edges of the frontier; their new targets become the frontier."""
        d = self.all_dfa
        counts = d.exc_ptr[self.f_q + 1] - d.exc_ptr[self.f_q]
        self.checks += int(counts.sum())
        if self.checks > max_pair_checks:
            raise PairBudgetExceeded(
                f"the canonical automaton of the {what} needs more than max_pair_checks="
                f"{max_pair_checks} token-pair checks; use canonical_form='filter' (or 'auto': "
                f"a CanonicalDFA, decided at decode time), encodings='all', or raise the limit. "
                f"A canonical DFA must remember the class of the previous token: a loop over a "
                f"large token class (e.g. [a-z]+ on a 49k-token BPE vocabulary: 4,188 classes, "
                f"each with thousands of distinct successors) needs millions of transitions "
                f"(docs/regex.md)")
        idx = ragged_indices(d.exc_ptr[self.f_q], counts)
        tok, nq = d.exc_tokens[idx], d.exc_next[idx]
        src = np.repeat(self.frontier, counts)
        last = np.repeat(self.f_last, counts)
        need = np.repeat(self.f_flag, counts)
        if self.eos is not None:
            keep = tok != self.eos
            tok, nq, src, last, need = tok[keep], nq[keep], src[keep], last[keep], need[keep]
        flags = self._verdicts(tok, last, need)
        ok = flags != REJECT
        src, tok, nq, flags = src[ok], tok[ok], nq[ok], flags[ok]
        self.edges.append((src, tok, self._intern(nq, tok, flags)))

    def _verdicts(self, tok: np.ndarray, last: np.ndarray, need: np.ndarray) -> np.ndarray:
        """Flag of each new token after ``last`` (:func:`token_verdicts`)."""
        return token_verdicts(self.checker, last, need, tok)

    def _intern(self, nq: np.ndarray, tok: np.ndarray, flags: np.ndarray) -> np.ndarray:
        """Ids of the product states (nq, tok, flags); unseen ones get new ids and form the
        next frontier."""
        V = self.all_dfa.vocab_size
        key = (nq * (V + 1) + tok + 1) * 4 + flags
        uniq, first_at, inverse = np.unique(key, return_index=True, return_inverse=True)
        pos = np.searchsorted(self.known_keys, uniq)
        found = pos < len(self.known_keys)
        found[found] = self.known_keys[pos[found]] == uniq[found]
        uid = np.empty(len(uniq), dtype=np.int64)
        uid[found] = self.known_ids[pos[found]]
        fresh = np.flatnonzero(~found)
        uid[fresh] = self.num_states + np.arange(len(fresh))
        self.num_states += len(fresh)
        at = first_at[fresh]
        self.f_q, self.f_last, self.f_flag = nq[at], tok[at], flags[at]
        self.key_q.append(self.f_q)
        self.key_flag.append(self.f_flag)
        self.frontier = uid[fresh]
        merged = np.concatenate([self.known_keys, uniq[fresh]])
        order = np.argsort(merged, kind="stable")
        self.known_keys = merged[order]
        self.known_ids = np.concatenate([self.known_ids, uid[fresh]])[order]
        return uid[inverse.ravel()]


def _assemble(search: _ProductSearch, byte_accepting: np.ndarray, what: str) -> TokenDFA:
    """The product's TokenDFA: accepting where the byte DFA accepts and the last token needs no
    non-whitespace successor, EOS edges into one *ended* state, then minimisation."""
    S = search.num_states + 1
    ended = S - 1
    src, tok, dst = (np.concatenate(parts) for parts in zip(*search.edges))
    q_of = np.concatenate(search.key_q)
    flag_of = np.concatenate(search.key_flag)
    accepting = np.zeros(S, dtype=bool)
    accepting[:-1] = byte_accepting[q_of] & (flag_of != NEEDS_NONSPACE)
    accepting[0] = False
    eos = search.eos
    if eos is not None:
        acc = np.nonzero(accepting)[0]
        src = np.concatenate([src, acc, [ended]])
        tok = np.concatenate([tok, np.full(len(acc) + 1, eos)])
        dst = np.concatenate([dst, np.full(len(acc) + 1, ended)])
        accepting[ended] = True
    order = np.lexsort((tok, src))
    src, tok, dst = src[order], tok[order], dst[order]
    dfa = TokenDFA(vocab_size=search.all_dfa.vocab_size, initial=1, accepting=accepting,
                   default=np.zeros(S, dtype=np.int64),
                   exc_ptr=np.searchsorted(src, np.arange(S + 1)).astype(np.int64),
                   exc_tokens=tok.astype(np.int64), exc_next=dst.astype(np.int64))
    if dfa.is_empty():
        raise UnsatisfiableConstraintError(
            f"the {what} matches strings, but none has a canonical tokenization here")
    if dfa.num_states * min(dfa.num_exceptions, dfa.vocab_size) <= 20_000_000:
        dfa = minimize(dfa)   # merges (q, a) states with identical futures
    return dfa
