"""What the merge tools of run folders share (``benchmarks.merge_infill``, ``benchmarks.merge_edit``):
``RUN:m1,m2`` specs, and the check that runs agree on the settings that decide what they contribute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks.config import without_execution_only

#: ``data`` settings that may differ between runs (which passages each run took)
SHARD_FIELDS = ("offset", "limit", "shards")

#: settings added to a section after runs were kept, with the value those runs had in effect: a
#: run without the key agrees with one that has this value (settings of any section that are
#: dropped while at their default, for resume too: ctrlg.tasks.config.OMITTED_AT_DEFAULT)
ADDED_DEFAULTS = {"generation": {"strength": 1.0}}


def parse_run(spec: str, methods: Sequence[str]) -> tuple[Path, list[str] | None]:
    """``PATH`` (every method of the run) or ``PATH:m1,m2`` (only those of ``methods``)."""
    if ":" not in spec or Path(spec).exists():
        return Path(spec), None
    path, _, names = spec.rpartition(":")
    chosen = [m.strip() for m in names.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in methods]
    if unknown or not chosen:
        raise ExperimentConfigError(f"{spec}: after ':' give methods among {', '.join(methods)}")
    return Path(path), chosen


def setting(config: Mapping, key: str):
    """``config[key]``, without the shard fields when it is the ``data`` section, without the
    execution-only settings (:data:`ctrlg.tasks.config.EXECUTION_ONLY`), with the
    :data:`ADDED_DEFAULTS` of its section filled in."""
    value = without_execution_only(config.get(key))
    if key in ADDED_DEFAULTS and isinstance(value, Mapping):
        value = {**ADDED_DEFAULTS[key], **value}
    if key == "data" and isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if k not in SHARD_FIELDS}
    return value


def check_settings(runs: Sequence[Path], configs: Sequence[Mapping], taken: Sequence[Sequence[str]],
                   common: Sequence[str], per_method: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """ExperimentConfigError naming the first setting that two runs which must agree differ in:
    every run shares the ``common`` settings, and the runs that contribute a method (``taken``)
    share that method's ``per_method`` settings. Returns, per setting, the index of a run that
    decides it."""
    deciders = {}
    for key in list(common) + sorted({k for ks in per_method.values() for k in ks}):
        users = [i for i, methods in enumerate(taken)
                 if key in common or any(key in per_method[m] for m in methods)]
        for i in users[1:]:
            if setting(configs[i], key) != setting(configs[users[0]], key):
                raise ExperimentConfigError(f"{runs[i]} was run with other settings than "
                                            f"{runs[users[0]]}: ['{key}']")
        if users:
            deciders[key] = users[0]
    return deciders
