"""Adapting the embedded LM to stories with LoRA: the recipe the infilling and editing tasks share.

``adapt(config)`` (``python -m experiments.adapt --config-name adapt_stories form=…``):

1. reads the *training* split of the story corpus (:mod:`ctrlg.data.stories`: passages 0–3999),
   keeps its last ``data.heldout`` passages apart as held-out text (chosen-on data for any
   setting; never trained on) and trains on the rest;
2. builds (prompt, target) pairs in the form's text format (:mod:`ctrlg.data.story_prompts`):
   ``plain`` — BOS | passage + EOS;
   ``continuation`` — BOS + "Continue the given text:" + prefix | span + EOS, with
   ``data.examples_per_passage`` spans drawn per passage (:func:`~ctrlg.data.story_prompts.choose_span`);
   ``ilm`` — BOS + x̃ + [sep] | answers (:mod:`ctrlg.tasks.stories.ilm`) under ILM's mask
   function (:func:`ctrlg.data.mask_document`) with the per-unit probability that masks
   ``data.ilm_mask_ratio`` of the characters on average, ``data.examples_per_passage`` masks
   per passage;
3. checks that no evaluation passage is in the training text (:func:`ctrlg.data.stories.check_disjoint`);
4. trains and saves the adapter (:func:`ctrlg.lm.adaptation.run_adaptation`).

Cost: one forward + backward pass of the LM per training token (≈ 6 · 135 M FLOPs), ≈ 82 tokens
per passage.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ctrlg.data.infill_mask import calibrate_mask_probability, mask_document
from ctrlg.data.stories import TUNE_PASSAGES, check_disjoint, load_stories
from ctrlg.errors import CtrlgError
from ctrlg.guide import resolve_precision
from ctrlg.lm.adaptation import run_adaptation
from ctrlg.data.story_prompts import (FORMS, bos_text, choose_span, continuation_prompt,
                                         eos_text, plain_example)
from ctrlg.tasks.stories.ilm import IlmTokens, ilm_example
from ctrlg.validation import config_value as _get

__all__ = ["adapt", "form_examples", "split_passages"]


def split_passages(cfg: Mapping) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts) of the story corpus's training split: the held-out texts
    are its last ``data.heldout`` passages (the corpus's ``tune`` split by default)."""
    heldout = int(_get(cfg, "data.heldout", TUNE_PASSAGES))
    stories = [s.text for s in load_stories("train", _get(cfg, "data.path"))]
    limit = _get(cfg, "data.limit")
    train = stories[:len(stories) - heldout]
    if limit:
        train = train[:int(limit)]
    if not train or heldout < 1:
        raise CtrlgError(f"data.heldout={heldout} leaves {len(train)} training passages; "
                         "both must be ≥ 1")
    return train, stories[len(stories) - heldout:]


def form_examples(form: str, passages: list[str], tokenizer, cfg: Mapping,
                  seed: int) -> tuple[list[str], list[str]]:
    """(prompts, targets) of ``passages`` in ``form`` (module docstring)."""
    if form not in FORMS:
        raise CtrlgError(f"form must be one of {FORMS}, got {form!r}")
    bos = _get(cfg, "bos_token")
    prompts, targets = [], []
    if form == "plain":
        for text in passages:
            prompt, target = plain_example(text, tokenizer, bos)
            prompts.append(prompt)
            targets.append(target)
        return prompts, targets
    per_passage = int(_get(cfg, "data.examples_per_passage", 1))
    eos = eos_text(tokenizer)
    if form == "continuation":
        rng = np.random.default_rng(seed)
        for text in passages:
            for _ in range(per_passage):
                span = choose_span(text, rng)
                if span is None:
                    continue
                prompts.append(continuation_prompt(text[:span.start], tokenizer, bos))
                targets.append(text[len(text[:span.start].rstrip()):span.end] + eos)
        return prompts, targets
    tokens = IlmTokens()
    tokens.check(tokenizer)
    ratio = float(_get(cfg, "data.ilm_mask_ratio", 0.15))
    max_ngram = int(_get(cfg, "data.max_ngram", 8))
    p = calibrate_mask_probability(passages[:500], ratio, seed=seed, max_ngram=max_ngram,
                                   iterations=16)
    start = bos_text(tokenizer, bos)
    for i, text in enumerate(passages):
        for k in range(per_passage):
            document = mask_document(text, p, seed * 1_000_003 + i * 131 + k, max_ngram)
            if not document.spans:
                continue
            prompt, target = ilm_example(document, tokens, start)
            prompts.append(prompt)
            targets.append(target)
    return prompts, targets


def _resolve_auto_precision(cfg: dict) -> dict:
    """``train.autocast`` / ``train.model_dtype`` = auto: bfloat16 where the CPU multiplies it
    natively (AVX512-BF16 / AMX; 3× slower than float32 where it does not), else float32."""
    train = dict(cfg.get("train") or {})
    native = resolve_precision("auto") == "bfloat16"
    if train.get("autocast") == "auto":
        train["autocast"] = "bfloat16" if native else None
    if train.get("model_dtype") == "auto":
        train["model_dtype"] = "bfloat16" if native else "float32"
    return {**cfg, "train": train}


def adapt(cfg: Mapping) -> dict:
    """Run the recipe (module docstring); returns the metrics dictionary."""
    cfg = _resolve_auto_precision(dict(cfg))
    form = _get(cfg, "form", "plain")
    if form not in FORMS:
        raise CtrlgError(f"form must be one of {FORMS}, got {form!r}")
    seed = int(_get(cfg, "seed", 0))
    train_passages, heldout_passages = split_passages(cfg)
    if _get(cfg, "data.path") is None:
        check_disjoint(train_passages, [s.text for s in load_stories("eval")], f"the {form} adapter")

    def texts(tokenizer):
        return (form_examples(form, train_passages, tokenizer, cfg, seed),
                form_examples(form, heldout_passages, tokenizer, cfg, seed + 1))

    meta = {"form": form, "prompt_style": f"story_{form}", "bos_token": _get(cfg, "bos_token"),
            "task": "stories"}
    return run_adaptation(cfg, texts, meta)
