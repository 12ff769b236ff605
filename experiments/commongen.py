"""CommonGen with the embedded LM (Ctrl-G §4.1): generate a sentence using every concept.

    python -m experiments.commongen [data.limit=N] [data.offset=M] [methods=[logical,ctrlg]]
                                    [generation.num_samples=K] [generation.num_beams=B] [resume=true]

For each concept set: the instruction "Write a sentence using the words: field, look, stand." in
the LM's chat template (the prompt the embedded HMM was distilled on, built by
:func:`ctrlg.data.commongen_prompts.commongen_prompts`); a constraint DFA "every concept occurs as a whole
word in one of its inflected forms, then EOS" (:func:`ctrlg.dfa.commongen_constraint` over keyword
groups from :func:`ctrlg.dfa.inflections`, lemminflect), at least ``constraint.min_words`` words;
K samples per method (or K of B beams), reranked by the LM log-likelihood log p_lm(y | prompt)
with constraint-satisfying samples first.

Batching: ``batch_size`` items are decoded together, left-padded, one DFA per input row
(:class:`ctrlg.ConstraintLogitsProcessor` takes a list of DFAs); each item expands into its K
consecutive samples/beams. Each batch draws from its own seed (run seed, first item, method), so
a resumed run reproduces an uninterrupted one.

Methods are named entries of ``method_specs`` (``guide``: none | logical | ctrlg; ``prior``:
filter, the HMM's own forward posterior over the generated tokens, or head, the LM-conditioned
prior saved with the HMM (:class:`ctrlg.guide.priors.HeadPrior`); ``strength`` w: the guided
distribution ∝ p_lm(v) · p_hmm(α | x≤t, v)^w, w = 0 is logical masking, w = 1 Ctrl-G). The method
named ``ctrlg`` is the recommended configuration; ablations have their own names.

Robustness: every finished batch of items is appended to ``generations.jsonl`` at once;
``resume=true`` (the newest earlier run of the same configuration) or ``resume=<run dir>``
continues an interrupted run; an item whose constraint cannot be met within the token budget is
reported by index and concept set, recorded as skipped, and the others go on.

Prints BLEU-4 / ROUGE-L / CIDEr / METEOR (when Java is present) / constraint success % / mean
words per method (and the references' mean words), the paired-bootstrap 95 % intervals of each
guided method − ``bootstrap.baseline`` per metric, and writes ``generations.jsonl``,
``metrics.json`` and ``config.yaml`` into Hydra's run directory.

The pipeline lives in :mod:`ctrlg.tasks.commongen` (items, methods, decoding, rerank, scoring,
pipeline); this entry point checks the config, finds the run to resume and calls it.
"""


from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from ctrlg.tasks.commongen.items import select_items
from ctrlg.tasks.commongen.methods import check_config, generation_settings
from ctrlg.tasks.commongen.pipeline import (decode_items, load_judge, load_models, report,
                                            resume_records)
from experiments.common import find_resume_dir, hydra_output_dir, report_errors, start_run


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """The whole experiment; returns ``{method: metrics row}`` and writes the result files."""
    specs = check_config(cfg)
    resume_dir = find_resume_dir(cfg, out_dir, generation_settings)
    methods = start_run(cfg, out_dir, list(specs))
    items = select_items(cfg)
    previous = resume_records(resume_dir, items, methods) if resume_dir is not None else []
    model, tokenizer, hmm = load_models(cfg, specs)
    judge = load_judge(cfg)
    records = decode_items(items, previous, methods, specs, model, tokenizer, hmm, cfg, out_dir,
                           judge)
    return report(records, items[0][0], methods, specs, cfg, out_dir)


@hydra.main(version_base=None, config_path="../configs", config_name="commongen")
@report_errors
def main(cfg: DictConfig) -> None:
    run(cfg, hydra_output_dir())


if __name__ == "__main__":
    main()
