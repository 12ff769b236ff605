"""Prior sources: the distribution over the HMM's hidden state that each row's guidance uses.

Ctrl-G's guidance term p_hmm(α | x≤t, v) needs, per row, a prior p_t over the hidden state of the
token being generated (:mod:`ctrlg.guide.tables`). A *prior source* supplies it, for all rows at once:

* ``initial(num_rows) -> [R, h]`` — the prior of generated token 1;
* ``advance(priors [R, h], tokens [R]) -> [R, h]`` — the prior of the next token after each row
  emitted ``tokens``;
* optionally ``current(generated [B, L]) -> [B, h]`` — every row's prior afresh at each step (rows
  in ``input_ids`` order, ``generated`` = their generated tokens); when present it replaces the
  bookkeeping's priors (``initial``/``advance`` then only keep shapes).

The row bookkeeping (:mod:`ctrlg.guide.row_state`) calls them with rows in the current batch order (row i
of the result belongs to row i of ``input_ids``), so a source may also read per-step information
of the LM (e.g. hidden states captured by a hook) aligned with those rows.

:class:`HMMFilterPrior` is the HMM's filtering posterior (Ctrl-G): p_1 = π and
p_{t+1} ∝ (p_t ⊙ B[:, x_t]) A (:func:`ctrlg.guide.tables.forward_update`), O(h² + h) per row.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from ctrlg.errors import ConstraintError, VocabularyMismatchError
from ctrlg.guide.tables import PRECISIONS, forward_update, resolve_precision

__all__ = ["PriorSource", "HMMFilterPrior", "HeadPrior"]


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
        precision: of the product p·A, "float32", "bfloat16" or "auto" (the guide's
            ``precision``, :data:`ctrlg.guide.tables.PRECISIONS`).
    """

    def __init__(self, hmm, emission_t: torch.Tensor | None = None, precision: str = "float32"):
        self.hmm = hmm
        self.transition = hmm.transition.to(PRECISIONS[resolve_precision(precision, hmm.transition.device)])
        self.emission_t = hmm.emission.float().T.contiguous() if emission_t is None else emission_t

    def initial(self, num_rows: int) -> torch.Tensor:
        """π repeated ``num_rows`` times: [R, h]."""
        return self.hmm.initial.float().expand(int(num_rows), -1).clone()

    def advance(self, priors: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """One filtering step for every row: [R, h] (:func:`ctrlg.guide.tables.forward_update`)."""
        tokens = torch.as_tensor(tokens, device=priors.device).reshape(-1)
        return forward_update(priors, tokens, self.transition, self.emission_t)


class HeadPrior:
    """An LM-conditioned prior (Learning to Look Ahead, Yidou-Weng et al. 2025): for every row at
    every step, q_t = softmax(head(f_t)) with f_t the LM's feature at the row's last position —
    the input of ``model.get_output_embeddings()`` (lm_head), captured by a forward pre-hook
    during ``generate``. At step 1 f is the prompt's last position, so the guidance sees the
    prompt. Rows follow the LM's forward, so beam reordering needs no bookkeeping. Cost per row
    and token: the head's O(d·m + m·h + d·h).

    Args:
        head: a :class:`ctrlg.hmm.prior_head.PriorHead` (log q over the HMM's h states).
        model: the LM whose features the head reads (checked: width d).
        hidden_size: the HMM's h, checked against the head when given.

    Use as a context manager (or call :meth:`remove`) so the hook does not outlive ``generate``.
    """

    def __init__(self, head, model, hidden_size: int | None = None):
        embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if embeddings is None or getattr(embeddings, "weight", None) is None:
            raise ConstraintError(f"{type(model).__name__} has no output embedding (lm_head) whose "
                                  f"input a prior head could read")
        head.check(lm_hidden_size=int(embeddings.weight.shape[1]), hidden_size=hidden_size,
                   source="the prior head")
        self.head = head
        self.hidden_size = head.hidden_size
        self._features: torch.Tensor | None = None
        self._hook = embeddings.register_forward_pre_hook(self._capture)

    def _capture(self, module, args) -> None:
        self._features = args[0][:, -1, :].detach().float()

    def initial(self, num_rows: int) -> torch.Tensor:
        return torch.full((int(num_rows), self.hidden_size), 1.0 / self.hidden_size)

    def advance(self, priors: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return priors

    @torch.no_grad()
    def current(self, generated: torch.Tensor) -> torch.Tensor:
        """softmax(head(f)) for the rows of the LM's latest forward: [B, h]."""
        if self._features is None or self._features.shape[0] != generated.shape[0]:
            seen = None if self._features is None else self._features.shape[0]
            raise VocabularyMismatchError(
                f"the prior head saw LM features for {seen} rows but the processor has "
                f"{generated.shape[0]}; create HeadPrior(head, model) with the model that generates")
        features = self._features.to(next(self.head.parameters()).device)
        return self.head(features).exp()

    def remove(self) -> None:
        """Detach the hook from the LM."""
        self._hook.remove()

    def __enter__(self) -> "HeadPrior":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
