"""Merge infilling runs that shared the ratios, the methods or the passages out between processes
into one report.

    python -m benchmarks.merge_infill RUN_A RUN_B ... --out DIR

Each run is a folder of ``python -m experiments.infill`` with the same settings except ``ratios``,
``methods`` and the passages selected (``data.offset`` / ``data.limit``; the same seeds, models,
decoding): e.g. one process per pair of ratios for ``[logical,ctrlg]`` and one more for ``[ilm]``
over every ratio, or shards of passages run one after another. A shard of passages calibrates its
own masks (the mean masked-character ratio of *its* passages meets each target), so the union
meets it too; the reached ratio is reported. The records of a (ratio, passage)
are joined: their masks must be the same, and no method may come from two runs. A passage that
some method did not reach is left out (and counted), so every method is scored on the same
passages. The merged folder holds ``generations.jsonl`` (ordered by ratio then passage),
``config.yaml`` (``ratios`` and ``methods`` the unions) and ``metrics.json``, and the tables
``experiments.infill`` prints are printed for the union.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks.infill.pipeline import METHODS
from ctrlg.tasks.records import read_records
from experiments import infill

#: fields a record of one (ratio, passage) has the same in every run (its mask)
MASK_FIELDS = ("original", "masked", "mask_ratio", "p", "granularities")
#: fields each method adds to a record, besides the method's own
METHOD_FIELDS = {"ilm": ("ilm_seeds",)}
#: ``data`` settings that may differ between runs (which passages each run took)
SHARD_FIELDS = ("offset", "limit", "shards")


def _settings(config) -> dict:
    """The settings runs must share to be merged (everything but ratios, methods, the passages
    selected, the output folder and resume)."""
    settings = {k: v for k, v in OmegaConf.to_container(config, resolve=False).items()
                if k not in ("ratios", "methods", "hydra", "resume")}
    settings["data"] = {k: v for k, v in settings.get("data", {}).items() if k not in SHARD_FIELDS}
    return settings


def merge(runs: list[Path], out: Path) -> dict:
    configs = [OmegaConf.load(run / "config.yaml") for run in runs]
    settings = [_settings(c) for c in configs]
    for run, other in zip(runs[1:], settings[1:]):
        if other != settings[0]:
            differ = sorted(k for k in set(other) | set(settings[0]) if other.get(k) != settings[0].get(k))
            raise ExperimentConfigError(f"{run} was run with other settings than {runs[0]}: {differ}")
    methods = [m for m in METHODS if any(m in c.methods for c in configs)]
    records, dropped = _join([(run, list(c.methods), read_records(run)) for run, c in zip(runs, configs)],
                             methods)
    if dropped:
        print(f"left out {dropped} (ratio, passage) records that not every method reached",
              file=sys.stderr)
    cfg = configs[0]
    cfg.ratios = sorted({float(r) for c in configs for r in c.ratios})
    cfg.methods = methods
    shards = sorted({tuple(shard) for c in configs
                     for shard in (c.data.get("shards") or [(int(c.data.offset), c.data.limit)])},
                    key=lambda shard: (shard[0], -1 if shard[1] is None else shard[1]))
    if len(shards) > 1:
        cfg.data.offset, cfg.data.limit = shards[0][0], None
        cfg.data.shards = [[offset, limit] for offset, limit in shards]
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out / "config.yaml")
    with open(out / "generations.jsonl", "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return infill.report(cfg, records, methods, out)


def _join(runs: list[tuple[Path, list[str], list[dict]]], methods: list[str]) -> tuple[list[dict], int]:
    """Records joined by (ratio, passage), and how many were left out for a missing method."""
    joined: dict[tuple, tuple[dict, set]] = {}
    for run, run_methods, records in runs:
        for record in records:
            key = (float(record["target_ratio"]), int(record["index"]))
            if key not in joined:
                joined[key] = (dict(record, seconds=dict(record.get("seconds", {}))), set(run_methods))
                continue
            base, have = joined[key]
            if have & set(run_methods):
                raise ExperimentConfigError(
                    f"the runs share (ratio, passage) records of {sorted(have & set(run_methods))}: "
                    f"{run} repeats ratio {key[0]} passage {key[1]}; merge runs of disjoint ratios or methods")
            if "skipped" in record or "skipped" in base:
                joined[key] = (base if "skipped" in base else dict(record), have | set(run_methods))
                continue
            differ = [f for f in MASK_FIELDS if base.get(f) != record.get(f)]
            if differ:
                raise ExperimentConfigError(f"{run}: ratio {key[0]} passage {key[1]} has another mask "
                                            f"than the other runs' ({', '.join(differ)} differ)")
            for method in run_methods:
                for field in (method, *METHOD_FIELDS.get(method, ())):
                    if field in record:
                        base[field] = record[field]
                if method in record.get("seconds", {}):
                    base["seconds"][method] = record["seconds"][method]
            have |= set(run_methods)
    complete = [r for key, (r, have) in sorted(joined.items()) if set(methods) <= have]
    return complete, len(joined) - len(complete)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    merge(args.runs, args.out)


if __name__ == "__main__":
    main()
