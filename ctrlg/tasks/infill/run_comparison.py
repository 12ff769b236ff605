"""Two infilling runs of one method compared on the same passages and masks (e.g. float32 against
bfloat16 weights): per ratio, each run's corpus BLEU-4 / ROUGE-L, the paired bootstrap of the
second − the first (Koehn 2004, :func:`ctrlg.metrics.paired_bootstrap`), the share of identical
completions, seconds per passage and success."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ctrlg import metrics
from ctrlg.errors import CtrlgError
from ctrlg.tasks.infill.pipeline import METRICS

__all__ = ["RunMismatchError", "paired_rows"]


class RunMismatchError(CtrlgError, ValueError):
    """The two runs masked a shared passage differently: they are not paired."""


def _by_item(records: Sequence[dict]) -> dict[tuple, dict]:
    return {(r["index"], float(r["target_ratio"])): r for r in records if "skipped" not in r}


def paired_rows(first: Sequence[dict], second: Sequence[dict], method: str = "ctrlg",
                resamples: int = 1000, seed: int = 0, same_masks_only: bool = False) -> list[dict]:
    """One row per target ratio shared by the two runs' records, then one over all of them
    (``target_ratio`` "all"), on the (passage, ratio) items both hold. An item masked differently
    in the two runs raises :class:`RunMismatchError`, or with ``same_masks_only`` is left out
    (each row counts them in ``other_masks``: e.g. a run whose shards redrew some masks)."""
    a, b = _by_item(first), _by_item(second)
    shared, other_masks = [], []
    for key in sorted(set(a) & set(b)):
        if a[key]["masked"] == b[key]["masked"]:
            shared.append(key)
        elif same_masks_only:
            other_masks.append(key)
        else:
            raise RunMismatchError(f"passage {key[0]} at ratio {key[1]} is masked differently in the "
                                   "two runs: compare runs made with the same seed and mask settings "
                                   "(or leave such items out: same_masks_only)")
    rows = []
    for target in sorted({k[1] for k in shared}) + ["all"]:
        keys = [k for k in shared if target == "all" or k[1] == target]
        references = [[a[k]["original"]] for k in keys]
        scorers = [metrics.CorpusScorer([run[k][method]["text"] for k in keys], references, METRICS)
                   for run in (a, b)]
        full = range(len(keys))
        rows.append({
            "target_ratio": target, "passages": len(keys),
            "other_masks": sum(target == "all" or k[1] == target for k in other_masks),
            "first": scorers[0].score(full), "second": scorers[1].score(full),
            "second_minus_first": metrics.paired_bootstrap(scorers[1], scorers[0], resamples, seed),
            "identical": 100 * float(np.mean([a[k][method]["text"] == b[k][method]["text"] for k in keys])),
            "seconds": [float(np.mean([run[k]["seconds"][method] for k in keys])) for run in (a, b)],
            "success": [100 * float(np.mean([run[k][method]["accepted"] for k in keys])) for run in (a, b)]})
    return rows
