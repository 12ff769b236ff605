"""Adapting an LM to CommonGen (GeLaTo / Ctrl-G's pipeline, step 1): data → LoRA → adapter.

``adapt(config)`` (the Hydra config of ``python -m experiments.adapt``):

1. reads CommonGen *train* targets (and, for the supervised form, their concept lists; bundled
   copies by default) and the dev references as held-out text;
2. builds examples in the form's text format (:mod:`ctrlg.data.commongen_prompts`):
   ``unsupervised`` — BOS + " " + sentence + EOS (style ``bos``: the LM learns to write
   CommonGen-style sentences, the concepts come from the constraint at decoding);
   ``supervised`` — BOS + "Concepts: a, b, c.\\nSentence:" + " " + sentence + EOS (style
   ``keywords``, loss on the sentence only);
3. measures the held-out NLL per target token of the base, trains LoRA factors
   (:func:`ctrlg.lm.adaptation.train_lora`; resumable from ``output.dir/state``), measures the
   held-out NLL again;
4. saves the adapter (:func:`ctrlg.lm.adapters.save_adapter`: bfloat16 LoRA weights, the base's
   name and fingerprint, the text format and these figures) to ``output.dir/adapter`` and to
   ``output.copy_to`` (e.g. ``ctrlg/assets/adapter_smollm2_commongen``), and ``metrics.json``.

Cost: one epoch is one forward + backward pass over ~0.53 M target tokens (unsupervised) of the
39,068 train sentences; the held-out passes are forward only.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Mapping

import torch

from ctrlg.data import load_commongen
from ctrlg.data._files import bundled_path
from ctrlg.data.commongen_prompts import prompt_text, target_text
from ctrlg.data.commongen_targets import selected_indices
from ctrlg.errors import CtrlgError
from ctrlg.hmm.sampling import read_prompts
from ctrlg.lm import models
from ctrlg.lm.adaptation import LoraSettings, encode_examples, mean_target_nll, train_lora
from ctrlg.lm.adapters import base_fingerprint, save_adapter
from ctrlg.validation import config_value

__all__ = ["FORMS", "adapt", "training_texts", "heldout_texts"]

FORMS = {"unsupervised": "bos", "supervised": "keywords"}


_get = config_value  # a dotted key of the config (ctrlg.validation.config_value)


def _style(cfg: Mapping) -> str:
    form = _get(cfg, "form", "unsupervised")
    if form not in FORMS:
        raise CtrlgError(f"form must be one of {sorted(FORMS)}, got {form!r}")
    return FORMS[form]


def training_texts(cfg: Mapping, tokenizer) -> tuple[list[str], list[str]]:
    """(prompts, targets) of the training examples in the form's text format: the targets that
    ``data.select`` keeps (:mod:`ctrlg.data.commongen_targets`), then the first ``data.limit``."""
    style, bos = _style(cfg), _get(cfg, "bos_token")
    targets = read_prompts(_get(cfg, "data.targets") or bundled_path("commongen.train.tgt.txt"))
    limit, select = _get(cfg, "data.limit"), _get(cfg, "data.select")
    concepts = None
    if style == "keywords" or select == "sentence_case_balanced":
        concepts = read_prompts(_get(cfg, "data.concepts")
                                or bundled_path("commongen.train.src_alpha.txt"))
        if len(concepts) != len(targets):
            raise CtrlgError(f"{len(concepts)} concept lines but {len(targets)} target lines; "
                             "data.concepts and data.targets must be line-aligned")
    if style == "keywords":
        prompts = [prompt_text(c.split(), style, tokenizer, bos) for c in concepts]
    else:
        prompts = [prompt_text([], style, tokenizer, bos)] * len(targets)
    kept = selected_indices(targets, select, concepts)
    prompts, targets = [prompts[i] for i in kept], [targets[i] for i in kept]
    if limit:
        prompts, targets = prompts[:int(limit)], targets[:int(limit)]
    return prompts, [target_text(t, tokenizer) for t in targets]


def heldout_texts(cfg: Mapping, tokenizer) -> tuple[list[str], list[str]]:
    """(prompts, targets): CommonGen dev references (``heldout.path`` or the bundled dev split),
    at most ``heldout.limit`` of them, each with its item's concepts in the supervised form."""
    style, bos = _style(cfg), _get(cfg, "bos_token")
    prompts, targets = [], []
    for example in load_commongen(_get(cfg, "heldout.path")):
        for reference in example.references:
            prompts.append(prompt_text(example.concepts, style, tokenizer, bos))
            targets.append(target_text(reference, tokenizer))
    limit = _get(cfg, "heldout.limit")
    if limit:
        prompts, targets = prompts[:int(limit)], targets[:int(limit)]
    return prompts, targets


def _settings(cfg: Mapping) -> LoraSettings:
    lora, train = dict(_get(cfg, "lora", {}) or {}), dict(_get(cfg, "train", {}) or {})
    return LoraSettings(rank=int(lora.get("rank", 8)), alpha=float(lora.get("alpha", 16)),
                        dropout=float(lora.get("dropout", 0.0)),
                        target_modules=tuple(lora.get("target_modules") or LoraSettings.target_modules),
                        lr=float(train.get("lr", 2e-4)),
                        weight_decay=float(train.get("weight_decay", 0.0)),
                        warmup_fraction=float(train.get("warmup_fraction", 0.03)),
                        epochs=int(train.get("epochs", 1)),
                        batch_size=int(train.get("batch_size", 32)),
                        max_steps=train.get("max_steps"), save_every=int(train.get("save_every", 100)),
                        autocast=train.get("autocast", "bfloat16"),
                        seed=int(_get(cfg, "seed", 0))).check()


def _load_base(cfg: Mapping):
    dtype = getattr(torch, str(_get(cfg, "train.model_dtype", "bfloat16")))
    kwargs = {}
    if _get(cfg, "train.attention"):
        kwargs["attn_implementation"] = _get(cfg, "train.attention")
    name = _get(cfg, "model.name")
    return models.load_model(name, dtype=dtype, **kwargs), models.load_tokenizer(name)


def adapt(cfg: Mapping) -> dict:
    """Run the whole pipeline (module docstring); returns the metrics dictionary."""
    if _get(cfg, "threads"):
        torch.set_num_threads(int(_get(cfg, "threads")))
    settings = _settings(cfg)
    out_dir = Path(_get(cfg, "output.dir", "outputs/adapt"))
    out_dir.mkdir(parents=True, exist_ok=True)
    model, tokenizer = _load_base(cfg)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    fingerprint = base_fingerprint(model)
    train = encode_examples(tokenizer, *training_texts(cfg, tokenizer))
    heldout = encode_examples(tokenizer, *heldout_texts(cfg, tokenizer))
    timings: dict[str, float] = {}
    start = time.perf_counter()
    before = mean_target_nll(model, heldout, pad, autocast=settings.autocast)
    timings["heldout_s"] = time.perf_counter() - start
    start = time.perf_counter()
    peft_model, losses = train_lora(model, train, pad, settings, state_dir=out_dir / "state")
    timings["train_s"] = time.perf_counter() - start
    after = mean_target_nll(peft_model, heldout, pad, autocast=settings.autocast)
    metrics = {
        "form": _get(cfg, "form", "unsupervised"), "prompt_style": _style(cfg),
        "train_examples": len(train), "train_target_tokens": sum(len(e.ids) - e.start for e in train),
        "heldout_references": len(heldout),
        "heldout_nll_per_token": {"base": before, "adapted": after},
        "heldout_perplexity": {"base": math.exp(before), "adapted": math.exp(after)},
        "steps": len(losses), "final_train_loss_50": sum(losses[-50:]) / max(len(losses[-50:]), 1),
        "timings": timings,
    }
    meta = {"prompt_style": _style(cfg), "bos_token": _get(cfg, "bos_token"),
            "form": metrics["form"], "metrics": metrics,
            "training": json.loads(json.dumps(dict(cfg), default=str))}
    base_name = _get(cfg, "model.name") or models.EMBEDDED_NAME
    save_adapter(peft_model, out_dir / "adapter", base_name=base_name,
                 base_fingerprint=fingerprint, metadata=meta)
    if _get(cfg, "output.copy_to"):
        save_adapter(peft_model, _get(cfg, "output.copy_to"), base_name=base_name,
                     base_fingerprint=fingerprint, metadata=meta)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out_dir / "losses.json").write_text(json.dumps(losses) + "\n")
    return metrics
