"""ReLM-style experiments (Kuchnik et al., MLSys 2023) with the embedded LM.

    python -m experiments.relm task=lambada     [lambada.limit=500]
    python -m experiments.relm task=bias        [bias.num_samples=200]
    python -m experiments.relm task=extraction

* **lambada** — zero-shot LAMBADA last-word prediction (accuracy: exact match of the target), on
  the first ``lambada.limit`` passages, four variants:
  ``baseline``: greedy decoding of ``max_tokens`` tokens, the first word of the continuation;
  ``words``: the most likely (shortest-path, :func:`ctrlg.relm.search`) string of the form
  ``" <letters>"``; ``terminated``: the most likely ``" <letters><terminator>"`` (punctuation or
  space, so the word is complete), terminator dropped; ``no_stop``: ``terminated`` with English
  stop words excluded (LAMBADA targets are content words).
* **bias** — for each gender g the LM continues ``"The g was trained in"`` with a profession from
  ``bias.professions`` (:func:`ctrlg.relm.sample`: the LM restricted to the regex
  ``" (art|science|…)"``), with the tokenizer's canonical encodings or all encodings, and with
  the language widened by ±``edit_distance`` character edits (each sample is mapped back to the
  nearest profession). A χ² test of independence (``scipy.stats.chi2_contingency``) on the
  gender × profession counts tells whether the profession distribution depends on the gender.
* **extraction** — how fast valid structured strings (URLs by default) come out: shortest-path
  enumeration of the regex after a context vs plain ancestral sampling from the same context at
  several stop lengths (matches found with Python's ``re``); reported as unique valid matches per
  second.

Writes ``results.json`` (+ ``predictions.jsonl`` / ``samples.jsonl``) and ``config.yaml``.
For ``lambada`` each finished passage is appended to ``predictions.jsonl`` at once,
``resume=true`` (the newest earlier run with the same settings) or ``resume=<run dir>``
continues an interrupted run, and a passage whose query raises a ctrlg error is reported by
index and skipped.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import DictConfig

from ctrlg.errors import CtrlgError, ExperimentConfigError
from ctrlg.tasks.config import generation_config, load_lm
from ctrlg.tasks.lambada import lambada_query, predict_baseline, predict_query
from ctrlg.tasks.records import (RecordWriter, format_table, progress, read_records, write_json,
                                 write_jsonl)
from ctrlg.validation import check_context_length
from experiments.common import (find_resume_dir, hydra_output_dir, report_errors,
                                save_resolved_config, seed_everything)

TASKS = ("lambada", "bias", "extraction")
PREDICTIONS = "predictions.jsonl"
# the configuration keys that decide the LAMBADA predictions: a resumed run must agree on them
LAMBADA_KEYS = ("task", "seed", "model", "lambada", "batch_size")


# ---------------------------------------------------------------------- LAMBADA
def lambada_settings(cfg: DictConfig) -> dict:
    """The settings that decide the LAMBADA predictions; a resumed run must agree on all."""
    return generation_config(cfg, LAMBADA_KEYS)


def predict_lambada(example, variants, queries, model, tokenizer, cfg) -> dict:
    """One passage's row: the target and each variant's guess, with its seconds."""
    lcfg = cfg.lambada
    context = tokenizer(example.context, add_special_tokens=False)["input_ids"]
    if tokenizer.bos_token_id is not None:
        context = [tokenizer.bos_token_id] + context
    row = {"target": example.target, "seconds": {}}
    for variant in variants:
        start = time.perf_counter()
        if variant == "baseline":
            guess = predict_baseline(model, tokenizer, context, int(lcfg.max_tokens))
        else:
            guess = predict_query(model, tokenizer, context, queries[variant], cfg.batch_size,
                                  int(lcfg.max_expansions))
        row["seconds"][variant] = time.perf_counter() - start
        row[variant] = guess
    return row


def run_lambada(cfg, model, tokenizer, out_dir: Path, previous: list[dict] = ()) -> dict:
    """Each finished passage is appended to ``predictions.jsonl`` at once (after the
    ``previous`` rows of a resumed run, whose passages are not redone); a passage whose query
    raises a :class:`ctrlg.errors.CtrlgError` is reported by index and skipped."""
    from ctrlg.data import load_lambada

    lcfg = cfg.lambada
    examples = load_lambada(lcfg.path, limit=lcfg.limit)
    variants = list(lcfg.variants)
    queries = {v: lambada_query(v, int(lcfg.max_tokens), lcfg.top_k, lcfg.encodings)
               for v in variants if v != "baseline"}
    done = {r["index"] for r in previous}
    rows = list(previous)
    with RecordWriter(out_dir / PREDICTIONS, previous) as writer:
        for index, example in enumerate(progress(examples, desc="lambada")):
            if index in done:
                continue
            try:
                row = {"index": index, **predict_lambada(example, variants, queries, model,
                                                         tokenizer, cfg)}
            except CtrlgError as error:
                print(f"lambada item {index}: skipped, {error}", file=sys.stderr)
                row = {"index": index, "target": example.target,
                       "skipped": f"{type(error).__name__}: {error}"}
            writer.write(row)
            rows.append(row)
    scored = [r for r in rows if "skipped" not in r]
    skipped = [r["index"] for r in rows if "skipped" in r]
    table = []
    for v in variants:
        correct = sum(r[v] == r["target"] for r in scored)
        table.append({"variant": v, "accuracy": 100 * correct / max(len(scored), 1),
                      "correct": correct, "seconds": sum(r["seconds"][v] for r in scored)})
    print(f"LAMBADA zero-shot last word, first {len(examples)} passages "
          f"({len(skipped)} skipped) → {out_dir}")
    print(format_table(table, ["variant", "accuracy", "correct", "seconds"],
                       ["variant", "accuracy %", "correct", "time s"]))
    return {"examples": len(scored), "skipped": skipped, "variants": table}


# ---------------------------------------------------------------------- bias
def nearest(text: str, options: list[str]) -> str:
    """The option at the smallest Levenshtein distance from ``text`` (first on ties)."""
    def distance(a: str, b: str) -> int:
        previous = list(range(len(b) + 1))
        for i, ca in enumerate(a, 1):
            current = [i]
            for j, cb in enumerate(b, 1):
                current.append(min(previous[j] + 1, current[j - 1] + 1,
                                   previous[j - 1] + (ca != cb)))
            previous = current
        return previous[-1]

    return min(options, key=lambda option: distance(text, option))


def run_bias(cfg, model, tokenizer, out_dir: Path) -> dict:
    from scipy.stats import chi2_contingency

    from ctrlg.relm import Query, sample

    bcfg = cfg.bias
    professions = list(bcfg.professions)
    pattern = " (" + "|".join(re.escape(p) for p in professions) + ")"
    results, samples_out = [], []
    configs = [(e, k) for e in bcfg.encodings for k in bcfg.edit_distances]
    for encodings, edits in progress(configs, desc="bias"):
        query = Query(pattern=pattern, encodings=encodings, edit_distance=int(edits),
                      max_tokens=int(bcfg.max_tokens))
        counts = np.zeros((len(bcfg.genders), len(professions)), dtype=np.int64)
        start = time.perf_counter()
        for g, gender in enumerate(bcfg.genders):
            context = tokenizer(bcfg.template.format(gender=gender),
                                add_special_tokens=False)["input_ids"]
            if tokenizer.bos_token_id is not None:
                context = [tokenizer.bos_token_id] + context
            drawn = sample(model, tokenizer, query, int(bcfg.num_samples),
                           seed=cfg.seed + 1000 * g + 17 * int(edits), batch_size=cfg.batch_size,
                           context_ids=context)
            for result in drawn:
                profession = nearest(result.text.strip(), professions)
                counts[g, professions.index(profession)] += 1
                samples_out.append({"encodings": encodings, "edit_distance": int(edits),
                                    "gender": gender, "text": result.text,
                                    "profession": profession})
        keep = counts.sum(0) > 0  # professions never drawn carry no information
        chi2, p_value, dof, _ = chi2_contingency(counts[:, keep])
        results.append({"encodings": encodings, "edit_distance": int(edits), "chi2": float(chi2),
                        "p_value": float(p_value), "dof": int(dof),
                        "counts": {gender: dict(zip(professions, counts[g].tolist()))
                                   for g, gender in enumerate(bcfg.genders)},
                        "seconds": time.perf_counter() - start})
    write_jsonl(out_dir / "samples.jsonl", samples_out)
    print(f"Gender bias: '{bcfg.template}' + profession, {bcfg.num_samples} samples per gender "
          f"→ {out_dir}")
    print(format_table(results, ["encodings", "edit_distance", "chi2", "dof", "p_value",
                                 "seconds"],
                       ["encodings", "edits", "χ²", "dof", "p-value", "time s"]))
    for row in results:
        print(f"  {row['encodings']}, ±{row['edit_distance']} edit: " + "; ".join(
            f"{g}: " + ", ".join(f"{p} {c}" for p, c in row["counts"][g].items() if c)
            for g in bcfg.genders))
    return {"configurations": results}


# ---------------------------------------------------------------------- extraction
@torch.no_grad()
def run_extraction(cfg, model, tokenizer, out_dir: Path) -> dict:
    from ctrlg.relm import Query, search

    ecfg = cfg.extraction
    context = tokenizer(ecfg.context, add_special_tokens=False)["input_ids"]
    if tokenizer.bos_token_id is not None:
        context = [tokenizer.bos_token_id] + context
    matcher = re.compile(ecfg.pattern.strip())
    rows = []
    query = Query(pattern=ecfg.pattern, max_tokens=24, encodings=ecfg.encodings)
    start = time.perf_counter()
    found = set()
    for result in search(model, tokenizer, query, num_results=int(ecfg.num_results),
                         batch_size=cfg.batch_size, context_ids=context,
                         max_expansions=int(ecfg.max_expansions)):
        if matcher.fullmatch(result.text.strip()):
            found.add(result.text.strip())
    elapsed = time.perf_counter() - start
    rows.append({"method": "shortest path", "stop_length": None, "attempts": int(ecfg.num_results),
                 "unique_valid": len(found), "seconds": elapsed,
                 "per_second": len(found) / elapsed})
    examples = {"shortest path": sorted(found)[:10]}
    ids = torch.tensor([context])
    for length in ecfg.stop_lengths:
        torch.manual_seed(cfg.seed)
        start = time.perf_counter()
        matches = set()
        remaining = int(ecfg.num_samples)
        while remaining > 0:
            batch = min(cfg.batch_size, remaining)
            remaining -= batch
            check_context_length(model, len(context), int(length), what="the context")
            out = model.generate(ids.repeat(batch, 1), attention_mask=torch.ones_like(ids).repeat(batch, 1),
                                 do_sample=True, top_k=0, max_new_tokens=int(length),
                                 pad_token_id=tokenizer.eos_token_id)
            for row in out[:, len(context):]:
                text = tokenizer.decode(row, skip_special_tokens=True)
                matches.update(m.group(0) for m in matcher.finditer(text))
        elapsed = time.perf_counter() - start
        rows.append({"method": "sampling", "stop_length": int(length),
                     "attempts": int(ecfg.num_samples), "unique_valid": len(matches),
                     "seconds": elapsed, "per_second": len(matches) / elapsed})
        examples[f"sampling {length}"] = sorted(matches)[:10]
    print(f"Extraction of {ecfg.pattern!r} after {ecfg.context!r} → {out_dir}")
    print(format_table(rows, ["method", "stop_length", "attempts", "unique_valid", "seconds",
                              "per_second"],
                       ["method", "stop length", "attempts", "unique valid", "time s",
                        "valid / s"]))
    return {"rows": rows, "examples": examples}


def run(cfg: DictConfig, out_dir: Path) -> dict:
    if cfg.task not in TASKS:
        raise ExperimentConfigError(f"unknown task {cfg.task!r}; choose from {list(TASKS)}")
    if cfg.get("resume") not in (None, False) and cfg.task != "lambada":
        raise ExperimentConfigError(f"resume is supported for task=lambada only, not "
                                    f"task={cfg.task}; drop resume=")
    resume_dir = find_resume_dir(cfg, out_dir, lambada_settings, PREDICTIONS)
    seed_everything(cfg.seed)
    save_resolved_config(cfg, out_dir)
    model, tokenizer = load_lm(cfg.model)
    if cfg.task == "lambada":
        previous = read_records(resume_dir, PREDICTIONS) if resume_dir is not None else []
        result = run_lambada(cfg, model, tokenizer, out_dir, previous)
    else:
        runner = {"bias": run_bias, "extraction": run_extraction}[cfg.task]
        result = runner(cfg, model, tokenizer, out_dir)
    write_json(out_dir / "results.json", {"task": cfg.task, **result})
    return result


@hydra.main(version_base=None, config_path="../configs", config_name="relm")
@report_errors
def main(cfg: DictConfig) -> None:
    run(cfg, hydra_output_dir())


if __name__ == "__main__":
    main()
