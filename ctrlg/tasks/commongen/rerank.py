"""Keeping one of an item's K candidates: the rerank rule and its choice.

Constraint-satisfying candidates compete (all of them when none satisfies); ``lm_loglik`` keeps the
highest log p_lm(y | prompt) / |y|^p (p = 0: the paper's summed log-likelihood), ``mbr`` the
minimum Bayes risk candidate (:func:`ctrlg.lm.mbr.mbr_pick`), ``none`` the first. A judge LM of
weight a > 0 re-scores a shortlist: rerank_score(y) + a · log p_judge(y | its prompt), a product of
experts. :func:`repick_record` applies a rule to the candidates a run saved
(``save_candidates=true``), so a rule can be changed without decoding again.

May import: the library below :mod:`ctrlg.tasks` and :mod:`ctrlg.tasks.records` / :mod:`ctrlg.tasks.config`; within
this package, :mod:`~ctrlg.tasks.commongen.items`.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from omegaconf import OmegaConf

from ctrlg import metrics
from ctrlg.errors import ExperimentConfigError
from ctrlg.lm.mbr import mbr_pick
from ctrlg.tasks.commongen.items import judge_prompt_ids, word_count

__all__ = ["RERANKS", "rerank_rule", "rerank_settings", "rerank_score", "competing", "judge_shortlist", "shortlisted_texts", "pick_candidate", "lm_rule", "mbr_rule", "rule_name", "judge_for", "prefetch_judge", "repick_record", "oracle_pick"]

RERANKS = ("lm_loglik", "mbr", "none")


def rerank_rule(cfg) -> dict:
    """The rule that keeps one candidate per item: ``rerank`` (lm_loglik | mbr | none), the
    length exponent p (``rerank_length_penalty``, 0 when absent), for mbr the temperature T
    (``mbr_temperature``, 1 when absent) and, when ``judge.weight`` a > 0, the judge's weight
    and shortlist size (``judge_weight``, ``judge_top_k``: :func:`pick_candidate`)."""
    rerank = str(cfg.get("rerank", "lm_loglik"))
    if rerank not in RERANKS:
        raise ExperimentConfigError(f"rerank must be one of {', '.join(RERANKS)}, got {rerank!r}")
    rule = {"rerank": rerank, "length_penalty": float(cfg.get("rerank_length_penalty", 0.0) or 0.0)}
    judge = cfg.get("judge") or {}
    weight = float(judge.get("weight", 0.0) or 0.0)
    if not (math.isfinite(weight) and weight >= 0):
        raise ExperimentConfigError(f"judge.weight must be a finite number ≥ 0, got {weight}")
    if weight:
        top_k = judge.get("top_k", 16)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise ExperimentConfigError(f"judge.top_k must be a positive integer, got {top_k!r}")
        if rerank != "lm_loglik":
            raise ExperimentConfigError(f"judge.weight > 0 adds to the lm_loglik rerank; it does "
                                        f"not combine with rerank={rerank} (add judge.weight=0: "
                                        f"the adapted pipeline judges by default)")
        rule.update(judge_weight=weight, judge_top_k=int(top_k))
    if rerank == "mbr":
        rule["mbr_temperature"] = float(cfg.get("mbr_temperature", 1.0))
        if not rule["mbr_temperature"] > 0:
            raise ExperimentConfigError(f"mbr_temperature must be > 0, got {rule['mbr_temperature']}")
    return rule


def rerank_settings(cfg) -> dict:
    """The rerank's settings beyond ``rerank`` that are not at their defaults (p ≠ 0; T for
    mbr), so that runs from before they existed keep matching."""
    rule = rerank_rule(cfg)
    out = {"rerank_length_penalty": rule["length_penalty"]} if rule["length_penalty"] else {}
    if "mbr_temperature" in rule:
        out["mbr_temperature"] = rule["mbr_temperature"]
    if rule.get("judge_weight"):
        out["judge"] = OmegaConf.to_container(cfg.judge, resolve=True)
    return out


def rerank_score(log_likelihood: float, tokens: int, exponent: float) -> float:
    """The rerank's score of one candidate: log p_lm(y | prompt) / |y|^p, |y| its generated
    tokens (EOS included). p = 0 is the paper's summed log-likelihood; p = 1 the mean per token
    (the form of transformers' beam ``length_penalty``)."""
    return log_likelihood / max(tokens, 1) ** exponent if exponent else log_likelihood


def competing(accepted: Sequence[bool]) -> list[int]:
    """The candidates a rule chooses among: the constraint-satisfying ones, all when none is."""
    return [i for i, ok in enumerate(accepted) if ok] or list(range(len(accepted)))


def judge_shortlist(pool: list[int], scores: list[float], lengths: list[int], rule: dict,
                    texts: list[str]) -> list[int]:
    """The candidates a judge scores: the ``judge_top_k`` best of ``pool`` (the candidates that
    compete: :func:`pick_candidate`) by :func:`rerank_score`, one per distinct text, best first."""
    ranked = sorted(pool, key=lambda i: -rerank_score(scores[i], lengths[i], rule["length_penalty"]))
    distinct: dict[str, int] = {}
    for i in ranked:
        distinct.setdefault(texts[i], i)
    return list(distinct.values())[:int(rule["judge_top_k"])]


def shortlisted_texts(scores: list[float], lengths: list[int], accepted: list[bool], rule: dict,
                      texts: list[str]) -> list[str]:
    """The texts a judge scores for one item under ``rule``: :func:`judge_shortlist` of the
    :func:`competing` candidates."""
    return [texts[i] for i in judge_shortlist(competing(accepted), scores, lengths, rule, texts)]


def pick_candidate(scores: list[float], lengths: list[int], accepted: list[bool],
                   rule: dict | float = 0.0, texts: list[str] | None = None,
                   judge: Callable[[list[str]], list[float]] | None = None) -> int:
    """The index of the kept candidate, among the constraint-satisfying ones (all of them when
    none satisfies): ``lm_loglik``, the highest :func:`rerank_score` (the first on ties);
    ``mbr``, minimum Bayes risk over those candidates (:func:`ctrlg.lm.mbr.mbr_pick`: BLEU+1 on
    the metrics' tokens, weights softmax(rerank_score / T)); ``none``, the first. ``rule`` is
    :func:`rerank_rule`'s dict, or a bare length exponent for ``lm_loglik``.

    With ``judge_weight`` a > 0 in the rule, ``judge(texts)`` gives log p_judge(y | judge prompt)
    of the :func:`judge_shortlist` and the kept candidate is the shortlisted one of highest
    rerank_score(y) + a · log p_judge(y) (a product of experts: p_lm(y)^{1/|y|^p} · p_judge(y)^a)."""
    rule = {"rerank": "lm_loglik", "length_penalty": float(rule)} if not isinstance(rule, dict) else rule
    pool = competing(accepted)
    if rule["rerank"] == "none":
        return pool[0]
    if rule.get("judge_weight"):
        if judge is None or texts is None:
            raise ExperimentConfigError("judge.weight > 0 needs a judge LM and the candidates' texts")
        shortlist = judge_shortlist(pool, scores, lengths, rule, texts)
        verdicts = judge([texts[i] for i in shortlist])
        combined = [rerank_score(scores[i], lengths[i], rule["length_penalty"])
                    + rule["judge_weight"] * v for i, v in zip(shortlist, verdicts)]
        return shortlist[max(range(len(shortlist)), key=lambda k: combined[k])]
    ranked = [rerank_score(scores[i], lengths[i], rule["length_penalty"]) for i in pool]
    if rule["rerank"] == "mbr":
        if texts is None:
            raise ExperimentConfigError("rerank=mbr needs the candidates' texts")
        tokens = [metrics.tokenize_for_eval(texts[i]).split() for i in pool]
        return pool[mbr_pick(tokens, ranked, temperature=rule["mbr_temperature"])]
    return pool[max(range(len(pool)), key=lambda k: ranked[k])]


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
    concepts) (:func:`~ctrlg.tasks.commongen.items.judge_prompt_ids`); None without a judge."""
    if judge is None:
        return None
    prompt = judge_prompt_ids(record["concepts"], judge.tokenizer, cfg.get("judge") or {})
    return lambda texts: judge.score(prompt, texts)


def prefetch_judge(records: Sequence[dict], methods: Sequence[str], rules: Sequence[dict], judge,
                   cfg=None, batch: int = 10) -> None:
    """Score, ``batch`` records per judge call (:meth:`ctrlg.lm.judge.Judge.score_many`), every
    candidate that a rule with a judge weight would shortlist (:func:`judge_shortlist`) for the
    ``methods`` of ``records``, so that :func:`repick_record` then reads the judge's memo: the
    items of a batch share the judge's forward passes, as during decoding."""
    judged = [rule for rule in rules if rule.get("judge_weight")]
    if judge is None or not judged:
        return
    judge_cfg = (cfg if cfg is not None else {}).get("judge") or {}
    requests = []
    for record in records:
        wanted: dict[str, None] = {}
        for method in methods:
            candidates = _candidates(record, method)
            for rule in judged:
                wanted.update(dict.fromkeys(shortlisted_texts(
                    [c["log_likelihood"] for c in candidates], [c["tokens"] for c in candidates],
                    [bool(c["accepted"]) for c in candidates], rule, [c["text"] for c in candidates])))
        requests.append((judge_prompt_ids(record["concepts"], judge.tokenizer, judge_cfg), list(wanted)))
    for lo in range(0, len(requests), batch):
        judge.score_many(requests[lo:lo + batch])


def repick_record(record: dict, methods: Sequence[str], rule: dict, judge=None, cfg=None) -> dict:
    """``record`` with each of ``methods`` re-chosen from its candidates by ``rule``
    (:func:`pick_candidate`, with ``judge`` — a :class:`ctrlg.lm.judge.Judge`
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
        if "widened" in record[method]:       # the search's own record (iterative widening)
            out[method]["widened"] = record[method]["widened"]
    return out


def oracle_pick(candidates: list[dict], references: Sequence[str]) -> int:
    """The index of the constraint-satisfying candidate (any, when none satisfies) with the
    highest sentence-level BLEU-4 (pycocoevalcap's, against the item's ``references``); the
    first such on ties."""
    from pycocoevalcap.bleu.bleu_scorer import BleuScorer

    pool = competing([bool(c["accepted"]) for c in candidates])
    refs = [metrics.tokenize_for_eval(r) for r in references]
    scorer = BleuScorer(n=4)
    for i in pool:
        scorer += (metrics.tokenize_for_eval(candidates[i]["text"]) or "<empty>", refs)
    _, per_sentence = scorer.compute_score(option="closest", verbose=0)
    bleu4 = per_sentence[3]
    return pool[max(range(len(pool)), key=lambda k: bleu4[k])]
