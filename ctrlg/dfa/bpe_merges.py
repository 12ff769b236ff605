"""Which token pairs BPE would merge across, from the merge ranks alone (no encoding calls).

Inside one pre-token, byte-level BPE repeatedly applies the lowest-ranked merge among adjacent
symbol pairs (leftmost first on ties). For two tokens ``a, b`` that are each BPE's encoding of
their own bytes, BPE on ``bytes(a)·bytes(b)`` evolves both halves independently until the
first merge *across* the junction; if none ever fires the result is ``[a, b]``, otherwise it is
not. Which symbol sits at the junction at time τ (after every merge of rank < τ) is read off the
merge trees (Berglund & van der Merwe 2023, "Formalizing BPE tokenization"):

* a's **right spine** ``a = r_0, r_1 = right(r_0), r_2 = right(r_1), …, r_k`` (a byte): r_i is the
  right-most symbol of a's half from its creation, ``rank(r_i)``, until it is absorbed, at
  ``rank(r_{i-1})`` (``r_0`` stays for ever; bytes have rank −1);
* b's **left spine** ``b = s_0, s_1 = left(s_0), …`` likewise on the left of b's half.

A cross merge ρ = (x, y) fires iff x is a's right-most symbol and y is b's left-most symbol at
time ρ. With ties resolved leftmost-first, a merge of a's half at the same rank comes first (it is
to the left), and a merge of b's half at the same rank comes after. So, with

    SR(a) = ∪_i { ρ : left(ρ) = r_i,  rank(r_i) < ρ < rank(r_{i-1}) }     (right signature)
    SL(b) = ∪_j { ρ : right(ρ) = s_j, rank(s_j) < ρ ≤ rank(s_{j-1}) }      (left signature)

BPE(bytes(a)·bytes(b)) = [a, b]  ⇔  SR(a) ∩ SL(b) = ∅. (This is the bigram test of Vieira et al.
2025, "Language models over canonical byte-pair encodings", evaluated symbolically.) Pre-tokens
are handled by the caller (:mod:`ctrlg.dfa.canonical`): merges never cross a pre-token
boundary.

The signatures are two sparse token × rank tables built once per tokenizer, vectorised over the
spine depth: O(Σ_a |SR(a)| + Σ_b |SL(b)|) (~1.4M and ~3M entries for SmolLM2). A batch of pairs
costs O(Σ_k |SR(a_k)| · log |SL|). Two tokens with equal rows of ``forbidden = SR · SLᵀ``
(restricted to the tokens that may follow) have the same future in any canonical automaton:
:func:`right_context_classes` counts these Myhill–Nerode classes, and
:func:`loop_transition_bound` the states and transitions any canonical token DFA looping over
those tokens must have.
"""

from __future__ import annotations

import json

import numpy as np

from ctrlg.dfa.core import ragged_indices
from ctrlg.errors import VocabularyMismatchError

__all__ = ["MergeTables", "loop_transition_bound", "right_context_classes"]

_FOREVER = np.iinfo(np.int64).max // 4


class MergeTables:
    """Merge trees and junction signatures of a byte-level BPE model (module docstring).

    Args:
        backend: a ``tokenizers.Tokenizer`` (``tokenizer.backend_tokenizer``) with a BPE model.
        vocab_size: number of token ids to cover (ids outside the model's vocabulary, e.g.
            special tokens, get empty signatures).
    """

    def __init__(self, backend, vocab_size: int):
        model = json.loads(backend.to_str())["model"]
        if model.get("type") != "BPE":
            raise VocabularyMismatchError(f"merge tables need a BPE model, got {model.get('type')!r}")
        if model.get("ignore_merges"):
            raise VocabularyMismatchError(
                "this BPE model looks whole words up before merging (ignore_merges=True); the "
                "merge-rank pair test does not apply to it")
        vocab = model["vocab"]
        merges = [m.split(" ", 1) if isinstance(m, str) else m for m in model["merges"]]
        self.vocab_size = V = int(vocab_size)
        self.num_merges = M = len(merges)
        self.left = np.full(V, -1, dtype=np.int64)      # merge tree children (−1: a byte)
        self.right = np.full(V, -1, dtype=np.int64)
        self.rank = np.full(V, -1, dtype=np.int64)      # rank of the merge creating the token
        self.merge_left = np.empty(M, dtype=np.int64)
        self.merge_right = np.empty(M, dtype=np.int64)
        for r, (x, y) in enumerate(merges):
            t, lx, ry = vocab[x + y], vocab[x], vocab[y]
            self.merge_left[r], self.merge_right[r] = lx, ry
            if t < V and self.rank[t] < 0:
                self.left[t], self.right[t], self.rank[t] = lx, ry, r
        in_model = np.zeros(V, dtype=bool)
        in_model[[i for i in vocab.values() if i < V]] = True
        self.sr_ptr, self.sr = self._signature(self.right, self.merge_left, strict_end=True,
                                               in_model=in_model)
        self.sl_ptr, self.sl = self._signature(self.left, self.merge_right, strict_end=False,
                                               in_model=in_model)
        self._sl_keys = np.repeat(np.arange(V, dtype=np.int64), np.diff(self.sl_ptr)) * M + self.sl

    def _signature(self, child: np.ndarray, merge_side: np.ndarray, *, strict_end: bool,
                   in_model: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """CSR rows ``{ρ : merge_side(ρ) = e, rank(e) < ρ < (or ≤) end(e)}`` over the spine
        elements e of every token (``child`` = right children for the right spine)."""
        V, M = self.vocab_size, self.num_merges
        order = np.lexsort((np.arange(M), merge_side))          # merges by (side token, rank)
        keys = merge_side[order] * (M + 1) + order
        owner = np.flatnonzero(in_model)
        elem, end = owner.copy(), np.full(len(owner), _FOREVER, dtype=np.int64)
        parts_owner, parts_lo, parts_hi = [], [], []
        while len(owner):
            lo_rank = self.rank[elem]
            lo = np.searchsorted(keys, elem * (M + 1) + lo_rank, side="right")
            bound = np.minimum(end, M)
            hi = np.searchsorted(keys, elem * (M + 1) + bound, side="left" if strict_end else "right")
            parts_owner.append(owner)
            parts_lo.append(lo)
            parts_hi.append(np.maximum(hi, lo))
            go = child[elem] >= 0
            owner, end, elem = owner[go], lo_rank[go], child[elem[go]]
        owner = np.concatenate(parts_owner)
        lo, hi = np.concatenate(parts_lo), np.concatenate(parts_hi)
        counts = hi - lo
        ranks = order[ragged_indices(lo, counts)]
        row = np.repeat(owner, counts)
        srt = np.lexsort((ranks, row))
        ptr = np.zeros(V + 1, dtype=np.int64)
        np.cumsum(np.bincount(row, minlength=V), out=ptr[1:])
        return ptr, ranks[srt]

    def merges_across(self, left_tokens, right_tokens) -> np.ndarray:
        """Bool per pair: BPE merges across the junction of ``(left_tokens[k], right_tokens[k])``
        (``SR(a) ∩ SL(b) ≠ ∅``), i.e. ``[a, b]`` is not BPE's encoding of their bytes."""
        a = np.asarray(left_tokens, dtype=np.int64)
        b = np.asarray(right_tokens, dtype=np.int64)
        counts = self.sr_ptr[a + 1] - self.sr_ptr[a]
        ranks = self.sr[ragged_indices(self.sr_ptr[a], counts)]
        query = np.repeat(b, counts) * self.num_merges + ranks
        keys = self._sl_keys
        pos = np.minimum(np.searchsorted(keys, query), max(len(keys) - 1, 0))
        hit = keys[pos] == query if len(keys) else np.zeros(len(query), dtype=bool)
        pair = np.repeat(np.arange(len(a)), counts)
        return np.bincount(pair[hit], minlength=len(a)) > 0

    def forbidden_after(self, token: int) -> np.ndarray:
        """Bool [V]: BPE merges across (token, b), for every b at once: the union of the tokens
        whose left signature holds a rank of ``token``'s right signature (an inverted index of
        the left signatures by rank). O(Σ_{ρ ∈ SR(token)} |{b : ρ ∈ SL(b)}|)."""
        return self._forbidden(token, self.sr_ptr, self.sr, "_sl_by_rank", self.sl_ptr, self.sl)

    def forbidden_before(self, token: int) -> np.ndarray:
        """Bool [V]: BPE merges across (a, token), for every a at once (the mirror image of
        :meth:`forbidden_after`)."""
        return self._forbidden(token, self.sl_ptr, self.sl, "_sr_by_rank", self.sr_ptr, self.sr)

    def _forbidden(self, token, own_ptr, own, index_name, other_ptr, other) -> np.ndarray:
        index = getattr(self, index_name, None)
        if index is None:             # (rank pointer [M + 1], tokens sorted by rank)
            owners = np.repeat(np.arange(self.vocab_size, dtype=np.int64), np.diff(other_ptr))
            order = np.argsort(other, kind="stable")
            ptr = np.zeros(self.num_merges + 1, dtype=np.int64)
            np.cumsum(np.bincount(other, minlength=self.num_merges), out=ptr[1:])
            index = (ptr, owners[order])
            setattr(self, index_name, index)
        ptr, owners = index
        ranks = own[own_ptr[token]:own_ptr[token + 1]]
        out = np.zeros(self.vocab_size, dtype=bool)
        if len(ranks):
            out[owners[ragged_indices(ptr[ranks], ptr[ranks + 1] - ptr[ranks])]] = True
        return out

    def signature_matrices(self, left_tokens, right_tokens):
        """``(SR [len(left_tokens), M], SL [len(right_tokens), M])`` as scipy CSR 0/1 matrices."""
        from scipy import sparse

        out = []
        for tokens, ptr, data in ((left_tokens, self.sr_ptr, self.sr),
                                  (right_tokens, self.sl_ptr, self.sl)):
            tokens = np.asarray(tokens, dtype=np.int64)
            counts = ptr[tokens + 1] - ptr[tokens]
            cols = data[ragged_indices(ptr[tokens], counts)]
            rows_ptr = np.concatenate([[0], np.cumsum(counts)])
            out.append(sparse.csr_matrix((np.ones(len(cols), dtype=np.int32), cols, rows_ptr),
                                         shape=(len(tokens), self.num_merges)))
        return out[0], out[1]


def right_context_classes(tables: MergeTables, tokens, followers) -> tuple[int, int]:
    """``(classes, forbidden pairs)``: the number of distinct sets ``{b ∈ followers : BPE merges
    across (a, b)}`` over ``a ∈ tokens`` (Myhill–Nerode classes of the previous token when the
    next one ranges over ``followers`` inside one pre-token), and the number of such pairs.
    One sparse product ``SR · SLᵀ``: O(forbidden pairs)."""
    forbidden = _forbidden(tables, tokens, followers)
    return len(_row_classes(forbidden)[1]), int(forbidden.nnz)


def loop_transition_bound(tables: MergeTables, tokens) -> tuple[int, int]:
    """``(states, transitions)``: lower bounds for any deterministic automaton that accepts
    exactly the canonical token sequences of a loop over ``tokens`` (a set closed under
    following each other inside one pre-token, e.g. every ``[a-z]+`` token). After token ``a``
    the automaton must know ``a``'s class (:func:`right_context_classes`), so it has at least
    one state per class, and from it one transition per distinct class among the allowed
    next tokens. Over letters (token classes) or tokens alike, that many transitions must be
    stored."""
    tokens = np.asarray(tokens, dtype=np.int64)
    forbidden = _forbidden(tables, tokens, tokens)
    cls, reps = _row_classes(forbidden)
    from scipy import sparse

    K = len(reps)
    onehot = sparse.csr_matrix((np.ones(len(tokens)), (np.arange(len(tokens)), cls)),
                               shape=(len(tokens), K))
    per_class = (forbidden[reps] @ onehot).tocoo()     # forbidden members of each class
    sizes = np.bincount(cls, minlength=K)
    fully = per_class.data == sizes[per_class.col]
    closed = np.bincount(per_class.row[fully], minlength=K)
    return K, int((K - closed).sum())


def _forbidden(tables: MergeTables, tokens, followers):
    sr, sl = tables.signature_matrices(tokens, followers)
    forbidden = (sr @ sl.T).tocsr()
    forbidden.data[:] = 1
    return forbidden


def _row_classes(matrix) -> tuple[np.ndarray, np.ndarray]:
    """``(class of each row, one representative row per class)`` by the rows' column sets."""
    ids: dict[bytes, int] = {}
    cls = np.array([ids.setdefault(matrix.indices[matrix.indptr[i]:matrix.indptr[i + 1]]
                                   .tobytes(), len(ids)) for i in range(matrix.shape[0])],
                   dtype=np.int64)
    reps = np.full(len(ids), -1, dtype=np.int64)
    reps[cls[::-1]] = np.arange(len(cls))[::-1]
    return cls, reps
