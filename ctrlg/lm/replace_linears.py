"""Swap a model's linear layers for another weight format, in place (:mod:`ctrlg.lm.int8_weights`,
:mod:`ctrlg.lm.bf16_weights`)."""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["replace_linears"]


def replace_linears(model: torch.nn.Module, make: Callable[[torch.nn.Linear], torch.nn.Module]) -> int:
    """Replace every ``torch.nn.Linear`` (subclasses included) of ``model`` by ``make(layer)`` in
    place. Returns how many."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, make(child))
                replaced += 1
    return replaced
