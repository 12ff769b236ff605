"""Merge editing-benchmark runs that split the passages (shards) or the methods between them into
one report.

    python -m benchmarks.merge_edit RUN_A RUN_B RUN_C:ctrlg ... --out DIR

Each run is a folder of ``python -m experiments.edit``; ``RUN:m1,m2`` takes only those methods of
it (e.g. the kept run's baselines beside a later run's ``ctrlg`` with another HMM). A shard
(``data.offset`` / ``data.limit``) numbers its examples as one run over every passage would, with
the same operations, sampling seeds and shuffled sanity rows (``experiments.edit._examples``), so
shards join by example index. The runs share the seed, the kinds, the scorer and the data
settings except the passages selected, and the runs that contribute a method agree on the
settings that decide its outputs (:data:`METHOD_SETTINGS`). An index's example fields must be the
same in every run, and no method may come from two runs; an example that some method did not
reach is left out (and counted). The merged folder holds ``generations.jsonl`` (by index),
``config.yaml`` (``methods`` the union, ``data.shards`` the shards) and ``metrics.json``, and the
tables ``experiments.edit`` prints are printed for the union.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from benchmarks import merge_common
from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks.edit import report
from ctrlg.tasks.edit.methods import METHODS
from ctrlg.tasks.records import read_records, write_json

#: fields that identify an example; equal in every run that holds its index
EXAMPLE_FIELDS = ("passage", "operation", "kind", "prefix", "suffix", "reference", "keyphrases",
                  "min_words", "max_words")
COMMON_SETTINGS = ("seed", "data", "kinds", "scorer")
METHOD_SETTINGS = {"prompt_only": ("model", "generation"), "logical": ("model", "generation"),
                   "ctrlg": ("model", "hmm", "generation")}


def parse_run(spec: str) -> tuple[Path, list[str] | None]:
    """``PATH`` (every method of the run) or ``PATH:m1,m2`` (only those methods of it)."""
    return merge_common.parse_run(spec, METHODS)


def join(runs: list[tuple[Path, list[str], list[dict]]], methods: list[str]) -> tuple[list[dict], int]:
    """Records joined by example index, and how many were left out for a missing method."""
    joined: dict[int, tuple[dict, set]] = {}
    for run, run_methods, records in runs:
        for record in records:
            index = int(record["index"])
            mine = {m: record[m] for m in run_methods if m in record}
            seconds = {m: v for m, v in record.get("seconds", {}).items() if m in run_methods}
            if index not in joined:
                base = {k: v for k, v in record.items() if k not in METHODS and k != "seconds"}
                joined[index] = ({**base, **mine, "seconds": seconds}, set(run_methods))
                continue
            base, have = joined[index]
            if have & set(run_methods):
                raise ExperimentConfigError(
                    f"{run} repeats example {index} of {sorted(have & set(run_methods))}; merge "
                    "runs of disjoint passages or methods")
            differ = [f for f in EXAMPLE_FIELDS if base.get(f) != record.get(f)]
            if differ:
                raise ExperimentConfigError(f"{run}: example {index} differs from the other runs' "
                                            f"({', '.join(differ)}); another seed or data file?")
            if "skipped" in record and "skipped" not in base:
                base["skipped"] = record["skipped"]
            base.update(mine)
            base["seconds"].update(seconds)
            have |= set(run_methods)
    complete = [r for _, (r, have) in sorted(joined.items())
                if "skipped" in r or set(methods) <= have]
    return complete, len(joined) - len(complete)


def merge(runs: list, out: Path) -> dict:
    """Merge ``runs`` (paths, or ``(path, methods)`` pairs) into ``out``; returns the report."""
    specs = [run if isinstance(run, tuple) else (Path(run), None) for run in runs]
    paths = [Path(path) for path, _ in specs]
    configs = [OmegaConf.to_container(OmegaConf.load(p / "config.yaml"), resolve=False) for p in paths]
    taken = []
    for (path, chosen), config in zip(specs, configs):
        if chosen is not None and not set(chosen) <= set(config["methods"]):
            raise ExperimentConfigError(f"{path} did not run {sorted(set(chosen) - set(config['methods']))}")
        taken.append([m for m in config["methods"] if chosen is None or m in chosen])
    deciders = merge_common.check_settings(paths, configs, taken, COMMON_SETTINGS, METHOD_SETTINGS)
    methods = [m for m in METHODS if any(m in t for t in taken)]
    records, dropped = join([(p, t, read_records(p)) for p, t in zip(paths, taken)], methods)
    if dropped:
        print(f"left out {dropped} examples that not every method reached", file=sys.stderr)
    cfg = dict(configs[0])
    for key, index in deciders.items():
        if key in configs[index]:
            cfg[key] = configs[index][key]
    cfg["methods"] = methods
    shards = sorted({tuple(s) for c in configs
                     for s in (c["data"].get("shards") or [(c["data"]["offset"], c["data"]["limit"])])},
                    key=lambda s: (s[0], -1 if s[1] is None else s[1]))
    cfg["data"] = {**cfg["data"], "offset": shards[0][0], "limit": None if len(shards) > 1 else shards[0][1],
                   "shards": [list(s) for s in shards]}
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(cfg), out / "config.yaml")
    with open(out / "generations.jsonl", "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    result = report.summarise(records, methods, list(cfg["kinds"]),
                              int(cfg["bootstrap"]["resamples"]), int(cfg["bootstrap"]["seed"]))
    skipped = set()
    for path in paths:
        if (path / "metrics.json").is_file():
            skipped |= set(json.loads((path / "metrics.json").read_text()).get("skipped_passages", []))
    result["skipped_passages"] = sorted(skipped)
    result["left_out_examples"] = dropped
    write_json(out / "metrics.json", result)
    print(f"Editing → {out} ({len(records)} examples from {len(paths)} runs)")
    print(report.format_report(result))
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="a run folder, or FOLDER:m1,m2 to take only those "
                        "methods of it")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    merge([parse_run(run) for run in args.runs], args.out)


if __name__ == "__main__":
    main()
