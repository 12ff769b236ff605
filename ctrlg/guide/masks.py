"""One interface for exact next-token masks under the remaining budget, advanced token by token.

Every constraint the processor accepts splits the same way:

* **A**, a regular token automaton (:class:`~ctrlg.dfa.core.TokenDFA`). The guide's tables are
  built over A: :class:`~ctrlg.guide.feasibility.Feasibility` ``F_r`` (logical mode) or
  :class:`~ctrlg.guide.tables.GuideTables` ``W_r`` (Ctrl-G, p_hmm(α_A | x≤t, v)). A's feasibility
  ``F_{r-1}(δ_A(s, v))`` is a superset of the exact mask.
* **the exact mask** ``M_r(c) ⊆ {v : F_{r-1}(δ_A(s, v))}`` of the row's *cursor* ``c`` (what the
  constraint remembers of the generated tokens beyond A's state ``s``), applied after guidance
  and renormalised (:func:`~ctrlg.guide.canonical_masks.restrict_to_mask`).

=======================  ==========================  ======================  =====================
constraint               A                           cursor                  exact mask
=======================  ==========================  ======================  =====================
``TokenDFA``             the DFA itself              none                    A's own ``F`` (exact)
``CanonicalDFA``         all-encodings DFA           last two tokens         ``C_r`` (bigram test)
``GrammarConstraint``    a regular superset of L(G)  Earley set              ``G_r`` (the grammar)
``LazyTokenDFA``         its states within budget    none                    A's own ``F`` (exact)
=======================  ==========================  ======================  =====================

:class:`TokenMask` is the protocol; :func:`token_mask` builds the provider of a constraint from
the table built over its A (:func:`regular_automaton`). The processor (:mod:`ctrlg.sampler`) and
the row bookkeeping (:mod:`ctrlg.guide.row_state`) see only this interface. Cost: nothing for a
plain DFA (``refines`` is False: the table's −inf is the mask); per row and token, the provider's
``allowed`` for the others.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from ctrlg.dfa.cfg.constraint import GrammarConstraint
from ctrlg.dfa.canonical import FREE, START, token_verdicts
from ctrlg.dfa.canonical_filter import CanonicalDFA
from ctrlg.dfa.core import TokenDFA
from ctrlg.dfa.lazy import LazyTokenDFA
from ctrlg.errors import ConstraintError
from ctrlg.guide.canonical_masks import CanonicalFeasibility
from ctrlg.guide.feasibility import Feasibility
from ctrlg.guide.grammar_masks import GrammarFeasibility

__all__ = ["TokenMask", "DFAMask", "CanonicalMask", "GrammarMask", "token_mask",
           "regular_automaton", "is_constraint", "CONSTRAINT_TYPES"]

#: The constraint types the processor, ``ctrlg.generate``, beam search and insertion accept.
CONSTRAINT_TYPES = (TokenDFA, CanonicalDFA, GrammarConstraint, LazyTokenDFA)


@runtime_checkable
class TokenMask(Protocol):
    """The exact next-token mask of one constraint under the remaining budget (module docstring).

    Attributes:
        table: the feasibility (or Ctrl-G guide) table of the constraint's regular automaton A.
        refines: False when A's own feasibility is the exact mask (no cursor, no ``allowed``).
    """

    table: Feasibility
    refines: bool

    def start(self) -> Any:
        """The cursor of an empty generation."""

    def advance(self, cursor: Any, token: int) -> Any:
        """The cursor after the row emitted ``token``."""

    def allowed(self, cursor: Any, state: int, remaining: int) -> np.ndarray:
        """Bool [V]: the tokens that keep the constraint satisfiable with ``remaining`` tokens left
        (the next one included), for a row with ``cursor`` whose A-state is ``state``."""

    def check_satisfiable(self) -> None:
        """Raise UnsatisfiableConstraintError unless an accepted generation fits the budget."""


class DFAMask:
    """A plain token DFA: A is the constraint, the table's feasibility is the exact mask."""

    refines = False

    def __init__(self, table: Feasibility):
        self.table = table

    def start(self) -> None:
        return None

    def advance(self, cursor: None, token: int) -> None:
        return None

    def allowed(self, cursor: None, state: int, remaining: int) -> np.ndarray:
        return self.table.token_feasible(np.array([state]), np.array([remaining])).numpy()[0]

    def check_satisfiable(self) -> None:
        self.table.check_satisfiable()


class CanonicalMask(DFAMask):
    """A :class:`CanonicalDFA`: the bigram filter's exact masks
    (:class:`~ctrlg.guide.canonical_masks.CanonicalFeasibility`); the cursor is the pair of the
    last two generated tokens (``START`` before the first)."""

    refines = True

    def __init__(self, table: Feasibility, constraint: CanonicalDFA):
        super().__init__(table)
        self.masks = CanonicalFeasibility(table, constraint)

    def start(self) -> tuple[int, int]:
        return START, START

    def advance(self, cursor: tuple[int, int], token: int) -> tuple[int, int]:
        return cursor[1], int(token)

    def allowed(self, cursor: tuple[int, int], state: int, remaining: int) -> np.ndarray:
        before, last = cursor
        flag = FREE if last == START else int(token_verdicts(self.masks.checker, before, FREE, last))
        return self.masks.token_mask(int(state), last, flag, remaining)

    def check_satisfiable(self) -> None:
        self.table.check_satisfiable()
        self.masks.check_satisfiable()


class GrammarMask(DFAMask):
    """A :class:`~ctrlg.dfa.cfg.constraint.GrammarConstraint`: the grammar's exact budgeted masks
    (:class:`~ctrlg.guide.grammar_masks.GrammarFeasibility`); the cursor is the recogniser's chart."""

    refines = True

    def __init__(self, table: Feasibility, constraint: GrammarConstraint):
        super().__init__(table)
        self.masks = GrammarFeasibility(table, constraint)
        self.refines = not constraint.exact    # a non-recursive grammar: A is exact already

    def start(self):
        return self.masks.start()

    def advance(self, cursor, token: int):
        return self.masks.advance(cursor, int(token))

    def allowed(self, cursor, state: int, remaining: int) -> np.ndarray:
        return self.masks.token_mask(cursor, int(state), remaining)

    def check_satisfiable(self) -> None:
        self.masks.check_satisfiable()       # prunes with the table's F: implies its check


def is_constraint(obj) -> bool:
    """Whether ``obj`` is a constraint the processor accepts (:data:`CONSTRAINT_TYPES`)."""
    return isinstance(obj, CONSTRAINT_TYPES)


def regular_automaton(constraint, max_new_tokens: int | None = None) -> TokenDFA:
    """The token DFA A whose tables guide ``constraint`` (the constraint itself for a TokenDFA;
    for a :class:`~ctrlg.dfa.lazy.LazyTokenDFA`, its states within ``max_new_tokens`` tokens,
    built once per budget: :meth:`~ctrlg.dfa.lazy.LazyTokenDFA.materialize`)."""
    if isinstance(constraint, TokenDFA):
        return constraint
    if isinstance(constraint, LazyTokenDFA):
        return constraint.within_budget(max_new_tokens)
    if isinstance(constraint, (CanonicalDFA, GrammarConstraint)):
        return constraint.dfa
    raise ConstraintError(f"expected a TokenDFA, LazyTokenDFA, CanonicalDFA or grammar constraint, got "
                          f"{type(constraint).__name__}")


def token_mask(constraint, table: Feasibility) -> TokenMask:
    """The mask provider of ``constraint`` on top of ``table`` (built over
    :func:`regular_automaton` of it, same budget and EOS ids)."""
    if isinstance(constraint, CanonicalDFA):
        return CanonicalMask(table, constraint)
    if isinstance(constraint, GrammarConstraint):
        return GrammarMask(table, constraint)
    regular_automaton(constraint)   # a clear error for anything else
    return DFAMask(table)
