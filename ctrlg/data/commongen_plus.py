"""CommonGen+ (Ctrl-G, Zhang et al. 2024, Fig. 5): CommonGen concept sets grown to 5…9 concepts
with further concepts taken from their own reference sentences, to test constraints with more
concepts than CommonGen's 3-5.

**Construction** (deterministic given ``seed``; :func:`build_commongen_plus`). For each size
k ∈ ``sizes``, the dev items are visited in a seeded random order, and an item with fewer than k
concepts becomes a k-concept item when one of its references can supply the missing ones:

1. *Candidate references*: those that already use every original concept (some inflection of
   each, whole words, :func:`ctrlg.dfa.inflections`).
2. *Extra concepts* of a reference: its words, lower-cased, that have at least three letters,
   are not function words (:data:`FUNCTION_WORDS`; nor is their lemma), and are nouns or verbs for lemminflect
   with no adjective or adverb reading (CommonGen's own concepts are nouns and verbs: 2,232 and
   1,497 in dev). A word with one reading keeps it (``stood`` → ``stand_V``, ``camera`` →
   ``camera_N``); one with both is a verb when it ends in -ing/-ed (``looking`` → ``look_V``),
   else its noun lemma without a tag (``kids`` → ``kid``: every inflection of either part of
   speech counts, as for an untagged CommonGen concept). Words that are a form of an original
   concept (``building`` for ``building_N``) and lemmas already among the concepts are skipped,
   so one word never satisfies two concepts.
3. One candidate reference with at least k − |concepts| extra concepts is drawn, and that many
   of its extra concepts are drawn (both uniformly, from a generator seeded by
   ``(seed, k, item)``); they follow the original concepts.
4. The new item's references are those of the item that use all k concepts (the drawn reference
   always does), so every item has a human sentence that satisfies it.

The first ``per_size`` items that qualify are kept for each k. Rows are written in size order
(``size``, then dev order within a size), with ``concept_set`` / ``scene`` as in CommonGen plus
``size``, ``source`` (the dev item's index) and ``added`` (the extra concepts).

    python -m ctrlg.data.commongen_plus [--sizes 5 6 7 8 9] [--per-size 100] [--seed 0] [--out F]

rebuilds ``ctrlg/data/bundled/commongen_plus.dev.jsonl`` (the bundled copy: 100 items per size,
seed 0) from the bundled CommonGen dev split, byte for byte.
"""

from __future__ import annotations

import argparse
import json
import re
import zlib
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ctrlg.data._files import BUNDLED_DIR, DatasetError
from ctrlg.data.commongen import CommonGenExample, load_commongen
from ctrlg.dfa.words import inflections

__all__ = ["FUNCTION_WORDS", "build_commongen_plus", "plus_rows", "write_commongen_plus",
           "uses_concept", "BUNDLED_NAME"]

BUNDLED_NAME = "commongen_plus.dev.jsonl"

#: Words never taken as concepts: articles, pronouns, prepositions, conjunctions, auxiliaries,
#: modals, quantifiers and a few adverbs that lemminflect also lists as nouns or verbs.
FUNCTION_WORDS = frozenset("""
a an the this that these those there here it its it's they them their theirs he him his she her
hers we us our ours you your yours i me my mine one ones someone something somebody anyone
anything everyone everything nobody nothing who whom whose which what where when why how
and or but nor so yet for if then than as because while although though until unless since
of in on at by to from with without into onto upon over under above below between among through
across along around about against after before behind beside besides beyond during near off out
up down away back toward towards within inside outside past per via
is am are was were be been being has have had having do does did doing done
can could may might must shall should will would
all any both each either every few many more most much no none not other several some such own
same very too also just only even still again ever never always often really quite rather
another next last first second new old other
myself yourself himself herself itself ourselves yourselves themselves
""".split())

_WORD = re.compile(r"[A-Za-z]+")
_POS_TAG = {"NOUN": "_N", "VERB": "_V", None: ""}


def uses_concept(sentence: str, concept: str, pos: str | None) -> bool:
    """Whether ``sentence`` uses ``concept`` in some inflection, as a whole word (any case)."""
    words = {w.lower() for w in _WORD.findall(sentence)}
    return any(form.lower() in words for form in inflections(concept, pos))


def _extra_concept(word: str) -> tuple[str, str | None] | None:
    """``(lemma, universal POS or None)`` of a reference word usable as a concept, or None."""
    import lemminflect

    if len(word) < 3 or word in FUNCTION_WORDS:
        return None
    lemmas = lemminflect.getAllLemmas(word)
    if not lemmas or "ADJ" in lemmas or "ADV" in lemmas:
        return None
    verb, noun = lemmas.get("VERB", ()), lemmas.get("NOUN", ())
    if verb and not noun:
        found = verb[0], "VERB"
    elif noun and not verb:
        found = noun[0], "NOUN"
    elif verb and word.endswith(("ing", "ed")) and verb[0] != word:
        found = verb[0], "VERB"
    else:
        found = (noun or verb)[0], None
    return None if found[0] in FUNCTION_WORDS else found
def _extras(reference: str, taken: set[str]) -> list[tuple[str, str | None]]:
    """The distinct extra concepts of one reference, in sentence order, skipping the words in
    ``taken`` (every form of the item's concepts) and the lemmas that are one of them."""
    out: dict[str, str | None] = {}
    for word in _WORD.findall(reference.lower()):
        found = None if word in taken else _extra_concept(word)
        if found is not None and found[0] not in taken and found[0] not in out:
            out[found[0]] = found[1]
    return list(out.items())


def _grow(example: CommonGenExample, size: int, rng: np.random.Generator
          ) -> tuple[CommonGenExample, list[str]] | None:
    """``example`` grown to ``size`` concepts from one of its references (module docstring),
    with the added ``word_POS`` concepts; None when no reference supplies enough."""
    need = size - len(example.concepts)
    if need < 1:
        return None
    taken = {form.lower() for c, p in zip(example.concepts, example.pos)
             for form in inflections(c, p)}
    candidates = []
    for reference in example.references:
        if all(uses_concept(reference, c, p) for c, p in zip(example.concepts, example.pos)):
            extras = _extras(reference, taken)
            if len(extras) >= need:
                candidates.append(extras)
    if not candidates:
        return None
    extras = candidates[int(rng.integers(len(candidates)))]
    chosen = [extras[i] for i in sorted(rng.choice(len(extras), size=need, replace=False))]
    concepts = example.concepts + tuple(lemma for lemma, _ in chosen)
    pos = example.pos + tuple(p for _, p in chosen)
    references = tuple(r for r in example.references
                       if all(uses_concept(r, c, p) for c, p in zip(concepts, pos)))
    added = [f"{lemma}{_POS_TAG[p]}" for lemma, p in chosen]
    key = example.key + "#" + "#".join(added)
    return CommonGenExample(concepts, pos, references, key), added


def build_commongen_plus(examples: Sequence[CommonGenExample] | None = None,
                         sizes: Iterable[int] = (5, 6, 7, 8, 9), per_size: int = 100,
                         seed: int = 0) -> list[tuple[int, int, CommonGenExample, list[str]]]:
    """``[(size, source index, item, added concepts)]``: at most ``per_size`` grown items per size
    (module docstring), in size order, dev order within a size. ``examples`` defaults to the
    bundled CommonGen dev split."""
    examples = load_commongen() if examples is None else list(examples)
    sizes = [int(k) for k in sizes]
    if not sizes or min(sizes) < 2 or per_size < 1:
        raise DatasetError(f"sizes must be ≥ 2 and per_size ≥ 1, got sizes={sizes}, "
                           f"per_size={per_size}")
    rows = []
    for size in sizes:
        order = np.random.default_rng([seed, size]).permutation(len(examples))
        kept = []
        for index in order.tolist():
            rng = np.random.default_rng([seed, size, zlib.crc32(examples[index].key.encode())])
            grown = _grow(examples[index], size, rng)
            if grown is not None:
                kept.append((size, index, *grown))
                if len(kept) == per_size:
                    break
        rows.extend(sorted(kept, key=lambda row: row[1]))
    return rows


def plus_rows(built) -> list[dict]:
    """The JSON rows of :func:`build_commongen_plus`'s items (CommonGen's fields plus ``size``,
    ``source`` and ``added``)."""
    return [{"concept_set": item.key, "scene": list(item.references), "size": size,
             "source": index, "added": added} for size, index, item, added in built]


def write_commongen_plus(path, **options) -> Path:
    """Build (``options`` of :func:`build_commongen_plus`) and write the JSON-lines file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(row, ensure_ascii=False) for row in plus_rows(build_commongen_plus(**options))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5, 6, 7, 8, 9])
    parser.add_argument("--per-size", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(BUNDLED_DIR / BUNDLED_NAME))
    args = parser.parse_args(argv)
    path = write_commongen_plus(args.out, sizes=args.sizes, per_size=args.per_size,
                                seed=args.seed)
    counts = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        size = json.loads(line)["size"]
        counts[size] = counts.get(size, 0) + 1
    print(f"{path}: items per size {counts}")


if __name__ == "__main__":
    main()
