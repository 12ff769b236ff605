"""CommonGen reader (Lin et al., Findings of EMNLP 2020): generate a sentence that uses every
concept of a set, e.g. {field (noun), look (verb), stand (verb)}.

The default source is the bundled copy of the dev split (993 concept sets, 4,018 references; MIT
licence, see ``bundled/README.md``). ``path=`` reads any JSON-lines file in the same format: one
object per line with ``concept_set`` = ``"field_N#look_V#stand_V"`` (the ``_N``/``_V`` part-of-
speech tags are optional) and ``scene`` = a list of reference sentences (may be empty).
:func:`load_commongen_hub` keeps the Hugging Face ``datasets`` path (``allenai/common_gen``) for
users with a network; nothing in ctrlg's tests or defaults uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctrlg.data._files import DatasetError, bundled_path, data_path, read_jsonl

__all__ = ["CommonGenExample", "load_commongen", "load_commongen_hub", "parse_concept_set"]

_POS_NAMES = {"N": "NOUN", "V": "VERB", "A": "ADJ", "J": "ADJ", "R": "ADV"}


@dataclass(frozen=True)
class CommonGenExample:
    """One concept set with its references.

    Attributes:
        concepts: the concept lemmas in dataset order, e.g. ``("field", "look", "stand")``.
        pos: universal part-of-speech tag of each concept (``"NOUN"``, ``"VERB"``, ...), or
            ``None`` where the file gives none.
        references: human-written reference sentences.
        key: the concept set as written in the file (unique per item).
    """

    concepts: tuple[str, ...]
    pos: tuple[str | None, ...]
    references: tuple[str, ...]
    key: str


def parse_concept_set(concept_set: str) -> tuple[tuple[str, ...], tuple[str | None, ...]]:
    """Split ``"field_N#look_V#stand_V"`` into lemmas and universal POS tags."""
    if not isinstance(concept_set, str) or not concept_set.strip():
        raise DatasetError(f"concept_set must be a non-empty string, got {concept_set!r}")
    lemmas, tags = [], []
    for item in concept_set.split("#"):
        word, sep, tag = item.rpartition("_")
        if not sep or tag.upper() not in _POS_NAMES or not word:
            word, tag = item, None
        word = word.strip()
        if not word:
            raise DatasetError(f"empty concept in concept_set {concept_set!r}")
        lemmas.append(word)
        tags.append(_POS_NAMES[tag.upper()] if tag else None)
    return tuple(lemmas), tuple(tags)


def load_commongen(path=None, limit: int | None = None) -> list[CommonGenExample]:
    """Read CommonGen items from ``path`` (default: the bundled dev split), at most ``limit``.
    ``path="bundled:<file>"`` names a bundled file, e.g. ``bundled:commongen_plus.dev.jsonl``
    (CommonGen+, :mod:`ctrlg.data.commongen_plus`)."""
    source = bundled_path("commongen.dev.jsonl") if path is None else data_path(path)
    examples = []
    for row in read_jsonl(source, limit=limit):
        if "concept_set" not in row:
            raise DatasetError(f"{source}: a row lacks the field 'concept_set': {row!r:.200}")
        concepts, pos = parse_concept_set(row["concept_set"])
        references = row.get("scene", [])
        if isinstance(references, str):
            references = [references]
        examples.append(CommonGenExample(concepts, pos, tuple(references), row["concept_set"]))
    return examples


def load_commongen_hub(split: str = "validation", limit: int | None = None,
                       name: str = "allenai/common_gen") -> list[CommonGenExample]:
    """The same items from the Hugging Face hub (needs ``datasets`` and a network).

    The hub's rows hold one reference each; rows are grouped by ``concept_set_idx``. The hub has no
    part-of-speech tags, so ``pos`` is all ``None``.
    """
    try:
        import datasets  # optional hub path; a heavy import (seconds)
    except ImportError as error:  # pragma: no cover - optional dependency
        raise DatasetError("load_commongen_hub needs the 'datasets' package "
                           "(pip install datasets)") from error
    rows = datasets.load_dataset(name, split=split)  # pragma: no cover - network
    grouped: dict[int, CommonGenExample] = {}  # pragma: no cover
    for row in rows:  # pragma: no cover
        index = row["concept_set_idx"]
        if index not in grouped:
            if limit is not None and len(grouped) >= limit:
                break
            concepts = tuple(row["concepts"])
            grouped[index] = CommonGenExample(concepts, (None,) * len(concepts), (),
                                              "#".join(concepts))
        old = grouped[index]
        grouped[index] = CommonGenExample(old.concepts, old.pos,
                                          old.references + (row["target"],), old.key)
    return list(grouped.values())  # pragma: no cover
