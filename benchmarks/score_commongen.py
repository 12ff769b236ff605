"""Store the figures of the CommonGen entries of ``benchmarks/results/manifest.yaml`` beside their runs.

    python -m benchmarks.score_commongen ID [ID ...]    # the named entries
    python -m benchmarks.score_commongen --missing      # every CommonGen entry without stored figures
    python -m benchmarks.report                         # then re-write docs/results.md

For each entry: its run folders (``runs:``, under ``benchmarks/results/``) are merged into a
temporary folder when there are several (:func:`experiments.merge_runs.merge_runs`, with the
entry's ``allow_differing`` settings, e.g. ``batch_size`` between a GPU and a CPU run), then scored
on the entry's ``ranges`` by :func:`experiments.commongen_report.report_ranges` — the tables
``python -m experiments.commongen_report RUN --ranges … --baseline … --resamples 1000 --meteor``
prints, METEOR included when ``java`` is on PATH (and the entry does not say ``meteor: false``:
METEOR's jar takes most of the time). The result goes into ``scores.json`` in the first
run folder under the entry's id, with the runs, ranges, baseline and this command, so
``benchmarks.report`` renders the page without scoring again (METEOR and the bootstrap take
minutes per run on a 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.report import RESULTS, SCORES_FILE, ReportError, load_manifest
from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks.records import write_json
from experiments.commongen_report import report_ranges
from experiments.merge_runs import merge_runs

__all__ = ["commongen_entries", "score_entry"]

RESAMPLES = 1000


def commongen_entries() -> dict[str, dict]:
    """``{id: entry}`` of the manifest's CommonGen entries."""
    return {e["id"]: e for s in load_manifest() for e in s["entries"] if e["kind"] == "commongen"}


def _ranges(entry: dict) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in span.split(":")) for span in entry["ranges"]]


def score_entry(entry: dict, *, resamples: int = RESAMPLES) -> Path:
    """Score ``entry`` (module docstring) and store it; returns the ``scores.json`` written."""
    runs = [RESULTS / run for run in entry["runs"]]
    absent = [str(r) for r in runs if not r.is_dir()]
    if absent:
        raise ReportError(f"entry {entry['id']!r}: no run folder {', '.join(absent)}")
    baseline = entry.get("baseline")
    with tempfile.TemporaryDirectory() as tmp:
        folder = runs[0]
        if len(runs) > 1:
            folder = merge_runs(Path(tmp) / "merged", runs, entry.get("methods"),
                                entry.get("allow_differing", ()))
        report = report_ranges(folder, _ranges(entry), baseline=baseline, resamples=resamples,
                               meteor="auto" if entry.get("meteor", True) else False)
    path = runs[0] / SCORES_FILE
    stored = json.loads(path.read_text()) if path.exists() else {}
    stored[entry["id"]] = {"runs": entry["runs"], "ranges": entry["ranges"], "baseline": baseline,
                           "resamples": resamples,
                           "command": f"python -m benchmarks.score_commongen {entry['id']}",
                           "report": report}
    write_json(path, dict(sorted(stored.items())))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ids", nargs="*", help="entry ids of benchmarks/results/manifest.yaml")
    parser.add_argument("--missing", action="store_true",
                        help="every CommonGen entry whose run is kept and has no stored figures")
    args = parser.parse_args(argv)
    try:
        entries = commongen_entries()
        unknown = [i for i in args.ids if i not in entries]
        if unknown:
            raise ReportError(f"no CommonGen entry {unknown} in the manifest; choose from {sorted(entries)}")
        chosen = [entries[i] for i in args.ids]
        if args.missing:
            chosen += [e for e in entries.values() if e not in chosen
                       and (RESULTS / e["runs"][0]).is_dir()
                       and e["id"] not in _stored_ids(RESULTS / e["runs"][0] / SCORES_FILE)]
        if not chosen:
            raise ReportError("name entry ids or pass --missing (nothing to score)")
        for entry in chosen:
            print(f"{entry['id']}: {score_entry(entry)}")
    except (ReportError, ExperimentConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)


def _stored_ids(path: Path) -> set[str]:
    return set(json.loads(path.read_text())) if path.exists() else set()


if __name__ == "__main__":
    main()
