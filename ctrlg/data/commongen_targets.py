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
templates of docs/notes/commongen_adapter.md); ``sentence_case`` keeps only the first kind.

The sentence-case captions are skewed by subject: MSCOCO's pictures give 405 of them the
concept "pizza", 193 "zebra", 135 "giraffe", and an LM adapted on them writes "A zebra standing in a
field …" whenever the concepts leave the subject open. ``sentence_case_balanced`` caps every
concept: in file order, a caption is kept while each concept of its line-aligned concept set has
been kept fewer than :data:`CONCEPT_CAP` (20) times (1,807 captions; 52 mention a giraffe or a
zebra, against 332).

Rules (:data:`SELECTIONS`): ``all`` keeps every line; ``sentence_case`` keeps a line whose first
character is an upper-case letter; ``sentence_case_balanced`` those, capped per concept (it needs
the concept lines).
"""

from __future__ import annotations

from typing import Sequence

from ctrlg.errors import CtrlgError

__all__ = ["CONCEPT_CAP", "SELECTIONS", "selected_indices"]

CONCEPT_CAP = 20
SELECTIONS = ("all", "sentence_case", "sentence_case_balanced")


def _sentence_case(line: str) -> bool:
    return line[:1].isupper()


def _capped_per_concept(indices: list[int], concepts: Sequence[str], cap: int) -> list[int]:
    """Greedy in order: keep index i while every concept of ``concepts[i]`` (space-separated) has
    been kept fewer than ``cap`` times."""
    used: dict[str, int] = {}
    kept = []
    for i in indices:
        words = concepts[i].split()
        if all(used.get(w, 0) < cap for w in words):
            kept.append(i)
            for w in words:
                used[w] = used.get(w, 0) + 1
    return kept


def selected_indices(lines: Sequence[str], select: str | None,
                     concepts: Sequence[str] | None = None) -> list[int]:
    """The indices of ``lines`` that rule ``select`` keeps (None = ``all``); ``concepts`` are the
    line-aligned concept sets (``sentence_case_balanced`` only). CtrlgError names an unknown rule,
    missing or misaligned concepts, or a rule that keeps no line."""
    select = select or "all"
    if select not in SELECTIONS:
        raise CtrlgError(f"unknown target selection {select!r}; choose one of {sorted(SELECTIONS)}")
    kept = list(range(len(lines))) if select == "all" else [
        i for i, line in enumerate(lines) if _sentence_case(line)]
    if select == "sentence_case_balanced":
        if concepts is None or len(concepts) != len(lines):
            raise CtrlgError(f"the target selection {select!r} needs one concept line per target "
                             f"({len(lines)} targets, "
                             f"{'no' if concepts is None else len(concepts)} concept lines)")
        kept = _capped_per_concept(kept, concepts, CONCEPT_CAP)
    if lines and not kept:
        raise CtrlgError(f"the target selection {select!r} keeps none of the {len(lines)} lines")
    return kept
