"""Merge infilling runs that shared the ratios out between processes into one report.

    python -m benchmarks.merge_infill RUN_A RUN_B ... --out DIR

Each run is a folder of ``python -m experiments.infill`` with the same settings except ``ratios``
(the same passages, seeds, methods, models); the merged folder holds ``generations.jsonl`` (every
run's records, ordered by ratio then passage), ``config.yaml`` (``ratios`` = the union) and
``metrics.json``, and the tables ``experiments.infill`` prints are printed for the union.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from omegaconf import OmegaConf

from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks.records import read_records
from experiments import infill


def merge(runs: list[Path], out: Path) -> dict:
    configs = [OmegaConf.load(run / "config.yaml") for run in runs]
    settings = [{k: v for k, v in OmegaConf.to_container(c, resolve=False).items()
                 if k not in ("ratios", "hydra", "resume")} for c in configs]
    for run, other in zip(runs[1:], settings[1:]):
        if other != settings[0]:
            differ = sorted(k for k in set(other) | set(settings[0]) if other.get(k) != settings[0].get(k))
            raise ExperimentConfigError(f"{run} was run with other settings than {runs[0]}: {differ}")
    ratios = sorted({float(r) for c in configs for r in c.ratios})
    records = [r for run in runs for r in read_records(run)]
    keys = [(r["target_ratio"], r["index"]) for r in records]
    if len(set(keys)) != len(keys):
        raise ExperimentConfigError("the runs share (ratio, passage) records; merge runs of disjoint ratios")
    records.sort(key=lambda r: (r["target_ratio"], r["index"]))
    cfg = configs[0]
    cfg.ratios = ratios
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out / "config.yaml")
    with open(out / "generations.jsonl", "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return infill.report(cfg, records, list(cfg.methods), out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    merge(args.runs, args.out)


if __name__ == "__main__":
    main()
