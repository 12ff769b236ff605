"""Size estimates of the automata whose states grow exponentially with the input, checked before
any work so that an impossible request fails at once with the bound it exceeds.

A conjunction of k "X occurs somewhere" constraints must remember which of the k have occurred,
so its minimal automaton has at least 2^k states, times the partial matches it tracks:

* :func:`keyword_states` — whole-word keyword groups (:func:`ctrlg.dfa.keywords`,
  :func:`ctrlg.dfa.commongen_constraint`): (k + 1)·2^k, times the word counts a counter tells
  apart. Measured on SmolLM2 with CommonGen concepts: 2,567 / 11,784 / 55,306 states for 8 / 10
  / 12 groups (estimates 2,304 / 11,264 / 53,248); with 5-30 words, 10 concepts: 268,809
  (estimate 349,184).
* :func:`substring_states` — strings that must all occur (:func:`ctrlg.dfa.contains_all`):
  2^k·(1 + Σ|wᵢ|/2) for patterns of |wᵢ| symbols (characters, or tokens in canonical mode).
  Measured: 1,233 / 5,825 states for 6 / 8 CommonGen words (estimates 992 / 5,120).

:data:`MAX_STATES` (500,000 estimated states; about 2 GB while the product is built) is the
default bound; every builder takes ``max_states=`` to raise it. Operations whose size cannot be
estimated up front (a product of arbitrary automata, a subset construction) bound the states they
build instead (:data:`ctrlg.dfa.ops.MAX_PRODUCT_STATES`, :data:`ctrlg.dfa.ops.MAX_CONCAT_STATES`).
"""

from __future__ import annotations

from typing import Sequence

from ctrlg.errors import ConstraintError
from ctrlg.validation import check_count

__all__ = ["MAX_STATES", "keyword_states", "max_keyword_groups", "substring_states",
           "check_estimate"]

MAX_STATES = 500_000


def keyword_states(num_groups: int, counter_values: int = 1) -> int:
    """About how many states k whole-word keyword groups need, intersected with a word counter
    that tells ``counter_values`` counts apart: (k + 1)·2^k·counts (one state per set of groups
    already seen, times the partial matches of the others, times the counts)."""
    return (num_groups + 1) * 2 ** num_groups * counter_values


def max_keyword_groups(max_states: int, counter_values: int = 1) -> int:
    """The most groups whose :func:`keyword_states` stays within ``max_states`` (0 if none)."""
    k = 0
    while keyword_states(k + 1, counter_values) <= max_states:
        k += 1
    return k


def substring_states(lengths: Sequence[int]) -> int:
    """About how many states "every one of these patterns occurs" needs, for patterns of
    ``lengths`` symbols: 2^k·(1 + Σ lengths / 2)."""
    return 2 ** len(lengths) * (1 + sum(lengths) // 2)


def check_estimate(what: str, estimate: int, max_states, advice: str) -> None:
    """ConstraintError naming ``what``, the estimate and the bound when ``estimate`` exceeds
    ``max_states`` (itself checked to be an int ≥ 1)."""
    max_states = check_count("max_states", max_states, minimum=1)
    if estimate > max_states:
        raise ConstraintError(
            f"{what} needs about {estimate:,} states (one for every set of them already seen, "
            f"2^k, times the partial matches and counts it tracks), more than max_states="
            f"{max_states:,}; {advice}, or raise max_states")
