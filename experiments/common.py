"""Shared plumbing of the experiment entry points: seeding, loading the LM / tokenizer / HMM named
by the Hydra config, the run directory, result files and the printed table.

Entry points stay thin: each ``experiments/<name>.py`` has ``run(cfg, out_dir) -> dict`` (all the
work, callable from tests with a composed config) and a ``@hydra.main`` ``main`` that passes
Hydra's run directory.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from ctrlg.errors import CtrlgError

__all__ = [
    "ExperimentConfigError",
    "seed_everything",
    "load_lm",
    "load_hmm",
    "hydra_output_dir",
    "save_resolved_config",
    "write_json",
    "write_jsonl",
    "format_table",
    "progress",
]


class ExperimentConfigError(CtrlgError):
    """An experiment configuration that cannot run (a size of 0, an unknown method, a resume
    folder that does not match); raised before the LM or HMM is loaded where possible."""


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy and torch; returns a CPU generator seeded with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def load_lm(model_cfg: DictConfig):
    """(model, tokenizer) for ``model.name`` (None → the embedded SmolLM2-135M-Instruct)."""
    from ctrlg.models import load_model, load_tokenizer

    name = model_cfg.get("name")
    dtype = getattr(torch, model_cfg.get("dtype", "float32"))
    tokenizer = load_tokenizer(name)
    model = load_model(name, dtype=dtype)
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def load_hmm(hmm_cfg: DictConfig | None, tokenizer=None):
    """The HMM named by the config: ``hmm.path`` (a checkpoint folder) or, when it is null, the
    embedded default :func:`ctrlg.hmm.load_default_hmm`. The checkpoint is checked against the
    tokenizer's vocabulary when the loader supports it."""
    from ctrlg.hmm import model as hmm_model

    path = None if hmm_cfg is None else hmm_cfg.get("path")
    if path:
        return hmm_model.HMM.load(path, tokenizer=tokenizer)
    from ctrlg.hmm import load_default_hmm

    return load_default_hmm(tokenizer=tokenizer)


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


def progress(iterable, **kwargs):
    """tqdm that stays silent when stderr is not a terminal (logs, CI, tests)."""
    kwargs.setdefault("disable", not sys.stderr.isatty())
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, **kwargs)
