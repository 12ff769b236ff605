"""Re-pick a CommonGen run's outputs from its saved candidates under another rerank rule, without
decoding again.

    python -m experiments.commongen_rerank RUN_DIR --sweep 0 0.25 0.5 --mbr 0.5 1 2 [--ranges 500:993]
    python -m experiments.commongen_rerank RUN_DIR --out OUT_DIR --length-penalty 0.25
    python -m experiments.commongen_rerank RUN_DIR --out OUT_DIR --mbr-temperature 1 [--keep-as ctrlg_sum]
    python -m experiments.commongen_rerank RUN_DIR --sweep 0 --judge-weights 0.25 0.5 1 [--judge-top-k 16]
    python -m experiments.commongen_rerank RUN_DIR --out OUT_DIR --judge-weight 0.5 --keep-as ctrlg_lm
    python -m experiments.commongen_rerank RUN_DIR --sweep 0.2 --candidate-pool beams   # ended run, beams only

A run decoded with ``save_candidates=true`` keeps every beam (or sample) of every item with its
log p_lm(y | prompt), its length in tokens and whether it satisfies the constraint. The search
itself does not depend on the rerank, so choosing again
(:func:`ctrlg.tasks.commongen.rerank.pick_candidate`) gives exactly the outputs a run decoded with that
rule would have produced: ``rerank=lm_loglik rerank_length_penalty=p`` (the highest
log p_lm / |y|^p) or ``rerank=mbr mbr_temperature=T`` (minimum Bayes risk, :mod:`ctrlg.lm.mbr`).

``--judge-weights A …`` adds, for each length exponent P of ``--sweep``, the rules with a judge
LM of weight A (``judge.weight``: the shortlist of the ``--judge-top-k`` best candidates by
log p_lm / |y|^p, kept by log p_lm / |y|^p + A · log p_judge(y | the instruction naming the
concepts); :func:`ctrlg.tasks.commongen.rerank.pick_candidate`); the judge (``--judge-model``, default
the embedded LM without the adapter; ``--judge-adapter commongen-supervised`` merges the supervised
CommonGen adapter and reads its "Concepts: …" prompt) scores each shortlisted candidate once.

``--sweep P …`` / ``--mbr T …`` print, per range of dataset indices, BLEU-4 / ROUGE-L / CIDEr
(the paper's units) and mean words for each rule, and an ``oracle`` row: per item the candidate
with the best sentence-level BLEU-4 against its references. The oracle is the upper bound of any
rerank of these candidates: it separates what the search found from what the rerank chose.
Choose a rule on a tuning range only (for CommonGen dev: items 500–992).

``--out OUT_DIR`` writes a run folder (``generations.jsonl`` without the candidates,
``config.yaml`` with the rule). Score it with :mod:`experiments.commongen_report` (paired
intervals) or merge it with :mod:`experiments.merge_runs`. ``--keep-as NAME`` also keeps the run's
own pick as method NAME, for paired intervals of the new rule against it on the same beams
(``commongen_report OUT_DIR --baseline NAME``).

The rules and the re-pick live in :mod:`ctrlg.tasks.commongen.rerank` and
:mod:`ctrlg.tasks.commongen.repick`; this entry point parses the command line and prints.
"""


from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf

from ctrlg.data.commongen_prompts import PROMPT_STYLES
from ctrlg.errors import ExperimentConfigError
from ctrlg.lm.judge import JudgeCacheError
from ctrlg.tasks.commongen.items import judge_style
from ctrlg.tasks.commongen.pipeline import load_judge
from ctrlg.tasks.commongen.repick import repick_run, sweep
from ctrlg.tasks.commongen.rerank import lm_rule, mbr_rule
from ctrlg.tasks.records import format_table
from experiments.common import index_range

CONFIG_FILE = Path(__file__).resolve().parents[1] / "configs" / "commongen.yaml"

__all__ = ["judge_defaults", "main"]


def judge_defaults() -> dict:
    """The ``judge:`` block of configs/commongen.yaml (its prompt settings are the judge's here
    too; the command line sets weight, top_k, model and adapter)."""
    return OmegaConf.to_container(OmegaConf.load(CONFIG_FILE).judge)


def _print_sweep(result: dict) -> None:
    columns = ["rerank", "bleu4", "rouge_l", "cider", "success", "words"]
    headers = ["rerank", "BLEU-4", "ROUGE-L", "CIDEr", "success %", "words"]
    for span, block in result.items():
        for method, rows in block["methods"].items():
            print(f"\n{method}, items {span} ({block['items']} items)")
            print(format_table([{"rerank": name, **row} for name, row in rows.items()],
                               columns, headers))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--sweep", type=float, nargs="+", default=[], metavar="P",
                        help="length exponents of the lm_loglik rerank to score")
    parser.add_argument("--mbr", type=float, nargs="+", default=[], metavar="T",
                        help="temperatures of the MBR rerank to score")
    parser.add_argument("--ranges", type=index_range, nargs="+", default=[(0, 10 ** 9)],
                        metavar="START:STOP")
    parser.add_argument("--methods", nargs="+", default=None)
    parser.add_argument("--no-oracle", action="store_true")
    parser.add_argument("--out", type=Path, help="write the run re-picked with one rule")
    parser.add_argument("--length-penalty", type=float, default=0.0, metavar="P")
    parser.add_argument("--mbr-temperature", type=float, default=None, metavar="T",
                        help="with --out: rerank=mbr at this temperature")
    parser.add_argument("--judge-weights", type=float, nargs="+", default=[], metavar="A",
                        help="with --sweep: also each length exponent with a judge LM of weight A")
    parser.add_argument("--judge-weight", type=float, default=0.0, metavar="A",
                        help="with --out: a judge LM of weight A (judge.weight)")
    parser.add_argument("--judge-top-k", type=int, default=16, metavar="K")
    parser.add_argument("--judge-model", default=None, help="the judge LM (default: the embedded LM)")
    parser.add_argument("--judge-adapter", default=None,
                        help="a LoRA adapter merged into the judge LM (e.g. commongen-supervised)")
    parser.add_argument("--judge-prompt-style", default=None,
                        choices=PROMPT_STYLES,
                        help="the judge's prompt (default: the config's judge.prompt_style, else "
                             "the format the judge's adapter was trained on, else instruct)")
    parser.add_argument("--judge-cache", type=Path, default=None, metavar="FILE",
                        help="JSON lines of judge scores read before and written after (the same "
                             "judge LM only)")
    parser.add_argument("--keep-as", default=None, metavar="NAME",
                        help="with --out: also keep the run's own pick as method NAME (compare "
                             "with commongen_report OUT --baseline NAME)")
    parser.add_argument("--candidate-pool", choices=["beams", "ended"], default=None,
                        help="beams: choose among the returned beams alone (a run decoded with "
                             "generation.candidate_pool=ended keeps the ended hypotheses too); "
                             "default: every saved candidate")
    args = parser.parse_args(argv)
    sweeping = bool(args.sweep or args.mbr)
    if sweeping == (args.out is not None):
        parser.error("give either --sweep P … / --mbr T … or --out OUT_DIR (with "
                     "--length-penalty P and/or --mbr-temperature T)")
    weights = args.judge_weights if sweeping else [args.judge_weight] if args.judge_weight else []
    if args.judge_top_k < 1 or any(not a > 0 for a in weights):
        parser.error("--judge-top-k must be ≥ 1 and every judge weight > 0")
    judge_cfg = {**judge_defaults(), "weight": max(weights, default=0.0), "top_k": args.judge_top_k,
                 "model": args.judge_model, "adapter": args.judge_adapter}
    if args.judge_prompt_style is not None:
        judge_cfg["prompt_style"] = args.judge_prompt_style
    try:
        judge = None
        if weights:
            judge_cfg.update(judge_style(judge_cfg))   # resolved once, not once per item
            run_cfg = OmegaConf.load(args.run / "config.yaml")
            run_cfg.judge = judge_cfg
            judge = load_judge(run_cfg)
            if args.judge_cache is not None and args.judge_cache.exists():
                judge.load_memo(args.judge_cache)
        if sweeping:
            rules = [lm_rule(p) for p in args.sweep] + [mbr_rule(t) for t in args.mbr]
            rules += [lm_rule(p, a, args.judge_top_k) for p in args.sweep for a in weights]
            _print_sweep(sweep(args.run, rules, args.ranges, args.methods,
                               oracle=not args.no_oracle, judge=judge, judge_cfg=judge_cfg,
                               pool=args.candidate_pool))
        else:
            rule = lm_rule(args.length_penalty, args.judge_weight, args.judge_top_k) \
                if args.mbr_temperature is None else mbr_rule(args.mbr_temperature, args.length_penalty)
            repick_run(args.run, args.out, rule, args.methods, keep_as=args.keep_as, judge=judge,
                       judge_cfg=judge_cfg, pool=args.candidate_pool)
        if judge is not None and args.judge_cache is not None:
            judge.save_memo(args.judge_cache)
    except (ExperimentConfigError, JudgeCacheError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
