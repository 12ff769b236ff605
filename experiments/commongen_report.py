"""Score a finished CommonGen run on ranges of items, with the experiment's own tables.

    python -m experiments.commongen_report RUN_DIR [--ranges 0:500 500:993 0:993]
                                           [--baseline logical] [--resamples 1000] [--meteor | --no-meteor]
                                           [--examples 10] [--openings 8]

Reads ``RUN_DIR/generations.jsonl`` and ``config.yaml`` (e.g. the folder written by
``experiments.merge_runs``) and prints, for each range [start, stop) of dataset indices, the
metric table and the paired-bootstrap intervals of every Ctrl-G-guided method − ``--baseline``
(:func:`ctrlg.tasks.commongen.scoring.score_methods`, the same code as the main job), so a tuning range
and a reported range are scored apart; ``--examples N`` prints N side-by-side outputs of the
first range as a Markdown table. ROUGE-L is printed twice: rouge-score's in the table (the
project's metric) and pycocoevalcap's below it (the CommonGen evaluation's,
:func:`ctrlg.tasks.commongen.scoring.coco_rouge_l`). ``--openings N`` diagnoses mode collapse on the first range: the
N most common first words of each method's outputs and of the references (share of each), and
each method's BLEU-4 / CIDEr apart on the outputs that open with a word that opens under 1 % of
the references ("rare openings") and on the rest. Writes ``RUN_DIR/report.json``.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

from omegaconf import OmegaConf

from ctrlg import metrics
from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks.commongen.methods import method_spec
from ctrlg.tasks.commongen.scoring import coco_rouge_l, print_tables, reference_words, score_methods
from ctrlg.tasks.records import read_records, write_json
from experiments.common import index_range

__all__ = ["report_ranges", "side_by_side", "opening_words"]

RARE_OPENING_SHARE = 0.01   # an opening word is "rare" when it opens under 1 % of the references


def _scored_records(run_dir: Path) -> list[dict]:
    return [r for r in read_records(run_dir) if "skipped" not in r]


def _in_range(records: list[dict], start: int, stop: int) -> list[dict]:
    return [r for r in records if start <= r["index"] < stop]


def report_ranges(run_dir: Path, ranges, *, baseline: str | None = None, resamples: int | None = None,
                  meteor: bool | None = None) -> dict:
    """``{"start:stop": {"items", "reference_words", "methods", "intervals"}}`` for each range."""
    cfg = OmegaConf.load(run_dir / "config.yaml")
    if baseline is not None:
        cfg.bootstrap.baseline = baseline
    if resamples is not None:
        cfg.bootstrap.resamples = resamples
    if meteor is not None:
        cfg.metrics.meteor = meteor
    methods = list(cfg.methods)
    specs = {m: method_spec(cfg, m) for m in methods}
    records = _scored_records(run_dir)
    differing = cfg.get("differing_settings")
    if differing:   # a merge of runs that decoded the methods differently (merge_runs)
        for key, per_method in OmegaConf.to_container(differing).items():
            print(f"decoded with different {key}: "
                  + ", ".join(f"{m} {v}" for m, v in per_method.items()))
    out = {}
    for start, stop in ranges:
        chosen = _in_range(records, start, stop)
        if not chosen:
            raise ExperimentConfigError(f"no scored item of {run_dir} lies in [{start}, {stop})")
        table, intervals = score_methods(chosen, methods, specs, cfg)
        for method in methods:   # the CommonGen evaluation's own ROUGE-L beside rouge-score's
            table[method]["rouge_l_coco"] = coco_rouge_l([r[method]["text"] for r in chosen],
                                                         [r["references"] for r in chosen])
        ref_words = reference_words(chosen)
        out[f"{start}:{stop}"] = {"items": len(chosen), "reference_words": ref_words,
                                  "methods": table, "intervals": intervals}
        print(f"items [{start}, {stop}): {len(chosen)} scored")
        print_tables(table, intervals, methods, cfg, ref_words)
        print("ROUGE-L as pycocoevalcap computes it: "
              + ", ".join(f"{m} {table[m]['rouge_l_coco']:.2f}" for m in methods))
    return out


def side_by_side(run_dir: Path, count: int, start: int = 0) -> str:
    """A Markdown table of ``count`` items from index ``start``: the concepts, one reference and
    each method's output."""
    cfg = OmegaConf.load(run_dir / "config.yaml")
    methods = list(cfg.methods)
    rows = [r for r in _scored_records(run_dir) if r["index"] >= start][:count]
    cell = lambda text: text.replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| item | concepts | " + " | ".join(methods) + " | a reference |",
             "|---" * (len(methods) + 3) + "|"]
    for r in rows:
        lines.append(f"| {r['index']} | {', '.join(r['concepts'])} | "
                     + " | ".join(cell(r[m]["text"]) for m in methods)
                     + f" | {cell(r['references'][0]) if r['references'] else ''} |")
    return "\n".join(lines)


def _first_word(text: str) -> str:
    words = metrics.tokenize_for_eval(text).split()
    return words[0] if words else ""


def opening_words(records, methods, top: int = 8) -> dict:
    """Mode-collapse diagnostic: ``{"references": [[word, share], ...], method: {"top": [...],
    "rare": {...}, "common": {...}}}``, the ``top`` most common first words (lower-cased, as the
    metrics tokenise) with their share, and for each method BLEU-4 (× 100), CIDEr (pycocoevalcap
    × 10) and the item count on the outputs whose first word opens under
    :data:`RARE_OPENING_SHARE` of all references, and on the rest."""
    ref_openings = collections.Counter(_first_word(ref) for r in records for ref in r["references"])
    total_refs = sum(ref_openings.values())

    def shares(counter: collections.Counter, total: int) -> list:
        return [[word, count / total] for word, count in counter.most_common(top)]

    def score(chosen: list[dict], method: str) -> dict:
        if not chosen:
            return {"items": 0}
        hypotheses = [r[method]["text"] for r in chosen]
        references = [r["references"] for r in chosen]
        return {"items": len(chosen), "bleu4": metrics.bleu4(hypotheses, references),
                "cider": 10 * metrics.cider(hypotheses, references)}

    out: dict = {"references": shares(ref_openings, total_refs)}
    for m in methods:
        firsts = [_first_word(r[m]["text"]) for r in records]
        rare = [ref_openings[w] < RARE_OPENING_SHARE * total_refs for w in firsts]
        out[m] = {"top": shares(collections.Counter(firsts), len(records)),
                  "rare": score([r for r, flag in zip(records, rare) if flag], m),
                  "common": score([r for r, flag in zip(records, rare) if not flag], m)}
    return out


def _print_openings(result: dict, methods) -> None:
    cell = lambda pairs: ", ".join(f"{w or '∅'} {100 * s:.0f} %" for w, s in pairs)  # noqa: E731
    print("| opening words | most common first words (share) |\n|---|---|")
    print(f"| references | {cell(result['references'])} |")
    for m in methods:
        print(f"| {m} | {cell(result[m]['top'])} |")
    print("\n| method | outputs with a rare opening | BLEU-4 | CIDEr | other outputs | BLEU-4 | CIDEr |")
    print("|---|---|---|---|---|---|---|")
    num = lambda part, key: f"{part[key]:.2f}" if key in part else "–"  # noqa: E731
    for m in methods:
        rare, common = result[m]["rare"], result[m]["common"]
        print(f"| {m} | {rare['items']} | {num(rare, 'bleu4')} | {num(rare, 'cider')} | "
              f"{common['items']} | {num(common, 'bleu4')} | {num(common, 'cider')} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--ranges", type=index_range, nargs="+", default=[(0, 10**9)])
    parser.add_argument("--baseline", default=None)
    parser.add_argument("--resamples", type=int, default=None)
    parser.add_argument("--meteor", action="store_true", help="METEOR (needs java) even when the run skipped it")
    parser.add_argument("--no-meteor", action="store_true")
    parser.add_argument("--examples", type=int, default=0)
    parser.add_argument("--openings", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        result = report_ranges(args.run_dir, args.ranges, baseline=args.baseline,
                               resamples=args.resamples, meteor=False if args.no_meteor else ("auto" if args.meteor else None))
        if args.examples:
            print(side_by_side(args.run_dir, args.examples, args.ranges[0][0]))
        if args.openings:
            start, stop = args.ranges[0]
            methods = list(OmegaConf.load(args.run_dir / "config.yaml").methods)
            chosen = _in_range(_scored_records(args.run_dir), start, stop)
            result[f"openings {start}:{stop}"] = opening_words(chosen, methods, args.openings)
            _print_openings(result[f"openings {start}:{stop}"], methods)
    except ExperimentConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    write_json(args.run_dir / "report.json", result)


if __name__ == "__main__":
    main()
