"""The editing benchmark's tables (Ctrl-G Table 3's shape) from a run's records.

Rows are the methods plus two sanity rows — ``reference`` (the cut spans) and ``shuffled`` (their
words in random order); columns are the constraint kinds × quality / success / overall
(:mod:`ctrlg.tasks.edit.scoring`). Quality: fluency and coherence (mean NLL per token under the
scorer; lower is better), BLEU-4 / ROUGE-L against the reference span (× 100), distinct-2 and the
share of repeated 3-grams (fluency averaged over the outputs that hold a token; ``empty`` counts
the others, which fail overall); where the first keyphrase starts, as a fraction of the text
(``keyphrase_at``, over the examples with keyphrases, a diagnostic). Overall's fluency, coherence and repetition thresholds are the 90th
percentiles of the reference spans' own, per operation, one value per cut span. Intervals: percentile bootstrap
over examples (95 %) for each overall rate, and paired over the same examples for ctrlg − each
other method.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ctrlg import metrics
from ctrlg.tasks.edit.scoring import keyphrase_position, overall, reference_thresholds
from ctrlg.tasks.records import format_table

__all__ = ["SANITY_ROWS", "summarise", "format_report"]

SANITY_ROWS = ("reference", "shuffled")


def _entry(record: dict, row: str) -> dict:
    if row == "reference":
        return {"text": record["reference"], **record["reference_scores"]}
    return record[row]


def _interval(values: np.ndarray, resamples: int, seed: int) -> tuple[float, float]:
    if not resamples or len(values) < 2:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def summarise(records: Sequence[dict], methods: Sequence[str], kinds: Sequence[str],
              resamples: int = 1000, seed: int = 0) -> dict:
    """{"thresholds", "rows": [{row, kind, …}], "paired": [...], "skipped_examples"} (module
    docstring)."""
    done = [r for r in records if "skipped" not in r]
    spans = {(r["passage"], r["operation"]): r["reference_scores"] | {"operation": r["operation"]}
             for r in done}
    thresholds = reference_thresholds(list(spans.values())) if spans else {}
    rows, overall_of = [], {}
    for row in [*methods, *SANITY_ROWS]:
        for kind in [*kinds, "all"]:
            mine = [r for r in done if kind == "all" or r["kind"] == kind]
            if not mine:
                continue
            entries = [_entry(r, row) for r in mine]
            ok = np.array([overall(e["success"], r["operation"], e["fluency"], e["coherence"],
                                   thresholds, e.get("repeated3"))
                           for e, r in zip(entries, mine)], dtype=float)
            overall_of[(row, kind)] = (ok, [r["index"] for r in mine])
            scored = metrics.CorpusScorer([e["text"] for e in entries],
                                          [[r["reference"]] for r in mine], ("bleu4", "rouge_l"))
            overlap = scored.score(range(len(mine)))
            coherence = [e["coherence"] for e in entries if e.get("coherence") is not None]
            positions = [p for e, r in zip(entries, mine)
                         if (p := keyphrase_position(r.get("keyphrases") or [], e["text"])) is not None]
            low, high = _interval(ok, resamples, seed)
            rows.append({
                "row": row, "kind": kind, "examples": len(mine),
                "overall": 100 * ok.mean(), "overall_low": 100 * low, "overall_high": 100 * high,
                "success": 100 * float(np.mean([e["success"] for e in entries])),
                # over the outputs with a token (an empty one has no NLL; it fails overall)
                "fluency": _finite_mean([e["fluency"] for e in entries]),
                "empty": sum(not np.isfinite(e["fluency"]) for e in entries),
                "coherence": float(np.mean(coherence)) if coherence else None,
                "bleu4": overlap["bleu4"], "rouge_l": overlap["rouge_l"],
                "distinct2": float(np.mean([e["distinct2"] for e in entries])),
                "repeated3": 100 * float(np.mean([e["repeated3"] for e in entries])),
                "keyphrase_at": float(np.mean(positions)) if positions else None,
                "seconds": float(np.mean([r["seconds"][row] for r in mine]))
                if row in methods else None,
            })
    paired = []
    if "ctrlg" in methods:
        for other in [m for m in methods if m != "ctrlg"]:
            for kind in [*kinds, "all"]:
                if ("ctrlg", kind) not in overall_of:
                    continue
                a, _ = overall_of[("ctrlg", kind)]
                b, _ = overall_of[(other, kind)]
                low, high = _interval(a - b, resamples, seed)
                paired.append({"pair": f"ctrlg − {other}", "kind": kind,
                               "delta": 100 * float((a - b).mean()), "low": 100 * low,
                               "high": 100 * high})
    return {"thresholds": thresholds, "rows": rows, "paired": paired,
            "skipped_examples": [r["index"] for r in records if "skipped" in r]}


def format_report(result: dict) -> str:
    """Three markdown tables: overall / success per kind, quality over all kinds, paired deltas."""
    rows = result["rows"]
    kinds = [k for k in dict.fromkeys(r["kind"] for r in rows)]
    names = list(dict.fromkeys(r["row"] for r in rows))
    by = {(r["row"], r["kind"]): r for r in rows}
    table = []
    for name in names:
        line = {"row": name}
        for kind in kinds:
            r = by.get((name, kind))
            if r:
                line[f"{kind} overall"] = f"{r['overall']:.1f} [{r['overall_low']:.1f}, {r['overall_high']:.1f}]"
                line[f"{kind} success"] = f"{r['success']:.1f}"
                line[f"{kind} fluency"] = f"{r['fluency']:.2f}" if r["fluency"] is not None else "–"
        table.append(line)
    columns = ["row"] + [f"{k} {c}" for k in kinds for c in ("overall", "success", "fluency")]
    out = [format_table(table, columns,
                        ["method"] + [f"{k}: {c}" for k in kinds
                                      for c in ("overall % (95 % CI)", "success %", "fluency NLL")])]
    quality = [by[(n, "all")] for n in names if (n, "all") in by]
    out.append(format_table(quality, ["row", "examples", "empty", "fluency", "coherence", "bleu4",
                                      "rouge_l", "distinct2", "repeated3", "keyphrase_at", "seconds"],
                            ["method (all kinds)", "examples", "empty", "fluency NLL", "coherence NLL",
                             "BLEU-4", "ROUGE-L", "distinct-2", "repeated 3-grams %",
                             "first keyphrase at", "s / example"]))
    if result["paired"]:
        cells = [{**p, "interval": f"{p['delta']:+.1f} [{p['low']:+.1f}, {p['high']:+.1f}]"}
                 for p in result["paired"]]
        out.append(format_table(cells, ["pair", "kind", "interval"],
                                ["paired", "kind", "overall Δ points (95 % CI)"]))
    thresholds = result["thresholds"]
    out.append("thresholds (90th percentile of the references' NLL and repeated 3-grams): " + ", ".join(
        f"{op}: " + ", ".join(f"{k} {v:.2f}" for k, v in t.items()) for op, t in thresholds.items()))
    return "\n\n".join(out)


def _finite_mean(values) -> float | None:
    """The mean of the finite values, None when there is none."""
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else None
