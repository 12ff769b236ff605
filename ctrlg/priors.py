"""Prior sources: the distribution over the HMM's hidden state that each row's guidance uses.

Ctrl-G's guidance term p_hmm(α | x≤t, v) needs, per row, a prior p_t over the hidden state of the
token being generated (:mod:`ctrlg.guide`). A *prior source* supplies it, for all rows at once:

* ``initial(num_rows) -> [R, h]`` — the prior of generated token 1;
* ``advance(priors [R, h], tokens [R]) -> [R, h]`` — the prior of the next token after each row
  emitted ``tokens``.

The row bookkeeping (:mod:`ctrlg.row_state`) calls them with rows in the current batch order (row i
of the result belongs to row i of ``input_ids``), so a source may also read per-step information
of the LM (e.g. hidden states captured by a hook) aligned with those rows.

:class:`HMMFilterPrior` is the HMM's filtering posterior (Ctrl-G): p_1 = π and
p_{t+1} ∝ (p_t ⊙ B[:, x_t]) A (:func:`ctrlg.guide.forward_update`), O(h² + h) per row.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from ctrlg.guide import forward_update

__all__ = ["PriorSource", "HMMFilterPrior"]


@runtime_checkable
class PriorSource(Protocol):
    """What :class:`ctrlg.ConstraintLogitsProcessor` needs of a prior (module docstring)."""

    def initial(self, num_rows: int) -> torch.Tensor: ...

    def advance(self, priors: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor: ...


class HMMFilterPrior:
    """The HMM's filtering posterior over the hidden state of the next token (module docstring).

    Args:
        hmm: a :class:`ctrlg.HMM`.
        emission_t: Bᵀ [V, h] in float32 if already at hand (``GuideTables`` keeps one), so it is
            not copied twice.
    """

    def __init__(self, hmm, emission_t: torch.Tensor | None = None):
        self.hmm = hmm
        self.transition = hmm.transition.float()
        self.emission_t = hmm.emission.float().T.contiguous() if emission_t is None else emission_t

    def initial(self, num_rows: int) -> torch.Tensor:
        """π repeated ``num_rows`` times: [R, h]."""
        return self.hmm.initial.float().expand(int(num_rows), -1).clone()

    def advance(self, priors: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """One filtering step for every row: [R, h] (:func:`ctrlg.guide.forward_update`)."""
        tokens = torch.as_tensor(tokens, device=priors.device).reshape(-1)
        return forward_update(priors, tokens, self.transition, self.emission_t)
