"""The settings the task pipelines share, read from a Hydra / OmegaConf config: the LM
(``model.name``, ``model.adapter``, ``model.dtype``), the HMM (``hmm.path`` / ``hmm.name`` /
``hmm.prior_head``), the ``device``, and the settings that decide a run's generations (what a
resumed run must agree on).

A bad value raises :class:`ctrlg.errors.ExperimentConfigError` naming the key, before anything
heavy is loaded where possible.

May import: :mod:`ctrlg.lm`, :mod:`ctrlg.hmm`, :mod:`ctrlg.guide` (the precision rule),
:mod:`ctrlg.errors`.
"""

from __future__ import annotations

from typing import Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from ctrlg.errors import ExperimentConfigError
from ctrlg.guide import resolve_precision
from ctrlg.hmm import load_default_hmm, load_embedded_hmm, prior_head_path
from ctrlg.hmm.model import HMM
from ctrlg.lm.bf16_weights import native_bf16
from ctrlg.lm.models import load_model, load_tokenizer

__all__ = ["LM_DTYPES", "EXECUTION_ONLY", "lm_dtype", "resolve_device", "bf16_weights_setting",
           "resolve_weight_formats", "load_lm", "load_hmm", "generation_config", "without_execution_only"]

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
    without one is an :class:`~ctrlg.errors.ExperimentConfigError` that says so."""
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


def bf16_weights_setting(model_cfg: DictConfig, device: str | torch.device = "cpu") -> bool:
    """``model.bf16_weights`` as a boolean: true / false, or ``auto`` = bfloat16 weights where they
    are fast and nothing else is asked for (a CPU with native bfloat16 products,
    :func:`ctrlg.lm.bf16_weights.native_bf16`, and neither int8 weights nor a bfloat16 /
    float16 LM); anything else is an :class:`~ctrlg.errors.ExperimentConfigError` naming the key."""
    value = model_cfg.get("bf16_weights", False)
    if isinstance(value, bool):
        return value
    if str(value).lower() != "auto":
        raise ExperimentConfigError(f"model.bf16_weights must be true, false or auto, got {value!r}")
    return (torch.device(device).type == "cpu" and not bool(model_cfg.get("int8_weights", False))
            and str(model_cfg.get("dtype", "float32")) == "float32" and native_bf16())


def resolve_weight_formats(cfg: DictConfig, sections: Sequence[str], device: str | torch.device = "cpu") -> None:
    """Replace ``bf16_weights: auto`` in the model ``sections`` of ``cfg`` by what it means on this
    machine (:func:`bf16_weights_setting`), in place: a run's saved settings then say which weights
    it decoded with, and a resumed or merged run is compared on that."""
    for name in sections:
        section = cfg.get(name)
        if section is not None and "bf16_weights" in section:
            OmegaConf.update(cfg, f"{name}.bf16_weights", bf16_weights_setting(section, device), force_add=True)


def load_lm(model_cfg: DictConfig, device: str | torch.device = "cpu"):
    """(model, tokenizer) for ``model.name`` (None → the embedded SmolLM2-135M-Instruct), with
    ``model.adapter`` (a LoRA adapter name or folder, :mod:`ctrlg.lm.adapters`) merged when set, the
    weights in ``model.dtype`` (:func:`lm_dtype`), on ``device``; ``model.skinny_linears`` (default
    auto: where the CPU gains by it) computes a float32 CPU model's decoding steps weight-first
    (:mod:`ctrlg.lm.skinny_linear`);
    ``model.int8_weights`` (default false) stores its linear layers as int8 (:mod:`ctrlg.lm.int8_weights`),
    ``model.bf16_weights`` (default false; ``auto``: :func:`bf16_weights_setting`) as bfloat16
    (:mod:`ctrlg.lm.bf16_weights`)."""
    name = model_cfg.get("name")
    dtype = lm_dtype(model_cfg.get("dtype", "float32"))
    tokenizer = load_tokenizer(name)
    model = load_model(name, dtype=dtype, adapter=model_cfg.get("adapter"), device=device,
                       skinny_linears=model_cfg.get("skinny_linears", "auto"),
                       int8_weights=bool(model_cfg.get("int8_weights", False)),
                       bf16_weights=bf16_weights_setting(model_cfg, device))
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
    path = None if hmm_cfg is None else hmm_cfg.get("path")
    name = None if hmm_cfg is None else hmm_cfg.get("name")
    if path:
        hmm = HMM.load(path, tokenizer=tokenizer)
    elif name:
        hmm = load_embedded_hmm(name, tokenizer=tokenizer)
    else:
        hmm = load_default_hmm(tokenizer=tokenizer)
    head = None if hmm_cfg is None else hmm_cfg.get("prior_head")
    if head:
        hmm.attach_prior_head(prior_head_path(str(head)), tokenizer=tokenizer)
    return hmm


#: settings of a section that change how a run computes, not what (float rounding at most, like the
#: thread count): left out where runs are compared (resume, merges)
EXECUTION_ONLY = ("skinny_linears",)

#: settings that change what a run computes but were added after runs were kept: left out where
#: runs are compared while they hold this default (a run saved before the key existed used it)
OMITTED_AT_DEFAULT = {"int8_weights": False, "bf16_weights": False}


def without_execution_only(value):
    """``value`` without the :data:`EXECUTION_ONLY` keys, nor the :data:`OMITTED_AT_DEFAULT` keys
    that hold their default, when it is a mapping."""
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in EXECUTION_ONLY
                and not (k in OMITTED_AT_DEFAULT and v == OMITTED_AT_DEFAULT[k])}
    return value


def generation_config(cfg: DictConfig, keys: Sequence[str]) -> dict:
    """The resolved values of the configuration ``keys`` that decide a run's generations (their
    sections without the :data:`EXECUTION_ONLY` settings)."""
    full = OmegaConf.to_container(cfg, resolve=True)
    return {key: without_execution_only(full.get(key)) for key in keys}
