"""Re-pick a CommonGen run's outputs from its saved candidates under another rerank rule, without
decoding again.

    python -m experiments.commongen_rerank RUN_DIR --sweep 0 0.25 0.5 --mbr 0.5 1 2 [--ranges 500:993]
    python -m experiments.commongen_rerank RUN_DIR --out OUT_DIR --length-penalty 0.25
    python -m experiments.commongen_rerank RUN_DIR --out OUT_DIR --mbr-temperature 1 [--keep-as ctrlg_sum]
    python -m experiments.commongen_rerank RUN_DIR --sweep 0 --judge-weights 0.25 0.5 1 [--judge-top-k 16]
    python -m experiments.commongen_rerank RUN_DIR --out OUT_DIR --judge-weight 0.5 --keep-as ctrlg_lm

A run decoded with ``save_candidates=true`` keeps every beam (or sample) of every item with its
log p_lm(y | prompt), its length in tokens and whether it satisfies the constraint. The search
itself does not depend on the rerank, so choosing again
(:func:`experiments.commongen.pick_candidate`) gives exactly the outputs a run decoded with that
rule would have produced: ``rerank=lm_loglik rerank_length_penalty=p`` (the highest
log p_lm / |y|^p) or ``rerank=mbr mbr_temperature=T`` (minimum Bayes risk, :mod:`ctrlg.lm.mbr`).

``--judge-weights A …`` adds, for each length exponent P of ``--sweep``, the rules with a judge
LM of weight A (``judge.weight``: the shortlist of the ``--judge-top-k`` best candidates by
log p_lm / |y|^p, kept by log p_lm / |y|^p + A · log p_judge(y | the instruction naming the
concepts); :func:`experiments.commongen.pick_candidate`); the judge (``--judge-model``, default
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
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from omegaconf import OmegaConf

from ctrlg import metrics
from ctrlg.data.commongen_prompts import PROMPT_STYLES
from ctrlg.lm.judge import JudgeCacheError
from experiments.common import ExperimentConfigError, format_table, read_records
from experiments.commongen import (judge_prompt_ids, judge_style, load_judge, pick_candidate,
                                  rerank_rule, word_count)
from experiments.commongen_report import _range

CONFIG_FILE = Path(__file__).resolve().parents[1] / "configs" / "commongen.yaml"

__all__ = ["judge_defaults", "lm_rule", "mbr_rule", "repick_record", "repick_run", "sweep", "oracle_pick"]


def judge_defaults() -> dict:
    """The ``judge:`` block of configs/commongen.yaml (its prompt settings are the judge's here
    too; the command line sets weight, top_k, model and adapter)."""
    return OmegaConf.to_container(OmegaConf.load(CONFIG_FILE).judge)


def lm_rule(length_penalty: float = 0.0, judge_weight: float = 0.0, judge_top_k: int = 16) -> dict:
    """The rule ``rerank=lm_loglik`` with length exponent p (and a judge of weight a > 0 over the
    best ``judge_top_k`` candidates)."""
    rule = {"rerank": "lm_loglik", "length_penalty": float(length_penalty)}
    if judge_weight:
        rule.update(judge_weight=float(judge_weight), judge_top_k=int(judge_top_k))
    return rule


def mbr_rule(temperature: float = 1.0, length_penalty: float = 0.0) -> dict:
    """The rule ``rerank=mbr`` with temperature T (weights softmax(log p_lm / |y|^p / T))."""
    return {"rerank": "mbr", "length_penalty": float(length_penalty), "mbr_temperature": float(temperature)}


def rule_name(rule: dict) -> str:
    name = f"p={rule['length_penalty']:g}" if rule["length_penalty"] or rule["rerank"] != "mbr" else ""
    if rule["rerank"] == "mbr":
        name = f"mbr T={rule['mbr_temperature']:g}" + (f" {name}" if name else "")
    if rule.get("judge_weight"):
        name += f" judge a={rule['judge_weight']:g} K={rule['judge_top_k']}"
    return name


def _candidates(record: dict, method: str) -> list[dict]:
    output = record.get(method)
    if output is None:
        raise ExperimentConfigError(f"item {record['index']} has no output of method {method!r}")
    candidates = output.get("candidates")
    if not candidates:
        raise ExperimentConfigError(
            f"item {record['index']} of method {method!r} has no saved candidates: decode with "
            f"save_candidates=true to re-pick offline")
    if any(c.get("log_likelihood") is None for c in candidates):
        raise ExperimentConfigError(f"item {record['index']} of method {method!r} was decoded "
                                    f"with rerank=none: its candidates have no log-likelihood")
    return candidates


def _output(candidates: list[dict], best: int) -> dict:
    chosen = candidates[best]
    return {"text": chosen["text"], "accepted": chosen["accepted"],
            "num_accepted": sum(bool(c["accepted"]) for c in candidates),
            "log_likelihood": chosen["log_likelihood"], "words": word_count(chosen["text"])}


def judge_for(judge, cfg, record: dict):
    """``judge(texts)`` for one record: the judge's log p(text | its prompt for the record's
    concepts) (:func:`experiments.commongen.judge_prompt_ids`); None without a judge."""
    if judge is None:
        return None
    prompt = judge_prompt_ids(record["concepts"], judge.tokenizer, cfg.get("judge") or {})
    return lambda texts: judge.score(prompt, texts)


def repick_record(record: dict, methods: Sequence[str], rule: dict, judge=None, cfg=None) -> dict:
    """``record`` with each of ``methods`` re-chosen from its candidates by ``rule``
    (:func:`experiments.commongen.pick_candidate`, with ``judge`` — a :class:`ctrlg.lm.judge.Judge`
    prompted as ``cfg.judge`` says — when the rule has a judge weight; the candidates are dropped
    from the copy)."""
    out = dict(record)
    for method in methods:
        candidates = _candidates(record, method)
        best = pick_candidate([c["log_likelihood"] for c in candidates],
                              [c["tokens"] for c in candidates],
                              [c["accepted"] for c in candidates], rule,
                              [c["text"] for c in candidates],
                              judge_for(judge, cfg if cfg is not None else {}, record)
                              if rule.get("judge_weight") else None)
        out[method] = _output(candidates, best)
    return out


def oracle_pick(candidates: list[dict], references: Sequence[str]) -> int:
    """The index of the constraint-satisfying candidate (any, when none satisfies) with the
    highest sentence-level BLEU-4 (pycocoevalcap's, against the item's ``references``); the
    first such on ties."""
    from pycocoevalcap.bleu.bleu_scorer import BleuScorer

    pool = [i for i, c in enumerate(candidates) if c["accepted"]] or list(range(len(candidates)))
    refs = [metrics.tokenize_for_eval(r) for r in references]
    scorer = BleuScorer(n=4)
    for i in pool:
        scorer += (metrics.tokenize_for_eval(candidates[i]["text"]) or "<empty>", refs)
    _, per_sentence = scorer.compute_score(option="closest", verbose=0)
    bleu4 = per_sentence[3]
    return pool[max(range(len(pool)), key=lambda k: bleu4[k])]


def _scored(records: list[dict], method: str) -> dict:
    hyps = [r[method]["text"] for r in records]
    refs = [r["references"] or [" ".join(r["concepts"])] for r in records]
    row = metrics.evaluate_generations(hyps, refs, [r[method]["accepted"] for r in records],
                                       with_meteor=False)
    return {"bleu4": row["bleu4"], "rouge_l": row["rouge_l"], "cider": row["cider"],
            "success": row["success"], "words": sum(r[method]["words"] for r in records) / len(records)}


def sweep(run_dir: Path, rules: Sequence[dict], ranges, methods: Sequence[str] | None = None,
          oracle: bool = True, judge=None, judge_cfg: dict | None = None) -> dict:
    """``{"start:stop": {"items": n, "methods": {method: {rule name | "oracle": metric row}}}}``:
    every rule (:func:`lm_rule`, :func:`mbr_rule`) and the oracle on every range of indices
    (``judge``: the :class:`ctrlg.lm.judge.Judge` of the rules with a judge weight, prompted as
    ``judge_cfg`` says)."""
    cfg = OmegaConf.load(run_dir / "config.yaml")
    if judge_cfg is not None:
        cfg.judge = judge_cfg
    methods = list(methods or cfg.methods)
    records = [r for r in read_records(run_dir) if "skipped" not in r]
    out: dict = {}
    for start, stop in ranges:
        chosen = [r for r in records if start <= r["index"] < stop]
        if not chosen:
            raise ExperimentConfigError(f"no scored item of {run_dir} lies in [{start}, {stop})")
        per_method: dict = {}
        for method in methods:
            rows = {rule_name(rule): _scored([repick_record(r, [method], rule, judge, cfg)
                                              for r in chosen], method)
                    for rule in rules}
            if oracle:
                picked = []
                for r in chosen:
                    candidates = _candidates(r, method)
                    picked.append({**r, method: _output(candidates, oracle_pick(candidates, r["references"]))})
                rows["oracle"] = _scored(picked, method)
            per_method[method] = rows
        out[f"{start}:{stop}"] = {"items": len(chosen), "methods": per_method}
    return out


def repick_run(run_dir: Path, out: Path, rule: dict | float, methods: Sequence[str] | None = None,
               keep_as: str | None = None, judge=None, judge_cfg: dict | None = None) -> Path:
    """Write the run folder ``out``: ``run_dir``'s items re-chosen by ``rule`` (a bare number is
    the length exponent of ``lm_loglik``) and its config with that rule.

    ``keep_as``: also keep the run's own pick of its one re-picked method, as a method of that
    name, so that ``experiments.commongen_report OUT --baseline NAME`` gives paired intervals of
    the new rule against the decoded one on the same beams (``config.yaml``'s
    ``differing_settings.rerank`` names each method's rule)."""
    rule = rule if isinstance(rule, dict) else lm_rule(rule)
    cfg = OmegaConf.load(run_dir / "config.yaml")
    methods = list(methods or cfg.methods)
    unknown = sorted(set(methods) - set(cfg.methods))
    if unknown:
        raise ExperimentConfigError(f"{run_dir} did not decode method(s) {unknown}; it has "
                                    f"{list(cfg.methods)}")
    if keep_as is not None and (len(methods) != 1 or keep_as in cfg.methods):
        raise ExperimentConfigError(
            f"keep_as={keep_as!r} needs exactly one re-picked method (got {methods}) and a name "
            f"that is not one of the run's methods ({list(cfg.methods)})")
    dropped = set(cfg.methods) - set(methods)   # methods not re-picked are left out
    records = read_records(run_dir)
    decoded_rule = rerank_rule(cfg)   # the run's own rule, before the judge's settings replace its own
    if judge_cfg is not None:
        cfg.judge = judge_cfg
    rows = [r if "skipped" in r else repick_record(r, methods, rule, judge, cfg) for r in records]
    for row, record in zip(rows, records):
        for method in dropped:
            row.pop(method, None)
            row.get("seconds", {}).pop(method, None)
        if keep_as is not None and "skipped" not in record:
            row[keep_as] = {k: v for k, v in record[methods[0]].items() if k != "candidates"}
            if methods[0] in row.get("seconds", {}):
                row["seconds"] = {**row["seconds"], keep_as: row["seconds"][methods[0]]}
    if keep_as is not None:
        cfg.differing_settings = {"rerank": {methods[0]: rule_name(rule),
                                             keep_as: rule_name(decoded_rule)}}
    cfg.rerank = rule["rerank"]
    cfg.rerank_length_penalty = rule["length_penalty"]
    if "mbr_temperature" in rule:
        cfg.mbr_temperature = rule["mbr_temperature"]
    if rule.get("judge_weight"):
        cfg.judge.weight, cfg.judge.top_k = rule["judge_weight"], rule["judge_top_k"]
    elif cfg.get("judge") is not None:
        cfg.judge.weight = 0.0
    cfg.save_candidates = False
    cfg.method_specs = {m: cfg.method_specs[m] for m in methods}
    if keep_as is not None:
        cfg.method_specs[keep_as] = cfg.method_specs[methods[0]]
        methods = [keep_as, *methods]
    cfg.methods = methods
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out / "config.yaml")
    with open(out / "generations.jsonl", "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    print(f"{len(rows)} items re-picked with {rule_name(rule)} -> {out}")
    return out


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
    parser.add_argument("--ranges", type=_range, nargs="+", default=[(0, 10 ** 9)],
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
                               oracle=not args.no_oracle, judge=judge, judge_cfg=judge_cfg))
        else:
            rule = lm_rule(args.length_penalty, args.judge_weight, args.judge_top_k) \
                if args.mbr_temperature is None else mbr_rule(args.mbr_temperature, args.length_penalty)
            repick_run(args.run, args.out, rule, args.methods, keep_as=args.keep_as, judge=judge,
                       judge_cfg=judge_cfg)
        if judge is not None and args.judge_cache is not None:
            judge.save_memo(args.judge_cache)
    except (ExperimentConfigError, JudgeCacheError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
