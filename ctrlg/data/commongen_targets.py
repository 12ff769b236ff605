"""Which CommonGen *train* targets an LM is adapted on (``select`` of ``experiments.adapt`` and
of the HMM's ``em.extra_select``).

The bundled train targets (39,069 sentences) come from caption corpora, and two kinds are easy
to tell apart:

* **sentence case** (3,302, 8.5 %): human-written captions in the style of MSCOCO, Flickr30k,
  VATEX and ActivityNet — "A lifeguard in red jumps into the ocean to save the drowning woman.";
* **lower case** (the other 91.5 %): Conceptual Captions' web alt-texts, lower-cased and with
  named entities replaced by hypernyms — "actor attends the premiere hosted by organisation",
  "illustration of film character and a deer"; 60 % of all targets have no final period.

CommonGen's dev and test references are crowd-written sentences of the first kind. An LM
adapted on all targets writes the second kind whenever its HMM's lookahead is vague (the caption
templates of docs/experiments.md); ``sentence_case`` keeps only the first kind.

Rules (:data:`SELECTIONS`): ``all`` keeps every line; ``sentence_case`` keeps a line whose first
character is an upper-case letter.
"""

from __future__ import annotations

from typing import Sequence

from ctrlg.errors import CtrlgError

__all__ = ["SELECTIONS", "selected_indices"]


def _sentence_case(line: str) -> bool:
    return line[:1].isupper()


SELECTIONS = {"all": lambda line: True, "sentence_case": _sentence_case}


def selected_indices(lines: Sequence[str], select: str | None) -> list[int]:
    """The indices of ``lines`` that rule ``select`` keeps (None = ``all``); CtrlgError names an
    unknown rule, or a rule that keeps no line."""
    rule = SELECTIONS.get(select or "all")
    if rule is None:
        raise CtrlgError(f"unknown target selection {select!r}; choose one of {sorted(SELECTIONS)}")
    kept = [i for i, line in enumerate(lines) if rule(line)]
    if lines and not kept:
        raise CtrlgError(f"the target selection {select!r} keeps none of the {len(lines)} lines")
    return kept
