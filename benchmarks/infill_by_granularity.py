"""Infilling runs scored per granularity (passages grouped by their coarsest blank: word, n-gram,
sentence, …): where ctrlg, logical masking and the ILM-style model each win
(:mod:`ctrlg.tasks.infill.by_granularity`).

    python -m benchmarks.infill_by_granularity benchmarks/results/infill/eval
    python -m benchmarks.infill_by_granularity RUN --ratios 0.32 0.40

Prints one table per selection (every ratio, then ``--ratios``) and writes
``by_granularity.json`` into the run folder (``--out`` to write elsewhere): ``{"all": rows,
"ratios": the selection, "selected": rows}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from omegaconf import OmegaConf

from ctrlg.tasks.infill.by_granularity import granularity_rows
from ctrlg.tasks.records import format_table, read_records


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--ratios", type=float, nargs="*", default=[0.32, 0.40])
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    methods = list(OmegaConf.load(args.run / "config.yaml").methods)
    records = read_records(args.run)
    result = {"ratios": args.ratios}
    for key, name, ratios in (("all", "all ratios", None),
                              ("selected", " + ".join(f"{r:.0%}" for r in args.ratios), args.ratios)):
        rows = granularity_rows(records, methods, ratios, resamples=args.resamples)
        result[key] = rows
        cells = [{**r, **{f"{m}_ci": _interval(r, m) for m in ("bleu4", "rouge_l")}} for r in rows]
        print(f"{name}: passages grouped by their coarsest blank")
        print(format_table(cells, ["granularity", "method", "passages", "bleu4", "rouge_l", "bleu4_ci",
                                   "rouge_l_ci"],
                           ["granularity", "method", "passages", "BLEU-4", "ROUGE-L",
                            "ctrlg − it, BLEU-4 (95 %)", "ctrlg − it, ROUGE-L (95 %)"]))
    out = args.out or args.run / "by_granularity.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def _interval(row: dict, metric: str) -> str:
    if "ctrlg_minus" not in row:
        return ""
    ci = row["ctrlg_minus"][metric]
    return f"{ci['delta']:+.2f} [{ci['low']:+.2f}, {ci['high']:+.2f}]"


if __name__ == "__main__":
    main()
