"""Score a finished CommonGen run on ranges of items, with the experiment's own tables.

    python -m experiments.commongen_report RUN_DIR [--ranges 0:500 500:993 0:993]
                                           [--baseline logical] [--resamples 1000] [--meteor | --no-meteor]
                                           [--examples 10]

Reads ``RUN_DIR/generations.jsonl`` and ``config.yaml`` (e.g. the folder written by
``experiments.merge_runs``) and prints, for each range [start, stop) of dataset indices, the
metric table and the paired-bootstrap intervals of every Ctrl-G-guided method − ``--baseline``
(:func:`experiments.commongen.score_methods`, the same code as the main job), so a tuning range
and a reported range are scored apart; ``--examples N`` prints N side-by-side outputs of the
first range as a Markdown table. Writes ``RUN_DIR/report.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from experiments.common import ExperimentConfigError, read_records, write_json
from experiments.commongen import method_spec, print_tables, reference_words, score_methods

__all__ = ["report_ranges", "side_by_side"]


def _range(text: str) -> tuple[int, int]:
    try:
        start, stop = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a range is START:STOP, got {text!r}") from None
    if not 0 <= start < stop:
        raise argparse.ArgumentTypeError(f"a range needs 0 <= START < STOP, got {text!r}")
    return start, stop


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
    records = [r for r in read_records(run_dir) if "skipped" not in r]
    out = {}
    for start, stop in ranges:
        chosen = [r for r in records if start <= r["index"] < stop]
        if not chosen:
            raise ExperimentConfigError(f"no scored item of {run_dir} lies in [{start}, {stop})")
        table, intervals = score_methods(chosen, methods, specs, cfg)
        ref_words = reference_words(chosen)
        out[f"{start}:{stop}"] = {"items": len(chosen), "reference_words": ref_words,
                                  "methods": table, "intervals": intervals}
        print(f"items [{start}, {stop}): {len(chosen)} scored")
        print_tables(table, intervals, methods, cfg, ref_words)
    return out


def side_by_side(run_dir: Path, count: int, start: int = 0) -> str:
    """A Markdown table of ``count`` items from index ``start``: the concepts, one reference and
    each method's output."""
    cfg = OmegaConf.load(run_dir / "config.yaml")
    methods = list(cfg.methods)
    rows = [r for r in read_records(run_dir) if "skipped" not in r and r["index"] >= start][:count]
    cell = lambda text: text.replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| item | concepts | " + " | ".join(methods) + " | a reference |",
             "|---" * (len(methods) + 3) + "|"]
    for r in rows:
        lines.append(f"| {r['index']} | {', '.join(r['concepts'])} | "
                     + " | ".join(cell(r[m]["text"]) for m in methods)
                     + f" | {cell(r['references'][0]) if r['references'] else ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--ranges", type=_range, nargs="+", default=[(0, 10**9)])
    parser.add_argument("--baseline", default=None)
    parser.add_argument("--resamples", type=int, default=None)
    parser.add_argument("--meteor", action="store_true", help="METEOR (needs java) even when the run skipped it")
    parser.add_argument("--no-meteor", action="store_true")
    parser.add_argument("--examples", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        result = report_ranges(args.run_dir, args.ranges, baseline=args.baseline,
                               resamples=args.resamples, meteor=False if args.no_meteor else ("auto" if args.meteor else None))
        if args.examples:
            print(side_by_side(args.run_dir, args.examples, args.ranges[0][0]))
    except ExperimentConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    write_json(args.run_dir / "report.json", result)


if __name__ == "__main__":
    main()
