"""Re-picking a recorded CommonGen run under other rerank rules, without decoding again.

A run decoded with ``save_candidates=true`` keeps every candidate of every item (text,
log p_lm(y | prompt), tokens, accepted). The search does not depend on the rerank, so choosing
again (:func:`ctrlg.tasks.commongen.rerank.repick_record`) gives exactly the outputs a run decoded
with that rule would have produced. :func:`sweep` scores rules per range of dataset indices,
beside an ``oracle`` (per item the candidate of best sentence-level BLEU-4: the upper bound of any
rerank of these candidates); :func:`repick_run` writes a run folder re-chosen by one rule.

May import: the library below :mod:`ctrlg.tasks` and :mod:`ctrlg.tasks.records` / :mod:`ctrlg.tasks.config`; within
this package, :mod:`~ctrlg.tasks.commongen.rerank`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from omegaconf import OmegaConf

from ctrlg import metrics
from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks.commongen.rerank import (_candidates, _output, lm_rule, oracle_pick, prefetch_judge,
                                          repick_record, rerank_rule, rule_name)
from ctrlg.tasks.records import read_records

__all__ = ["sweep", "repick_run", "returned_beams_only"]


def _scored(records: list[dict], method: str) -> dict:
    hyps = [r[method]["text"] for r in records]
    refs = [r["references"] or [" ".join(r["concepts"])] for r in records]
    row = metrics.evaluate_generations(hyps, refs, [r[method]["accepted"] for r in records],
                                       with_meteor=False)
    return {"bleu4": row["bleu4"], "rouge_l": row["rouge_l"], "cider": row["cider"],
            "success": row["success"], "words": sum(r[method]["words"] for r in records) / len(records)}


def returned_beams_only(record: dict) -> dict:
    """``record`` with each method's saved candidates restricted to the search's returned beams
    (those of a ``generation.candidate_pool=ended`` run not marked ``ended``): what the run
    would have chosen among with ``candidate_pool=beams``."""
    out = dict(record)
    for key, value in record.items():
        if isinstance(value, dict) and isinstance(value.get("candidates"), list):
            out[key] = {**value, "candidates": [c for c in value["candidates"] if not c.get("ended")]}
    return out


def _read(run_dir: Path, pool: str | None) -> list[dict]:
    if pool not in (None, "ended", "beams"):
        raise ExperimentConfigError(f"pool must be None, 'ended' or 'beams', got {pool!r}")
    records = read_records(run_dir)
    return [returned_beams_only(r) for r in records] if pool == "beams" else records


def sweep(run_dir: Path, rules: Sequence[dict], ranges, methods: Sequence[str] | None = None,
          oracle: bool = True, judge=None, judge_cfg: dict | None = None,
          pool: str | None = None) -> dict:
    """``{"start:stop": {"items": n, "methods": {method: {rule name | "oracle": metric row}}}}``:
    every rule (:func:`lm_rule`, :func:`mbr_rule`) and the oracle on every range of indices
    (``judge``: the :class:`ctrlg.lm.judge.Judge` of the rules with a judge weight, prompted as
    ``judge_cfg`` says; ``pool="beams"``: among the returned beams alone,
    :func:`returned_beams_only`)."""
    cfg = OmegaConf.load(run_dir / "config.yaml")
    if judge_cfg is not None:
        cfg.judge = judge_cfg
    methods = list(methods or cfg.methods)
    records = [r for r in _read(run_dir, pool) if "skipped" not in r]
    prefetch_judge([r for r in records if any(a <= r["index"] < b for a, b in ranges)], methods,
                   rules, judge, cfg)
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
               keep_as: str | None = None, judge=None, judge_cfg: dict | None = None,
               pool: str | None = None) -> Path:
    """Write the run folder ``out``: ``run_dir``'s items re-chosen by ``rule`` (a bare number is
    the length exponent of ``lm_loglik``) and its config with that rule.

    ``keep_as``: also keep the run's own pick of its one re-picked method, as a method of that
    name, so that ``experiments.commongen_report OUT --baseline NAME`` gives paired intervals of
    the new rule against the decoded one on the same beams (``config.yaml``'s
    ``differing_settings.rerank`` names each method's rule). ``pool="beams"``: re-chosen among
    the returned beams alone (:func:`returned_beams_only`; ``generation.candidate_pool`` of the
    written config then says ``beams``)."""
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
    records = _read(run_dir, pool)
    decoded_rule = rerank_rule(cfg)   # the run's own rule, before the judge's settings replace its own
    if judge_cfg is not None:
        cfg.judge = judge_cfg
    prefetch_judge([r for r in records if "skipped" not in r], methods, [rule], judge, cfg)
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
    if pool == "beams":
        OmegaConf.update(cfg, "generation.candidate_pool", "beams", force_add=True)
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
