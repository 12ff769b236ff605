"""Join bias runs of ``python -m experiments.relm task=bias`` that sampled different
configurations (e.g. one process per core) into one result (:func:`ctrlg.relm.bias.merge_runs`).

    python -m benchmarks.merge_relm_bias RUN_A RUN_B ... --out DIR

DIR gets ``results.json`` (the configurations in the order given, each with its χ² test and the
per-profession tests recomputed from its counts, and each run's wall and CPU seconds),
``samples.jsonl`` (every run's samples), ``bias.png`` and ``config.yaml`` (the first run's with
the configuration axes the runs' union, and ``runs`` naming them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from omegaconf import OmegaConf

from ctrlg.relm.bias import merge_runs
from ctrlg.relm.plots import plot_bias
from ctrlg.tasks.records import write_json

AXES = ("prefix", "encodings", "edit_distances")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    configs = [OmegaConf.to_container(OmegaConf.load(run / "config.yaml"), resolve=True)
               for run in args.runs]
    results = [json.loads((run / "results.json").read_text()) for run in args.runs]
    merged = merge_runs(results, configs)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "results.json", merged)
    with open(args.out / "samples.jsonl", "w") as out:
        for run in args.runs:
            samples = run / "samples.jsonl"
            if samples.exists():
                out.write(samples.read_text())
    plot_bias(merged["configurations"], args.out / "bias.png")
    config = dict(configs[0])
    config["bias"] = dict(config["bias"])
    for axis in AXES:
        config["bias"][axis] = sorted({v for c in configs for v in c["bias"][axis]},
                                      key=str)
    config["runs"] = [str(run) for run in args.runs]
    (args.out / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    for row in merged["configurations"]:
        marked = [p["profession"] for p in row["professions"] if p["significant"]]
        print(f"{row['configuration']:26s} χ² {row['chi2']:8.2f}  p {row['p_value']:.3g}  "
              f"differing professions: {', '.join(marked) or 'none'}")
    return merged


if __name__ == "__main__":
    main()
