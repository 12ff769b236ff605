"""Shared plumbing of the experiment entry points: seeding, loading the LM / tokenizer / HMM named
by the Hydra config, the run directory, result files and the printed table.

Entry points stay thin: each ``experiments/<name>.py`` has ``run(cfg, out_dir) -> dict`` (all the
work, callable from tests with a composed config) and a ``@hydra.main`` ``main`` that passes
Hydra's run directory, wrapped in :func:`report_errors`: a ctrlg error (a bad config value, a
missing data file, an unknown method, a prompt past the context) prints its message alone and
exits with status 1; ``HYDRA_FULL_ERROR=1`` shows the traceback as for any other error.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from ctrlg import metrics
from ctrlg import records as record_files
from ctrlg.errors import CtrlgError
from ctrlg.guide import resolve_precision

__all__ = [
    "ExperimentConfigError",
    "seed_everything",
    "load_lm",
    "resolve_device",
    "lm_dtype",
    "load_hmm",
    "hydra_output_dir",
    "save_resolved_config",
    "write_json",
    "write_jsonl",
    "generation_config",
    "find_resume_dir",
    "read_records",
    "records_path",
    "RecordWriter",
    "format_table",
    "paired_intervals",
    "interval_cell",
    "interval_header",
    "progress",
    "report_errors",
]

log = logging.getLogger(__name__)


class ExperimentConfigError(CtrlgError):
    """An experiment configuration that cannot run (a size of 0, an unknown method, a resume
    folder that does not match); raised before the LM or HMM is loaded where possible."""


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


LM_DTYPES = ("float32", "bfloat16", "float16", "auto")


def lm_dtype(name: str) -> torch.dtype:
    """The torch dtype of the LM's weights for ``model.dtype``: float32, bfloat16, float16, or
    auto = bfloat16 where the hardware multiplies it natively (a CUDA GPU that supports it, a CPU
    with AVX512-BF16 / AMX; :func:`ctrlg.guide.resolve_precision`), else float32. bfloat16 makes an
    LM step about 1.5× cheaper on such CPUs (``benchmarks/bench_lm_dtype.py``) but its rounding
    depends on the machine; float32 reproduces everywhere."""
    if name not in LM_DTYPES:
        raise ExperimentConfigError(f"model.dtype must be one of {LM_DTYPES}, got {name!r}")
    return getattr(torch, resolve_precision("auto") if name == "auto" else name)


def resolve_device(name: str | None) -> torch.device:
    """The torch device of the top-level ``device`` setting: ``cpu``, ``cuda`` / ``cuda:N``, or
    ``auto`` (the first CUDA GPU when there is one, else the CPU). A CUDA device on a machine
    without one is an :class:`ExperimentConfigError` that says so."""
    name = "cpu" if name is None else str(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ExperimentConfigError(f"device={name!r}: expected cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ExperimentConfigError(f"device={name!r} but this machine has no CUDA GPU that torch "
                                    f"can use; run with device=cpu (or auto)")
    if device.type not in ("cpu", "cuda"):
        raise ExperimentConfigError(f"device={name!r}: expected cpu, cuda, cuda:N or auto")
    return device


def load_lm(model_cfg: DictConfig, device: str | torch.device = "cpu"):
    """(model, tokenizer) for ``model.name`` (None → the embedded SmolLM2-135M-Instruct), with
    ``model.adapter`` (a LoRA adapter name or folder, :mod:`ctrlg.adapters`) merged when set, the
    weights in ``model.dtype`` (:func:`lm_dtype`), on ``device``."""
    from ctrlg.models import load_model, load_tokenizer

    name = model_cfg.get("name")
    dtype = lm_dtype(model_cfg.get("dtype", "float32"))
    tokenizer = load_tokenizer(name)
    model = load_model(name, dtype=dtype, adapter=model_cfg.get("adapter"), device=device)
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def load_hmm(hmm_cfg: DictConfig | None, tokenizer=None):
    """The HMM named by the config: ``hmm.path`` (a checkpoint folder), else ``hmm.name`` (an
    embedded HMM, :data:`ctrlg.hmm.EMBEDDED_HMMS`), else the embedded default
    :func:`ctrlg.hmm.load_default_hmm`. The checkpoint is checked against the tokenizer's
    vocabulary when the loader supports it. ``hmm.prior_head`` (an embedded head's name or a
    folder) attaches a prior head saved apart from the HMM (:meth:`ctrlg.HMM.attach_prior_head`)."""
    from ctrlg.hmm import load_default_hmm, load_embedded_hmm, prior_head_path
    from ctrlg.hmm import model as hmm_model

    path = None if hmm_cfg is None else hmm_cfg.get("path")
    name = None if hmm_cfg is None else hmm_cfg.get("name")
    if path:
        hmm = hmm_model.HMM.load(path, tokenizer=tokenizer)
    elif name:
        hmm = load_embedded_hmm(name, tokenizer=tokenizer)
    else:
        hmm = load_default_hmm(tokenizer=tokenizer)
    head = None if hmm_cfg is None else hmm_cfg.get("prior_head")
    if head:
        hmm.attach_prior_head(prior_head_path(str(head)), tokenizer=tokenizer)
    return hmm


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
    each is one of ``known_methods``."""
    seed_everything(cfg.seed)
    save_resolved_config(cfg, out_dir)
    methods = list(cfg.methods)
    unknown = sorted(set(methods) - set(known_methods))
    if unknown:
        raise ExperimentConfigError(f"unknown method(s) {unknown}; choose from "
                                    f"{list(known_methods)}")
    return methods


def _jsonable(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
    return path


def write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, default=_jsonable, ensure_ascii=False) + "\n")
    return path


# ---------------------------------------------------------------------- persistence and resume
def generation_config(cfg: DictConfig, keys: Sequence[str]) -> dict:
    """The resolved values of the configuration ``keys`` that decide a run's generations."""
    full = OmegaConf.to_container(cfg, resolve=True)
    return {key: full.get(key) for key in keys}


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


def records_path(folder: Path, records_file: str = "generations.jsonl") -> Path:
    """``folder / records_file``, or its gzip-compressed copy ``records_file + ".gz"`` when only
    that exists (how finished runs are kept in the repository, e.g.
    ``benchmarks/results/commongen/``); the plain name when neither exists."""
    plain = Path(folder) / records_file
    packed = plain.with_name(plain.name + ".gz")
    return packed if not plain.exists() and packed.exists() else plain


def read_records(folder: Path, records_file: str = "generations.jsonl") -> list[dict]:
    """The complete item records of a (possibly interrupted or damaged) run's ``records_file``
    (plain or gzip-compressed: :func:`records_path`): every good line, also after a bad one
    (:func:`ctrlg.records.read_records`). Each bad line (a torn last line, a corrupt line) is
    skipped with a warning naming the file and its line numbers; :class:`RecordWriter` sets
    such lines aside when it rewrites the file."""
    path = records_path(folder, records_file)
    found = record_files.read_records(path, required=("index",))
    if found.bad:
        log.warning("%s: %d line(s) are not complete records and were skipped (%d good records "
                    "kept): %s; resuming in place sets them aside in %s", path, len(found.bad),
                    len(found.records), record_files.describe_bad_lines(found.bad),
                    record_files.set_aside_path(path))
    return found.records


class RecordWriter(record_files.RecordWriter):
    """Appends each finished item to ``path`` (``generations.jsonl``) at once, flushed, so an
    interrupted or failing run keeps everything finished before it; ``previous`` records (of
    the run being resumed) are written first, and any other line already in ``path`` is set
    aside, never deleted (:class:`ctrlg.records.RecordWriter`)."""

    def __init__(self, path: Path, previous: Iterable[dict] = ()):
        super().__init__(path, previous, default=_jsonable)


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def format_table(rows: Sequence[dict], columns: Sequence[str], headers: Sequence[str] | None = None) -> str:
    """A GitHub-markdown table of ``rows`` (dicts) restricted to ``columns``; floats with 2 decimals,
    None as an en dash."""
    headers = list(headers or columns)
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    line = lambda values: "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"
    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells]
    return "\n".join(out)


METRIC_NAMES = {"bleu4": "BLEU-4", "rouge_l": "ROUGE-L", "cider": "CIDEr", "meteor": "METEOR"}


def paired_intervals(records: Sequence[dict], references: Sequence[Sequence[str]], baseline: str,
                     compared: Sequence[str], names: Sequence[str], boot,
                     meteor_session=None) -> dict[str, dict]:
    """``{method: metrics.paired_bootstrap(method − baseline)}`` for each method in ``compared``,
    on the corpus metrics ``names``, each method's outputs being ``record[method]["text"]``;
    ``boot`` holds the ``bootstrap.*`` settings (resamples, seed, confidence)."""
    scorer = lambda m: metrics.CorpusScorer(  # noqa: E731
        [r[m]["text"] for r in records], references, names, meteor_session=meteor_session)
    base = scorer(baseline)
    return {method: metrics.paired_bootstrap(scorer(method), base,
                                             num_resamples=int(boot.resamples), seed=int(boot.seed),
                                             confidence=float(boot.confidence))
            for method in compared}


def interval_cell(ci: dict) -> str:
    """One interval as printed: ``+Δ [+low, +high]``."""
    return f"{ci['delta']:+.2f} [{ci['low']:+.2f}, {ci['high']:+.2f}]"


def interval_header(metric: str, confidence: float) -> str:
    return f"{METRIC_NAMES[metric]} ({100 * confidence:.0f} % CI)"


def progress(iterable, **kwargs):
    """tqdm that stays silent when stderr is not a terminal (logs, CI, tests)."""
    kwargs.setdefault("disable", not sys.stderr.isatty())
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, **kwargs)
