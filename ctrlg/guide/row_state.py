"""Per-row decoding state of :class:`ctrlg.ConstraintLogitsProcessor`, vectorised over the batch.

transformers calls a logits processor with the whole ``input_ids`` [B, T] at every step; rows may
be reordered or duplicated between calls (beam search, ``num_return_sequences``). Each row needs
its DFA state s (a function of its generated tokens) and its prior p over the HMM's hidden state
(:mod:`ctrlg.guide.priors`). :class:`RowStates` keeps both for the previous call as arrays — DFA states
int64 [B], priors [B, h], the generated ids [B, L] — and finds every row's parent without hashing
prefixes:

* fast path: the rows kept their order (``generated[:, :-1]`` equals the previous ids): parent i = i;
* otherwise one vectorised comparison of every row's prefix with every previous row
  (``[B, B_prev, L]`` booleans, restricted to rows of the same DFA), first match wins;
* rows with no parent (a new ``generate`` call, or a gap) are replayed from the start, all at once.

Then one step for all rows: s' = δ(s, v) (:meth:`ctrlg.dfa.TokenDFA.step_many`, one call per
distinct DFA) and p' = ``prior.advance(p, v)`` (one call). Constraints whose exact mask refines
their automaton's (:mod:`ctrlg.guide.masks`: canonical filter, grammar) also keep a *cursor* per
row, advanced by ``mask.advance(cursor, v)`` and carried along with the row's parent. Cost per
step: O(B·B_prev·L) compares in the worst case, O(B·L) on the fast path, plus the prior's
O(B·h²) and the cursors' own step.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ctrlg.dfa.core import TokenDFA

__all__ = ["RowStates"]


class RowStates:
    """DFA states and priors of the rows of one ``generate`` call (module docstring).

    Args:
        dfas: the distinct DFAs (``dfa_index`` values below index this list).
        prior: a prior source (:mod:`ctrlg.guide.priors`) or None (logical mode: no priors).
        masks: one :class:`~ctrlg.guide.masks.TokenMask` per DFA (or None): those that
            ``refines`` get a cursor per row (:attr:`cursors`).

    Attributes:
        cursors: after :meth:`update`, the rows' mask cursors (a list, ``None`` for rows whose
            mask keeps none), or ``None`` when no mask keeps one.
        parents: after :meth:`update`, each row's parent among the previous call's rows (int64
            [B], −1 where it has none), or ``None`` before the first call.
    """

    def __init__(self, dfas: Sequence[TokenDFA], prior=None, masks: Sequence | None = None):
        self.dfas = list(dfas)
        self.prior = prior
        self._initial = np.array([d.initial for d in self.dfas], dtype=np.int64)
        self.masks = list(masks) if masks is not None else [None] * len(self.dfas)
        self._stateful = [m is not None and m.refines for m in self.masks]
        self.reset()

    def reset(self) -> None:
        """Forget the previous call (a new ``generate`` call starts)."""
        self._ids: torch.Tensor | None = None
        self._dfa_index: torch.Tensor | None = None
        self._states: np.ndarray | None = None
        self._priors: torch.Tensor | None = None
        self.cursors: list | None = None
        self.parents: np.ndarray | None = None

    def update(self, generated: torch.Tensor, dfa_index: torch.Tensor
               ) -> tuple[np.ndarray, torch.Tensor | None]:
        """(DFA states int64 [B], priors [B, h] or None) of rows whose generated tokens are
        ``generated`` [B, L] (tokens ``≥ V`` are not allowed; pass any valid id for rows whose
        state does not matter) and whose DFA is ``dfas[dfa_index[i]]``."""
        generated = generated.to("cpu", torch.long)
        dfa_index = dfa_index.to("cpu", torch.long)
        B, L = generated.shape
        if L == 0:
            states = self._initial[dfa_index.numpy()]
            priors = None if self.prior is None else self.prior.initial(B)
            parent = np.full(B, -1, dtype=np.int64)
        else:
            parent = self._parents(generated[:, :-1], dfa_index)
            if (parent >= 0).all():
                states, priors = self._step(self._states[parent], self._gather(parent),
                                            dfa_index, generated[:, -1])
            else:
                states, priors = self._replay(generated, dfa_index, parent)
        if any(self._stateful):
            self.cursors = self._advance_cursors(generated, dfa_index.numpy(), parent)
        self._ids, self._dfa_index, self._states, self._priors = generated, dfa_index, states, priors
        self.parents = parent
        return states, priors

    def _advance_cursors(self, generated: torch.Tensor, dfa_index: np.ndarray,
                         parent: np.ndarray) -> list:
        """Each row's mask cursor: its parent's advanced by the last token, or replayed from
        ``mask.start()`` over all its tokens when it has no parent."""
        rows = generated.tolist()
        cursors = []
        for i, k in enumerate(dfa_index.tolist()):
            mask = self.masks[k]
            if not self._stateful[k]:
                cursors.append(None)
            elif parent[i] >= 0:
                cursors.append(mask.advance(self.cursors[parent[i]], rows[i][-1]))
            else:
                cursor = mask.start()
                for tok in rows[i]:
                    cursor = mask.advance(cursor, tok)
                cursors.append(cursor)
        return cursors

    # ------------------------------------------------------------------ internals
    def _gather(self, rows: np.ndarray) -> torch.Tensor | None:
        if self._priors is None:
            return None
        return self._priors[torch.as_tensor(rows, device=self._priors.device)]

    def _parents(self, prefixes: torch.Tensor, dfa_index: torch.Tensor) -> np.ndarray:
        """Index of each row's parent in the previous call (−1: none)."""
        B = prefixes.shape[0]
        old = self._ids
        if old is None or old.shape[1] != prefixes.shape[1]:
            return np.full(B, -1, dtype=np.int64)
        if old.shape[0] == B and torch.equal(old, prefixes) and torch.equal(self._dfa_index, dfa_index):
            return np.arange(B, dtype=np.int64)
        same = (prefixes[:, None, :] == old[None, :, :]).all(-1)
        same &= dfa_index[:, None] == self._dfa_index[None, :]
        parent = same.to(torch.uint8).argmax(1)      # first match
        return torch.where(same.any(1), parent, -1).numpy().astype(np.int64)

    def _step(self, states: np.ndarray, priors: torch.Tensor | None, dfa_index: torch.Tensor,
              tokens: torch.Tensor) -> tuple[np.ndarray, torch.Tensor | None]:
        """One token for every row: δ per distinct DFA, the prior's ``advance`` once."""
        tokens_np = tokens.numpy()
        index_np = dfa_index.numpy()
        out = np.empty_like(states)
        for k in np.unique(index_np):
            rows = np.flatnonzero(index_np == k)
            out[rows] = self.dfas[k].step_many(states[rows], tokens_np[rows])
        if priors is not None:
            priors = self.prior.advance(priors, tokens.to(priors.device))
        return out, priors

    def _replay(self, generated: torch.Tensor, dfa_index: torch.Tensor, parent: np.ndarray
                ) -> tuple[np.ndarray, torch.Tensor | None]:
        """Rows with a parent take one step from it; the others replay from the start."""
        B, L = generated.shape
        states = np.empty(B, dtype=np.int64)
        priors = None if self.prior is None else self.prior.initial(B)
        found = np.flatnonzero(parent >= 0)
        lost = np.flatnonzero(parent < 0)
        if len(found):
            f = torch.as_tensor(found)
            s, p = self._step(self._states[parent[found]], self._gather(parent[found]),
                              dfa_index[f], generated[f, -1])
            states[found] = s
            if p is not None:
                priors[f.to(priors.device)] = p
        if len(lost):
            lt = torch.as_tensor(lost)
            s = self._initial[dfa_index[lt].numpy()]
            p = None if self.prior is None else self.prior.initial(len(lost))
            for t in range(L):
                s, p = self._step(s, p, dfa_index[lt], generated[lt, t])
            states[lost] = s
            if p is not None:
                priors[lt.to(priors.device)] = p
        return states, priors
