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

from typing import Mapping

from ctrlg.data import load_commongen
from ctrlg.data._files import bundled_path
from ctrlg.data.commongen_prompts import prompt_text, target_text
from ctrlg.data.commongen_targets import selected_indices
from ctrlg.errors import CtrlgError
from ctrlg.hmm.sampling import read_prompts
from ctrlg.lm.adaptation import run_adaptation
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


def adapt(cfg: Mapping) -> dict:
    """Run the whole pipeline (module docstring); returns the metrics dictionary."""
    style = _style(cfg)
    meta = {"prompt_style": style, "bos_token": _get(cfg, "bos_token"),
            "form": _get(cfg, "form", "unsupervised")}
    return run_adaptation(cfg, lambda tokenizer: (training_texts(cfg, tokenizer),
                                                  heldout_texts(cfg, tokenizer)), meta)
