"""Completion weights β of token sequences, shared between the lazy guides of one HMM.

The lazy guide (:mod:`ctrlg.guide.horizon`) values a state s at its horizon by β(s), the
probability that the HMM emits the token completion y(s) = y_1 … y_L behind s's bound and then
EOS, for every hidden state z of the token just emitted:

    β(y_1 … y_L) = A · (B[:, y_1] ⊙ β(y_2 … y_L)),    β(ε) = A · Σ_e B[:, e]

(β(ε) = 1 when the automaton has no EOS token). β depends on the token sequence alone, not on
the automaton or the state. JSON documents end alike schema after schema (``"}``, ``]}``, ``0}``),
and inside one schema, states whose completions differ in their first tokens share the rest:
over the first steps of 294 JSONSchemaBench schemas in one process, 39 % of the products a guide
computed were for a sequence some guide had computed before.

:class:`CompletionMemo` keeps β of every suffix it has computed as a node of a trie of suffixes
read from the end: node ``(parent, y)`` is the sequence ``y`` followed by ``parent``'s, so a
lookup is one dict probe per token and a hit saves one O(h²) product. Each node keeps its vector
scaled to max 1 (float32 [h]) and the float64 log of the scale; a node whose product is 0 (the
completion cannot be emitted) keeps the zero vector and −inf. A hit returns the same arrays a
fresh computation would (the same products, in the same order); they are shared and must not be
written to. At most ``max_bytes`` of vectors are kept, the least recently used dropped first (a
dropped node's descendants are no longer reached and age out in turn).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np

__all__ = ["CompletionMemo"]

#: Node id of the empty completion at an automaton without EOS (β = 1).
_NO_EOS = -1


class CompletionMemo:
    """β of token completions by a trie of suffixes (module docstring).

    Args:
        transition: A [h, h] float32 numpy array.
        emission_t: Bᵀ [V, h] float32 numpy array (row v is B[:, v]).
        max_bytes: vectors kept at most (64 MiB by default: 32,768 nodes at h = 512).
    """

    def __init__(self, transition: np.ndarray, emission_t: np.ndarray, max_bytes: int = 64 << 20):
        self.transition = transition
        self.emission_t = emission_t
        self.max_bytes = max_bytes
        h = transition.shape[0]
        self._capacity = max(1, max_bytes // (4 * h))
        # (parent node, token) → (node, vector, log scale); (-2, eos ids) → the EOS base
        self._nodes: OrderedDict[tuple, tuple[int, np.ndarray, float]] = OrderedDict()
        self._ones = np.ones(h, dtype=np.float32)
        self._next_id = 0
        self._lock = threading.Lock()
        #: products computed and saved (hits), for profiling and tests
        self.computed = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._nodes)

    def base(self, eos_ids: tuple, eos_column: np.ndarray | None) -> tuple[int, np.ndarray, float]:
        """``(node, β(ε), log scale)``: A · Σ_e B[:, e] scaled to max 1 (``eos_column`` is that
        sum, [h]); with no EOS token (``eos_ids`` empty), the vector of ones at scale 0."""
        if not eos_ids:
            return _NO_EOS, self._ones, 0.0
        return self._get((-2, tuple(eos_ids)), lambda: _normalise(self.transition @ eos_column))

    def extend(self, node: int, vec: np.ndarray, scale: float,
               token: int) -> tuple[int, np.ndarray, float]:
        """``(node', β(token · s), log scale)`` for the sequence s of ``node`` (whose β is
        ``vec`` at log scale ``scale``, as :meth:`base` or this method gave them): one product
        A · (B[:, token] ⊙ β(s)) unless some guide has computed it before."""

        def compute():
            if scale == -math.inf:
                return np.zeros_like(vec), -math.inf
            got, extra = _normalise(self.transition @ (self.emission_t[token] * vec))
            return got, scale + extra

        return self._get((node, int(token)), compute)

    # ------------------------------------------------------------------ storage
    def _get(self, key: tuple, compute) -> tuple[int, np.ndarray, float]:
        with self._lock:
            got = self._nodes.get(key)
            if got is not None:
                self._nodes.move_to_end(key)
                self.hits += 1
                return got
        vec, scale = compute()       # outside the lock: two threads may compute the same node
        with self._lock:
            got = self._nodes.get(key)
            if got is not None:
                return got
            node = self._next_id
            self._next_id += 1
            got = self._nodes[key] = (node, vec, scale)
            self.computed += 1
            while len(self._nodes) > self._capacity:
                self._nodes.popitem(last=False)
            return got


def _normalise(vec: np.ndarray) -> tuple[np.ndarray, float]:
    """``(vec / max(vec), log max(vec))`` in place; the zero vector and −inf when max ≤ 0."""
    top = float(vec.max())
    if not top > 0:
        return np.zeros_like(vec), -math.inf
    vec *= 1.0 / top
    return vec, math.log(top)
