"""A tuning split of CommonGen *train*, drawn to match the dev split's mix of concept-set sizes.

Dev is ordered by size (items 0-499 hold 3-concept sets, 500-742 4-concept, 743-992 5-concept), so
a slice of dev tunes on one size and tests on another. This split samples train concept sets
without replacement, stratified by size in dev's proportions, and interleaves the strata so that
every prefix keeps the mix (``data.limit=N`` decodes a representative N). Consecutive rows of the
bundled ``commongen.train.src_alpha.txt`` / ``commongen.train.tgt.txt`` that share a concept set
form one item with its references.

Caveat: the adapted LM and its HMM were trained on these targets, so their beams lean towards
the references here more than on dev; rules that lean on the LM's own likelihood look better on
this split than they are.

    python -m ctrlg.data.commongen_tuning      # rebuilds bundled/commongen.train_tune.jsonl
"""

from __future__ import annotations

import json
import random
from collections import Counter
from itertools import groupby
from pathlib import Path

from ctrlg.data._files import BUNDLED_DIR, DatasetError, bundled_path
from ctrlg.data.commongen import load_commongen

__all__ = ["group_train_pairs", "stratified_tuning_split", "write_tuning_split"]

TUNING_FILE = "commongen.train_tune.jsonl"


def group_train_pairs(sources: list[str], targets: list[str]) -> list[dict]:
    """Rows ``{"concept_set": "a#b#c", "scene": [...]}`` from aligned source/target lines;
    consecutive lines with the same source form one concept set."""
    if len(sources) != len(targets):
        raise DatasetError(f"{len(sources)} source lines but {len(targets)} target lines")
    rows = []
    for source, pairs in groupby(zip(sources, targets), key=lambda pair: pair[0]):
        concepts = source.split()
        if not concepts:
            raise DatasetError("an empty concept set in the train sources")
        rows.append({"concept_set": "#".join(concepts), "scene": [t for _, t in pairs]})
    return rows


def stratified_tuning_split(rows: list[dict], size_mix: dict[int, int], seed: int = 0) -> list[dict]:
    """``size_mix[s]`` rows of each concept-set size ``s``, drawn without replacement (seeded),
    interleaved by their quantile within their stratum so each prefix keeps the proportions."""
    by_size: dict[int, list[dict]] = {}
    for row in rows:
        by_size.setdefault(len(row["concept_set"].split("#")), []).append(row)
    rng = random.Random(seed)
    keyed = []
    for size in sorted(size_mix):
        want, pool = size_mix[size], by_size.get(size, [])
        if want > len(pool):
            raise DatasetError(f"{want} concept sets of size {size} asked, train has {len(pool)}")
        for rank, row in enumerate(rng.sample(pool, want)):
            keyed.append(((rank + 0.5) / want, size, row))
    keyed.sort(key=lambda item: (item[0], item[1]))
    return [row for _, _, row in keyed]


def write_tuning_split(path: Path | None = None, size: int | None = None, seed: int = 0) -> Path:
    """Write the split (``size`` items, default dev's 993, in dev's size mix) as JSON lines."""
    dev_mix = Counter(len(example.concepts) for example in load_commongen())
    total = sum(dev_mix.values())
    size = total if size is None else size
    mix = {s: round(size * n / total) for s, n in dev_mix.items()}
    # the lines as they are (not ctrlg.hmm.sampling.read_prompts, which strips and drops blanks)
    sources = bundled_path("commongen.train.src_alpha.txt").read_text(encoding="utf-8").splitlines()
    targets = bundled_path("commongen.train.tgt.txt").read_text(encoding="utf-8").splitlines()
    rows = stratified_tuning_split(group_train_pairs(sources, targets), mix, seed)
    path = BUNDLED_DIR / TUNING_FILE if path is None else Path(path)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


if __name__ == "__main__":
    written = write_tuning_split()
    print(f"{written}: {len(load_commongen(written))} items")
