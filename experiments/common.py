"""Shared plumbing of the experiment entry points: error reporting, seeding, the run directory,
resuming a run, and the command-line range argument.

Entry points stay thin: each ``experiments/<name>.py`` has ``run(cfg, out_dir) -> dict`` (config
checks and calls into the library: :mod:`ctrlg.tasks` for the pipelines, :mod:`ctrlg.tasks.config`
for the LM / HMM / device a config names, :mod:`ctrlg.tasks.records` for records and tables) and a
``@hydra.main`` ``main`` that passes Hydra's run directory, wrapped in :func:`report_errors`: a
ctrlg error (a bad config value, a missing data file, an unknown method, a prompt past the context)
prints its message alone and exits with status 1; ``HYDRA_FULL_ERROR=1`` shows the traceback as for
any other error. No experiment imports another: what two of them share lives here or in the library.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ctrlg.errors import CtrlgError, ExperimentConfigError
from ctrlg.tasks.record_files import lock_run_folder
from ctrlg.tasks.records import records_path

__all__ = [
    "report_errors",
    "seed_everything",
    "hydra_output_dir",
    "save_resolved_config",
    "start_run",
    "find_resume_dir",
    "index_range",
]


def report_errors(main: Callable) -> Callable:
    """Wrap an experiment's task function (under ``@hydra.main``): a :class:`CtrlgError` is
    printed as one line on stderr and ends the run with exit status 1, instead of Hydra's
    traceback; with ``HYDRA_FULL_ERROR=1`` it propagates (full traceback). Hydra reads the
    wrapped function's module through ``__wrapped__``, so the config path is unchanged."""

    @functools.wraps(main)
    def task(cfg):
        try:
            return main(cfg)
        except CtrlgError as error:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            print(f"Error: {error}\n(HYDRA_FULL_ERROR=1 shows the traceback)", file=sys.stderr)
            raise SystemExit(1) from None

    return task


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy and torch; returns a CPU generator seeded with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def hydra_output_dir() -> Path:
    """The run directory Hydra created for this job (also for each job of a multirun)."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def save_resolved_config(cfg: DictConfig, out_dir: Path) -> Path:
    """Write the fully resolved config to ``out_dir/config.yaml``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "config.yaml"
    path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return path


def start_run(cfg: DictConfig, out_dir: Path, known_methods: Sequence[str]) -> list[str]:
    """Seed everything, save the resolved config, and return ``cfg.methods`` after checking that
    each is one of ``known_methods``. A folder another run is writing to (its records writer
    holds the folder's lock) is refused first, naming that run, before its config is touched."""
    lock_run_folder(out_dir).release()
    seed_everything(cfg.seed)
    save_resolved_config(cfg, out_dir)
    methods = list(cfg.methods)
    unknown = sorted(set(methods) - set(known_methods))
    if unknown:
        raise ExperimentConfigError(f"unknown method(s) {unknown}; choose from "
                                    f"{list(known_methods)}")
    return methods


def find_resume_dir(cfg: DictConfig, out_dir: Path, settings: Callable[[DictConfig], dict],
                    records: str = "generations.jsonl") -> Path | None:
    """The run to continue: ``resume=<dir>``, or with ``resume=true`` the newest earlier run
    folder next to ``out_dir`` whose ``settings(config)`` (the generation-deciding part of its
    saved ``config.yaml``) equals this run's. None when ``resume`` is null/false.

    Raises :class:`ExperimentConfigError` when no earlier run matches, when the folder has no
    ``records`` file, or when its settings differ (naming the differing keys)."""
    resume = cfg.get("resume")
    if resume in (None, False):
        return None
    wanted = settings(cfg)
    if resume is True:
        parent = out_dir.parent
        for candidate in sorted(parent.iterdir() if parent.is_dir() else [], reverse=True):
            if candidate == out_dir or not records_path(candidate, records).exists() \
                    or not (candidate / "config.yaml").exists():
                continue
            if settings(OmegaConf.load(candidate / "config.yaml")) == wanted:
                return candidate
        raise ExperimentConfigError(f"resume=true: no earlier run in {parent} has this "
                                    f"configuration ({', '.join(wanted)}); give "
                                    f"resume=<run folder> or start afresh")
    folder = Path(str(resume))
    if not records_path(folder, records).exists() or not (folder / "config.yaml").exists():
        raise ExperimentConfigError(f"resume={folder}: no {records} and config.yaml there")
    saved = settings(OmegaConf.load(folder / "config.yaml"))
    differing = [k for k, v in wanted.items() if saved.get(k) != v]
    if differing:
        raise ExperimentConfigError(f"resume={folder}: that run differs in {differing}; resume "
                                    f"only with the same settings")
    return folder


def index_range(text: str) -> tuple[int, int]:
    """A ``START:STOP`` argument of the command line: the dataset indices [START, STOP)."""
    try:
        start, stop = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a range is START:STOP, got {text!r}") from None
    if not 0 <= start < stop:
        raise argparse.ArgumentTypeError(f"a range needs 0 <= START < STOP, got {text!r}")
    return start, stop
