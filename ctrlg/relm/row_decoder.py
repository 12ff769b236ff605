"""Incremental next-token log probabilities for a batch of rows that grow one token at a time
behind a shared context: the decoding loop of ReLM's random sampling (:func:`ctrlg.relm.sample`).

Row r is ``context · u_r · w_r``: the shared context (its key/value cache computed once by
:class:`ctrlg.relm.query._ContextScorer`), a prefix ``u_r`` of its own length, and the tokens
``w_r`` appended so far. The rows' cache is laid out as

    [ context (n) | prefixes, left-padded to P | one slot per step ]

with attention-mask zeros on the padding slots and on the step slots of finished rows, and
explicit position ids (the count of real tokens before each slot), so row r sees exactly the
positions 0 … n + |u_r| + |w_r| − 1 that it would see alone; rotary embeddings only read
positions, so its logits equal the unpadded run's up to float rounding.

Cost, per sampling batch of B rows and T steps: one forward over B·P prefix tokens, then T
forwards of B tokens, O(B·(P + T)) MLP work; re-encoding every suffix at every step (what
``_ContextScorer.__call__`` does for the shortest-path search, whose frontier rows share no
cache) costs O(B·Σ_t (P + t)) = O(B·T·(P + T/2)). The prefix's own token log probabilities come
out of the first forward instead of one call per row.

Models without a reusable :class:`transformers.DynamicCache` fall back to full re-encoding.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ctrlg.lm.shared_context import cache_keyword, returned_cache

__all__ = ["RowDecoder"]


class RowDecoder:
    """``start(prefixes)`` then ``advance(tokens)`` per step (module docstring).

    Args:
        scorer: the shared context's ``_ContextScorer`` (its ``layers`` cache, or None for
            models without a reusable cache, and ``context_log_probs``).
    """

    def __init__(self, scorer):
        self.scorer = scorer
        self.model = scorer.model
        self.device = scorer.device
        self.n = len(scorer.context)

    # ------------------------------------------------------------------ public
    @torch.no_grad()
    def start(self, prefixes: Sequence[Sequence[int]]) -> tuple[torch.Tensor, list[float]]:
        """float32 [B, V] next-token log probabilities after each row's prefix, and each prefix's
        log probability Σ_i log p_lm(u_i | context, u_<i)."""
        self.rows = [list(map(int, p)) for p in prefixes]
        self.batch = len(self.rows)
        if self.scorer.layers is None:
            return self._full_start()
        lengths = [len(p) for p in self.rows]
        width = max(lengths, default=0)
        self.next_position = [self.n + length for length in lengths]
        context_lp = self.scorer.context_log_probs
        self.mask = torch.ones(self.batch, self.n, dtype=torch.long)
        self.cache = self.scorer._cache(self.batch)
        if width == 0:
            return context_lp.expand(self.batch, -1).clone(), [0.0] * self.batch
        ids = torch.zeros(self.batch, width, dtype=torch.long)
        pad_mask = torch.zeros(self.batch, width, dtype=torch.long)
        positions = torch.full((self.batch, width), self.n, dtype=torch.long)
        for r, prefix in enumerate(self.rows):
            if prefix:
                ids[r, width - len(prefix):] = torch.tensor(prefix)
                pad_mask[r, width - len(prefix):] = 1
                positions[r, width - len(prefix):] = torch.arange(self.n, self.n + len(prefix))
        log_probs = self._forward(ids, pad_mask, positions)          # [B, width, V]
        out = torch.empty(self.batch, context_lp.shape[-1])
        prefix_scores = []
        for r, prefix in enumerate(self.rows):
            if not prefix:
                out[r] = context_lp
                prefix_scores.append(0.0)
                continue
            out[r] = log_probs[r, -1]
            first = width - len(prefix)
            score = float(context_lp[prefix[0]])
            for i in range(1, len(prefix)):
                score += float(log_probs[r, first + i - 1, prefix[i]])
            prefix_scores.append(score)
        return out, prefix_scores

    @torch.no_grad()
    def advance(self, tokens: Sequence[int | None]) -> torch.Tensor:
        """Append ``tokens[r]`` to row r (None: the row has finished and takes no token) and
        return float32 [B, V] next-token log probabilities (rows that took none: undefined)."""
        if len(tokens) != self.batch:
            raise ValueError(f"advance() takes one entry per row ({self.batch}), "
                             f"got {len(tokens)}")
        for r, t in enumerate(tokens):
            if t is not None:
                self.rows[r].append(int(t))
        if self.scorer.layers is None:
            return self._full(tokens)
        ids = torch.tensor([[0 if t is None else int(t)] for t in tokens])
        step_mask = torch.tensor([[0 if t is None else 1] for t in tokens])
        positions = torch.tensor([[self.next_position[r]] for r in range(self.batch)])
        for r, t in enumerate(tokens):
            if t is not None:
                self.next_position[r] += 1
        return self._forward(ids, step_mask, positions)[:, -1]

    # ------------------------------------------------------------------ internals
    def _forward(self, ids: torch.Tensor, step_mask: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
        """Run the new slots against the cache (which grows by their width); float32 log
        probabilities [B, width, V] on the CPU."""
        self.mask = torch.cat([self.mask, step_mask], 1)
        out = self.model(input_ids=ids.to(self.device), attention_mask=self.mask.to(self.device),
                         position_ids=positions.to(self.device), use_cache=True,
                         **{cache_keyword(self.model): self.cache})
        self.cache = returned_cache(out)
        return torch.log_softmax(out.logits.float(), -1).cpu()

    def _full_start(self) -> tuple[torch.Tensor, list[float]]:
        scores = [float(self.scorer.token_log_probs(p).sum()) if p else 0.0 for p in self.rows]
        return self.scorer(self.rows), scores

    def _full(self, tokens: Sequence[int | None]) -> torch.Tensor:
        live = [r for r, t in enumerate(tokens) if t is not None]
        out = torch.zeros(self.batch, self.scorer.context_log_probs.shape[-1])
        if live:
            out[live] = self.scorer([self.rows[r] for r in live])
        return out
