"""Emission sums of large token sets, shared between the guide tables of one HMM.

A table's recurrence needs B̄[:, a] = Σ_{v ∈ a} B[:, v] for each letter a of its DFA
(:func:`ctrlg.guide.tables.letter_emission_sums`). The largest letter is a complement (rowsum(B)
minus the others); the others are summed over their members. In a CommonGen DFA the second
largest letter holds ≈ 16,000 tokens (those that continue a word), and it is the same set in every
item up to the few dozen tokens its keywords carve out; summing it again per item read
16,000 × h floats (the letters' sums took ≈ 7 ms of a 50–90 ms table at h = 512 on one CPU
core, ≈ 3 ms with this store).

:class:`LargeLetterSums` keeps the sums of the large sets it has seen (at most ``capacity``, the
most recently used first) and gives a new set L from a kept one C as a difference,

    Σ_{v ∈ L} B[:, v] = Σ_{v ∈ C} B[:, v] − Σ_{v ∈ C \\ L} B[:, v] + Σ_{v ∈ L \\ C} B[:, v]

when |L Δ C| ≤ ``max_difference`` · |L| (reading |L Δ C| rows instead of |L|), in float64; else it
sums L directly (accumulating in float64) and keeps it. Both ways give the same sum up to
float64 rounding; the sparse product of the smaller letters accumulates in float32.

:class:`GroupSumsMemo` keeps whole results of the lazy guide's pair sums
(:meth:`ctrlg.guide.horizon.HorizonGuide.pair_sums`: one sum per group of a state's tokens), keyed
by a digest of the groups. A serving process meets the same states schema after schema (the inside
of a JSON string, with its ≈ 48,000 tokens that stay in it and the few dozen that close it): their
sums are then read back instead of gathering ≈ 1,000 scattered rows of Bᵀ again (7–12 ms each on
one CPU core, the rows cold in memory).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import numpy as np
import torch

__all__ = ["GroupSumsMemo", "LargeLetterSums", "LARGE_LETTER"]

#: Letters with at least this many members (EOS excluded) are summed through the shared store.
LARGE_LETTER = 2048
#: Rows of Bᵀ gathered at a time by a direct sum.
BLOCK = 2048


class LargeLetterSums:
    """Sums Σ_{v ∈ L} Bᵀ[v] [h] (float64) of large token sets L, kept per emission (module
    docstring). ``emission_t`` is Bᵀ [V, h]."""

    def __init__(self, emission_t: torch.Tensor, capacity: int = 8, max_difference: float = 0.25):
        self.emission_t = emission_t
        self.capacity = capacity
        self.max_difference = max_difference
        self._kept: list[tuple[np.ndarray, torch.Tensor]] = []   # (sorted members, sum)
        self._lock = threading.Lock()     # tables of one HMM may be built from several threads

    def _direct(self, members: np.ndarray) -> torch.Tensor:
        """Σ of ``members``' rows of Bᵀ, accumulated in float64 over blocks of rows."""
        total = torch.zeros(self.emission_t.shape[1], dtype=torch.float64,
                            device=self.emission_t.device)
        index = torch.as_tensor(members, device=self.emission_t.device)
        for start in range(0, len(index), BLOCK):
            rows = self.emission_t.index_select(0, index[start:start + BLOCK])
            total += rows.sum(0, dtype=torch.float64)
        return total

    def sum(self, members: np.ndarray) -> torch.Tensor:
        """Σ_{v ∈ members} Bᵀ[v] in float64 (``members``: distinct token ids, any order)."""
        members = np.sort(np.asarray(members, dtype=np.int64))
        with self._lock:
            return self._sum_sorted(members)

    def _sum_sorted(self, members: np.ndarray) -> torch.Tensor:
        best, best_size = None, self.max_difference * len(members)
        for k, (kept, _) in enumerate(self._kept):
            if abs(len(kept) - len(members)) > best_size:
                continue
            removed = np.setdiff1d(kept, members, assume_unique=True)
            added = np.setdiff1d(members, kept, assume_unique=True)
            if len(removed) + len(added) <= best_size:
                best, best_size = (k, removed, added), len(removed) + len(added)
        if best is None:
            total = self._direct(members)
            self._kept.insert(0, (members, total))
            del self._kept[self.capacity:]
            return total.clone()
        k, removed, added = best
        kept = self._kept.pop(k)
        self._kept.insert(0, kept)                               # most recently used first
        return kept[1] - self._direct(removed) + self._direct(added)


class GroupSumsMemo:
    """Pair sums [n, h] of token groups, kept per emission by a digest of the groups (module
    docstring); at most ``max_bytes`` of them (32 MiB by default: ≈ 800 results of 20 groups
    at h = 512), the least recently used dropped first."""

    def __init__(self, max_bytes: int = 32 << 20):
        self.max_bytes = max_bytes
        self._kept: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @staticmethod
    def key(members: list[np.ndarray]) -> bytes:
        """A 16-byte BLAKE2b digest of the groups (their sizes, then their token ids in order):
        equal groups, in the same order, give the same key."""
        digest = hashlib.blake2b(digest_size=16)
        digest.update(np.fromiter(map(len, members), dtype=np.int64, count=len(members)))
        for tokens in members:
            digest.update(np.ascontiguousarray(tokens, dtype=np.int64))
        return digest.digest()

    def get(self, key: bytes) -> torch.Tensor | None:
        with self._lock:
            got = self._kept.get(key)
            if got is not None:
                self._kept.move_to_end(key)
            return got

    def put(self, key: bytes, sums: torch.Tensor) -> None:
        size = sums.numel() * sums.element_size()
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._kept.pop(key, None)
            if old is not None:
                self._bytes -= old.numel() * old.element_size()
            self._kept[key] = sums
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= dropped.numel() * dropped.element_size()
