"""Two infilling runs of one method compared on the same passages and masks
(:mod:`ctrlg.tasks.infill.run_comparison`), e.g. the story LM with float32 and with bfloat16 weights
on the tuning split:

    python -m experiments.infill data.split=tune data.limit=30 "methods=[ctrlg]" hydra.run.dir=A
    python -m experiments.infill data.split=tune data.limit=30 "methods=[ctrlg]" model.bf16_weights=true hydra.run.dir=B
    python -m benchmarks.compare_infill_runs A B --out benchmarks/results/infill/tune_bf16_weights.json

Prints the table and writes ``--out`` (default: ``comparison.json`` in the second run).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ctrlg.tasks.infill.run_comparison import paired_rows
from ctrlg.tasks.records import read_records


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--method", default="ctrlg")
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--same-masks-only", action="store_true",
                        help="leave out (and count) the items the two runs masked differently")
    args = parser.parse_args(argv)
    rows = paired_rows(read_records(args.first), read_records(args.second), args.method, args.resamples,
                       same_masks_only=args.same_masks_only)
    print(f"first: {args.first}   second: {args.second}   method: {args.method}")
    for r in rows:
        d = r["second_minus_first"]
        print(f"{r['target_ratio']!s:>5} {r['passages']:4d}  BLEU-4 {r['first']['bleu4']:.2f} → "
              f"{r['second']['bleu4']:.2f} ({d['bleu4']['delta']:+.2f} [{d['bleu4']['low']:+.2f}, "
              f"{d['bleu4']['high']:+.2f}])  ROUGE-L {r['first']['rouge_l']:.2f} → {r['second']['rouge_l']:.2f} "
              f"({d['rouge_l']['delta']:+.2f} [{d['rouge_l']['low']:+.2f}, {d['rouge_l']['high']:+.2f}])  "
              f"identical {r['identical']:.0f} %  s {r['seconds'][0]:.1f} → {r['seconds'][1]:.1f}  "
              f"success {r['success'][0]:.0f} / {r['success'][1]:.0f} %"
              + (f"  ({r['other_masks']} masked otherwise, left out)" if r["other_masks"] else ""))
    out = args.out or args.second / "comparison.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"first": str(args.first), "second": str(args.second),
                               "method": args.method, "rows": rows}, indent=1) + "\n")
    print(f"→ {out}")
    return rows


if __name__ == "__main__":
    main()
