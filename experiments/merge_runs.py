"""Merge CommonGen runs that decoded different methods on the same items into one run folder.

    python -m experiments.merge_runs OUT RUN_A RUN_B [...] [--methods logical ctrlg]
    python -m experiments.commongen <RUN_A's overrides> "methods=[a,b]" resume=OUT   # scores all

A method's generations depend only on its own spec, the item batches and the seeds derived from
(seed, first item of the batch, method name) (:func:`ctrlg.tasks.commongen.decoding.batch_seed`), so
methods decoded in separate processes — e.g. one per core — equal those of one run over all of
them. Each item's record in OUT carries every run's method outputs and timings; the runs must
agree on everything else that decides the generations (checked; ``hmm.prior_head`` only between
runs that decode ``prior: head`` methods), and OUT's ``config.yaml`` is RUN_A's with ``methods``
and ``method_specs`` the union of the runs' (and their prior head).

``--allow-differing generation.num_beams ...`` merges runs that differ in the named settings on
purpose (e.g. a method at 128 beams against the baseline at 32, or ``batch_size`` between a
beam-search run batched on a GPU and one decoded item by item on a CPU): each method's records
then come from a different decoding, so OUT's ``config.yaml`` says which — ``differing_settings``
maps every such key to ``{method: value}`` — and the tables built from OUT must say it too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from omegaconf import OmegaConf

from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks.commongen.methods import GENERATION_KEYS, without_compute_settings
from ctrlg.tasks.commongen.rerank import rerank_settings
from ctrlg.tasks.records import read_records

__all__ = ["merge_runs"]

# per-run keys of a record; everything else must agree between the runs
_PER_RUN = ("seconds",)
# generation settings that are one value, not a section: --allow-differing names them whole
# (batch_size decides nothing for beam search, whose beams are per item and draw no seed)
_SCALAR_KEYS = ("seed", "batch_size")


def _plain(cfg, key: str, allowed: Sequence[str] = ()):
    """The setting ``key`` as plain data; for ``data``, without ``offset``/``limit`` (which items a
    run covered does not change any item's generations); without the dotted sub-keys of ``key`` in
    ``allowed`` (settings the runs may differ in on purpose)."""
    if key in allowed:                             # a scalar setting the runs may differ in
        return None
    value = cfg.get(key)
    value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    for dotted in allowed:
        top, _, sub = dotted.partition(".")
        if top == key and sub and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != sub}
    if key == "data" and isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in ("offset", "limit")}
    value = without_compute_settings(key, value)
    if key == "hmm" and isinstance(value, dict):   # the prior head: see _merged_prior_head
        value = {k: v for k, v in value.items() if k != "prior_head"}
    return value


def _merged_prior_head(runs: list[Path], configs: list) -> object:
    """``hmm.prior_head`` decides only the generations of methods with ``prior: head``: runs may
    differ in it as long as those that decode such methods agree; the merged run carries their
    value (None when no run decodes one)."""
    def uses_head(cfg, method: str) -> bool:
        spec = (cfg.get("method_specs") or {}).get(method) or {}
        return spec.get("guide", "ctrlg") == "ctrlg" and spec.get("prior", "filter") == "head"

    used = {}
    for run, cfg in zip(runs, configs):
        if any(uses_head(cfg, m) for m in cfg.methods):
            used[run] = (cfg.get("hmm") or {}).get("prior_head")
    if len(set(used.values())) > 1:
        raise ExperimentConfigError(f"runs with prior=head methods used different prior heads: "
                                    f"{ {str(r): v for r, v in used.items()} }")
    return next(iter(used.values()), None)


def merge_runs(out: Path, runs: list[Path], methods: list[str] | None = None,
               allow_differing: Sequence[str] = ()) -> Path:
    """Write OUT/generations.jsonl and OUT/config.yaml from ``runs`` (module docstring): the
    items for which the runs together have every one of ``methods`` (default: every method of
    every run). Runs may cover other items (``data.offset`` / ``data.limit``) and may repeat a
    method on an item (its outputs are equal; the first run's is kept). ``allow_differing``:
    dotted settings (``section.key``) the runs may differ in, recorded per method in OUT's
    ``differing_settings``."""
    if len(runs) < 2:
        raise ExperimentConfigError("give at least two run folders to merge")
    for dotted in allow_differing:
        top, _, sub = dotted.partition(".")
        if top not in GENERATION_KEYS or (not sub and top not in _SCALAR_KEYS):
            raise ExperimentConfigError(
                f"--allow-differing takes section.key of a generation setting "
                f"({', '.join(k for k in GENERATION_KEYS if k not in _SCALAR_KEYS)}) or one of "
                f"{', '.join(_SCALAR_KEYS)}, got {dotted!r}")
    configs = [OmegaConf.load(run / "config.yaml") for run in runs]
    shared = [k for k in GENERATION_KEYS if k not in ("methods", "method_specs")]
    for run, cfg in zip(runs[1:], configs[1:]):
        differing = [k for k in shared
                     if _plain(cfg, k, allow_differing) != _plain(configs[0], k, allow_differing)]
        differing += [k for k in set(rerank_settings(cfg)) | set(rerank_settings(configs[0]))
                      if rerank_settings(cfg).get(k) != rerank_settings(configs[0]).get(k)]
        if differing:
            raise ExperimentConfigError(f"{run} differs from {runs[0]} in {differing}")
    known: list[str] = []
    for cfg in configs:
        known += [m for m in cfg.methods if m not in known]
    missing = sorted(set(methods or []) - set(known))
    if missing:
        raise ExperimentConfigError(f"no run decoded method(s) {missing}; the runs have {known}")
    methods = list(methods or known)
    merged: dict[int, dict] = {}
    for run, cfg in zip(runs, configs):
        for record in read_records(run):
            index = record["index"]
            base = merged.setdefault(index, {k: v for k, v in record.items()
                                             if k not in cfg.methods and k not in _PER_RUN})
            for method in cfg.methods:
                if method in record and method in methods and method not in base:
                    base[method] = record[method]
            seconds = base.setdefault("seconds", {})
            for method, value in record.get("seconds", {}).items():
                if method in methods:
                    seconds.setdefault(method, value)
    complete = [r for r in merged.values() if "skipped" in r or all(m in r for m in methods)]
    if not complete:
        raise ExperimentConfigError("the runs have no item in common")
    config = configs[0].copy()
    head = _merged_prior_head(runs, configs)
    if head is not None:
        OmegaConf.update(config, "hmm.prior_head", head, force_add=True)
    config.methods = methods
    specs = {}
    for cfg in configs:
        specs.update(OmegaConf.to_container(cfg.method_specs, resolve=True))
    config.method_specs = {m: specs[m] for m in methods}
    if allow_differing:
        config.differing_settings = _settings_per_method(runs, configs, methods, allow_differing)
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(config, out / "config.yaml")
    with open(out / "generations.jsonl", "w", encoding="utf-8") as handle:
        for record in sorted(complete, key=lambda r: r["index"]):
            handle.write(json.dumps(record) + "\n")
    print(f"{len(complete)} items with methods {methods} -> {out} "
          f"({len(merged) - len(complete)} items lacked a method and were left out)")
    return out


def _settings_per_method(runs: list[Path], configs: list, methods: list[str],
                         allowed: Sequence[str]) -> dict:
    """``{setting: {method: value}}`` for the allowed-to-differ settings, from the first run that
    decoded each method (the run whose records the merge keeps); a method decoded by several runs
    that disagree on a setting is refused (its kept records would mix decodings)."""
    out: dict[str, dict] = {dotted: {} for dotted in allowed}
    for method in methods:
        decoded_by = [(run, cfg) for run, cfg in zip(runs, configs) if method in cfg.methods]
        for dotted in allowed:
            values = [OmegaConf.select(cfg, dotted) for _, cfg in decoded_by]
            if len(set(map(str, values))) > 1:
                raise ExperimentConfigError(
                    f"method {method!r} was decoded with different {dotted} ({values}) by "
                    f"{[str(run) for run, _ in decoded_by]}")
            out[dotted][method] = values[0]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="the methods to keep (default: every method of every run)")
    parser.add_argument("--allow-differing", nargs="+", default=[], metavar="SECTION.KEY",
                        help="settings the runs may differ in on purpose (e.g. "
                             "generation.num_beams, or batch_size between beam-search runs), "
                             "recorded per method in OUT's config")
    args = parser.parse_args(argv)
    try:
        merge_runs(args.out, args.runs, args.methods, args.allow_differing)
    except ExperimentConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
