"""Merge infilling runs that shared the ratios, the methods or the passages out between processes
into one report.

    python -m benchmarks.merge_infill RUN_A RUN_B RUN_C:logical,ctrlg ... --out DIR

Each run is a folder of ``python -m experiments.infill``; ``RUN:m1,m2`` takes only those methods
of a run. The runs share the seed and the data settings except the passages selected
(``data.offset`` / ``data.limit``), and the runs that contribute a method agree on the settings
that decide its outputs (:data:`METHOD_SETTINGS`: ctrlg and logical the story LM, the HMM and
``generation``; ILM its model and ``ilm``): e.g. one process per pair of ratios for
``[logical,ctrlg]`` and one more for ``[ilm]`` over every ratio, shards of passages run one after
another, or a run's ILM replaced by a later run's with other ILM decoding. A shard of passages
calibrates its own masks: the mean masked-character ratio of *its* passages is brought within a
point of each target, redrawing the masks when whole-unit steps leave the closest p further away
(:func:`ctrlg.tasks.infill.pipeline.calibrate_masks`; shards run before the redraws could miss by
several points: two 10-passage shards reached 18.8–19.0 % at 21 % and 40.1 % at 32 %). The
union's reached ratio is reported, and :func:`missed_ratios` warns when it is more than a point
from a target. ``RUN@0.13,0.40`` takes only those target ratios of a run (with ``:m1,m2`` after
it, only those methods), e.g. to leave out a ratio a shard missed and was run again for. The
records of a (ratio, passage) are
joined: their masks must be the same, and no method may come from two runs. A passage that
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

from benchmarks import merge_common
from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks.infill.pipeline import METHODS, RATIO_TOLERANCE
from ctrlg.tasks.records import read_records
from experiments import infill

#: fields a record of one (ratio, passage) has the same in every run (its mask)
MASK_FIELDS = ("original", "masked", "mask_ratio", "p", "granularities")
#: fields each method adds to a record, besides the method's own
METHOD_FIELDS = {"ilm": ("ilm_seeds",)}
#: settings every run must share, and the settings that decide each method's outputs: runs that
#: contribute a method using a setting must agree on it (an ILM run's ``generation`` is free)
COMMON_SETTINGS = ("seed", "data")
METHOD_SETTINGS = {"ctrlg": ("model", "hmm", "generation"), "logical": ("model", "generation"),
                   "ilm": ("ilm_model", "ilm")}


def parse_run(spec: str) -> tuple[Path, list[str] | None, list[float] | None]:
    """``PATH`` (every method and ratio of the run), ``PATH:m1,m2`` (only those methods of it),
    ``PATH@r1,r2`` (only those target ratios), or ``PATH@r1,r2:m1,m2``."""
    path, methods = merge_common.parse_run(spec, METHODS)
    if path.exists() or "@" not in path.name:
        return path, methods, None
    folder, _, listed = str(path).rpartition("@")
    try:
        ratios = [float(r) for r in listed.split(",") if r.strip()]
    except ValueError:
        ratios = []
    if not ratios:
        raise ExperimentConfigError(f"{spec}: after '@' give target ratios, e.g. @0.13,0.40")
    return Path(folder), methods, ratios


def merge(runs: list, out: Path, first_mask_wins: bool = False, resamples: int | None = None) -> dict:
    """Merge ``runs`` (paths, or ``(path, methods)`` pairs / ``(path, methods, ratios)`` triples
    taking only those methods / target ratios; None: all) into ``out``. ``first_mask_wins``: a
    (ratio, passage) keeps the mask of the first run listed that holds it, and the records of later
    runs masked otherwise are left out (counted), instead of refusing the merge. ``resamples``: the
    bootstrap's resamples for the merged report (default: the first run's ``bootstrap.resamples``)."""
    specs = [(*run, None)[:3] if isinstance(run, tuple) else (Path(run), None, None) for run in runs]
    runs = [Path(path) for path, _, _ in specs]
    configs = [OmegaConf.load(run / "config.yaml") for run in runs]
    taken = []
    for (run, chosen, ratios), config in zip(specs, configs):
        if chosen is not None and not set(chosen) <= set(config.methods):
            raise ExperimentConfigError(f"{run} did not run {sorted(set(chosen) - set(config.methods))}")
        if ratios is not None:
            missing = set(ratios) - {float(r) for r in config.ratios}
            if missing:
                raise ExperimentConfigError(f"{run} did not run ratios {sorted(missing)}")
            config.ratios = sorted(ratios)
        taken.append([m for m in config.methods if chosen is None or m in chosen])
    deciders = merge_common.check_settings(
        runs, [OmegaConf.to_container(c, resolve=False) for c in configs], taken,
        COMMON_SETTINGS, METHOD_SETTINGS)
    methods = [m for m in METHODS if any(m in t for t in taken)]
    kept_ratios = [{float(r) for r in c.ratios} for c in configs]
    read = [(run, t, [r for r in read_records(run) if float(r["target_ratio"]) in kept])
            for run, t, kept in zip(runs, taken, kept_ratios)]
    records, dropped, superseded = _join(read, methods, first_mask_wins)
    if superseded:
        print(f"left out {superseded} records masked otherwise than an earlier run's (first mask wins)",
              file=sys.stderr)
    if dropped:
        print(f"left out {dropped} (ratio, passage) records that not every method reached",
              file=sys.stderr)
    cfg = configs[0].copy()
    for key, index in deciders.items():
        if key in configs[index]:
            cfg[key] = configs[index][key]
    cfg.ratios = sorted({float(r) for c in configs for r in c.ratios})
    cfg.methods = methods
    if resamples is not None:
        cfg.bootstrap.resamples = int(resamples)
    shards = sorted({tuple(shard) for c in configs
                     for shard in (c.data.get("shards") or [(int(c.data.offset), c.data.limit)])},
                    key=lambda shard: (shard[0], -1 if shard[1] is None else shard[1]))
    if len(shards) > 1:
        cfg.data.offset, cfg.data.limit = shards[0][0], None
        cfg.data.shards = [[offset, limit] for offset, limit in shards]
    for warning in missed_ratios(records, [(run, run_records) for run, _, run_records in read]):
        print(warning, file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out / "config.yaml")
    with open(out / "generations.jsonl", "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return infill.report(cfg, records, methods, out)


def missed_ratios(records: list[dict], runs: list[tuple[Path, list[dict]]],
                  tolerance: float = RATIO_TOLERANCE) -> list[str]:
    """One line per target ratio whose merged records' mean masked-character ratio is more than
    ``tolerance`` from it, naming each run's own mean there (the shards that pulled it away)."""
    def mean_ratio(rows: list[dict], target: float) -> tuple[float, int]:
        ratios = [float(r["mask_ratio"]) for r in rows
                  if float(r["target_ratio"]) == target and "mask_ratio" in r]
        return (sum(ratios) / len(ratios) if ratios else float("nan")), len(ratios)

    lines = []
    for target in sorted({float(r["target_ratio"]) for r in records}):
        reached, passages = mean_ratio(records, target)
        if not passages or abs(reached - target) <= tolerance:
            continue
        shards = ", ".join(f"{run}: {ratio:.1%} over {n}" for run, rows in runs
                           for ratio, n in [mean_ratio(rows, target)] if n)
        lines.append(f"ratio {target:.0%}: the merged masks cover {reached:.1%} of the characters "
                     f"of {passages} passages, more than a point away ({shards}); run the shards "
                     "that miss again (their masks are redrawn) and take only their other ratios (RUN@r1,r2)")
    return lines


def _join(runs: list[tuple[Path, list[str], list[dict]]], methods: list[str],
          first_mask_wins: bool = False) -> tuple[list[dict], int, int]:
    """Records joined by (ratio, passage), how many were left out for a missing method, and how
    many records were left out for another mask than an earlier run's (``first_mask_wins``)."""
    joined: dict[tuple, tuple[dict, set]] = {}
    superseded = 0
    for run, run_methods, records in runs:
        for record in records:
            key = (float(record["target_ratio"]), int(record["index"]))
            if first_mask_wins and key in joined and "skipped" not in record \
                    and "skipped" not in joined[key][0] \
                    and any(joined[key][0].get(f) != record.get(f) for f in MASK_FIELDS):
                superseded += 1
                continue
            if key not in joined:
                others = [m for m in METHODS if m not in run_methods]
                base = {k: v for k, v in record.items()
                        if k not in {f for m in others for f in (m, *METHOD_FIELDS.get(m, ()))}}
                base["seconds"] = {m: v for m, v in record.get("seconds", {}).items() if m not in others}
                joined[key] = (base, set(run_methods))
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
    return complete, len(joined) - len(complete), superseded


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="a run folder, FOLDER:m1,m2 to take only those "
                        "methods of it (e.g. a run whose ILM was decoded with older settings), "
                        "FOLDER@r1,r2 only those target ratios, or FOLDER@r1,r2:m1,m2")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--first-mask-wins", action="store_true",
                        help="a (ratio, passage) keeps the first listed run's mask; later runs' "
                        "records masked otherwise are left out (e.g. an old run's ILM where a new "
                        "shard redrew the masks and ILM was decoded again on them)")
    parser.add_argument("--resamples", type=int, default=None,
                        help="bootstrap resamples of the merged report (default: the first run's)")
    args = parser.parse_args(argv)
    merge([parse_run(run) for run in args.runs], args.out, first_mask_wins=args.first_mask_wins,
          resamples=args.resamples)


if __name__ == "__main__":
    main()
