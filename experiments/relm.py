"""ReLM's validation tasks (Kuchnik et al., MLSys 2023, §4) with the embedded LM.

    python -m experiments.relm task=lambada       [lambada.limit=500]
    python -m experiments.relm task=bias          [bias.num_samples=5000]
    python -m experiments.relm task=memorization  [memorization.num_results=2000 ...]
    python -m experiments.relm task=toxicity      [toxicity.limit=null toxicity.max_results=1000]

* **lambada** (§4.4) — zero-shot LAMBADA last word on the first ``lambada.limit`` passages, four
  variants (:mod:`ctrlg.tasks.lambada`): ``baseline`` (greedy decoding), ``words``,
  ``terminated``, ``no_stop`` (shortest-path queries). Each finished passage is appended to
  ``predictions.jsonl``; ``resume=true`` (or a run folder) continues an interrupted run, keeping
  the first complete row of each selected passage
  (:func:`ctrlg.tasks.lambada.lambada_record_schema`; any other line is set aside with its
  reason), and a passage whose query raises a ctrlg error is reported by index and skipped.
* **bias** (§4.2) — "The man/woman was trained in" + a profession sampled by
  :func:`ctrlg.relm.sample`, per configuration (prefix or not × canonical or all encodings ×
  edits), and a χ² test of independence (:mod:`ctrlg.relm.bias`); ``bias.png``.
* **memorization** (§4.1) — windows of well-known integer sequences, verified offline:
  shortest-path enumeration vs top-k sampling at fixed stop lengths, verified unique results
  per second and duplicate rates (:mod:`ctrlg.relm.memorization`); ``memorization.png``.
* **toxicity** (§4.3) — sentences of the corpus with an insult from a packaged word list
  (:mod:`ctrlg.data.insults`), extracted prompted and unprompted under canonical encodings vs all
  encodings + 1 edit (:mod:`ctrlg.relm.toxicity`); ``attempts.jsonl``, ``toxicity.png``.

Writes ``results.json`` and ``config.yaml`` (and the files named above) in the run folder.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from ctrlg.data import load_lambada, load_lambada_passages
from ctrlg.data.insults import find_insult_sentences, load_insult_words
from ctrlg.errors import CtrlgError, ExperimentConfigError
from ctrlg.relm.bias import BiasConfiguration, sample_configuration
from ctrlg.relm.memorization import Verifier, run_sampling, run_shortest_path
from ctrlg.relm.plots import plot_bias, plot_memorization, plot_toxicity
from ctrlg.relm.toxicity import Configuration, attempt, ratios, summarise
from ctrlg.tasks.config import generation_config, load_lm
from ctrlg.tasks.lambada import (lambada_query, lambada_record_schema, predict_baseline,
                                 predict_query)
from ctrlg.tasks.records import (RecordWriter, format_table, progress, read_records, write_json,
                                 write_jsonl)
from experiments.common import (find_resume_dir, hydra_output_dir, report_errors,
                                save_resolved_config, seed_everything)

TASKS = ("lambada", "bias", "memorization", "toxicity")
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


def lambada_examples(cfg: DictConfig) -> list:
    """The passages ``lambada.path`` / ``lambada.limit`` select."""
    return load_lambada(cfg.lambada.path, limit=cfg.lambada.limit)


def run_lambada(cfg, model, tokenizer, out_dir: Path, resume_dir: Path | None = None) -> dict:
    """Each finished passage is appended to ``predictions.jsonl`` at once. A resumed run
    (``resume_dir``) keeps the first usable row of each selected passage there
    (:func:`ctrlg.tasks.lambada.lambada_record_schema`), whose passages are not redone; any
    other line is skipped with a warning and set aside. A passage whose query raises a
    :class:`ctrlg.errors.CtrlgError` is reported by index and skipped."""
    lcfg = cfg.lambada
    examples = lambada_examples(cfg)
    variants = list(lcfg.variants)
    schema, selection = lambada_record_schema(examples, variants), set(range(len(examples)))
    previous = (read_records(resume_dir, PREDICTIONS, schema=schema, selection=selection)
                if resume_dir is not None else [])
    queries = {v: lambada_query(v, int(lcfg.max_tokens), lcfg.top_k, lcfg.encodings)
               for v in variants if v != "baseline"}
    done = {r["index"] for r in previous}
    rows = list(previous)
    with RecordWriter(out_dir / PREDICTIONS, previous, schema=schema,
                      selection=selection) as writer:
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


# ---------------------------------------------------------------------- shared
def document_start(cfg, tokenizer) -> int:
    """The token that starts a document (``model.bos_token``; for an instruct LM not the chat
    turn's BOS), else the tokenizer's BOS."""
    name = cfg.model.get("bos_token")
    tid = tokenizer.convert_tokens_to_ids(name) if name else None
    return int(tid if tid is not None else tokenizer.bos_token_id)


def print_table(title: str, rows, columns, headers) -> None:
    print(title)
    print(format_table(rows, columns, headers))


# ---------------------------------------------------------------------- bias
def run_bias(cfg, model, tokenizer, out_dir: Path) -> dict:
    bcfg = cfg.bias
    configs = [BiasConfiguration(bool(p), e, int(k)) for p in bcfg.prefix
               for e in bcfg.encodings for k in bcfg.edit_distances]
    results, samples = [], []
    for config in progress(configs, desc="bias"):
        row = sample_configuration(model, tokenizer, bcfg.template, list(bcfg.genders),
                                   list(bcfg.professions), config,
                                   num_samples=int(bcfg.num_samples),
                                   bos_id=document_start(cfg, tokenizer), seed=cfg.seed,
                                   batch_size=int(bcfg.batch_size),
                                   max_tokens=int(bcfg.max_tokens))
        samples += [{"configuration": config.name, **s} for s in row.pop("samples")]
        results.append(row)
        write_json(out_dir / "results.json", {"task": "bias", "configurations": results,
                                              "finished": False})   # kept if interrupted
    write_jsonl(out_dir / "samples.jsonl", samples)
    plot_bias(results, out_dir / "bias.png")
    print_table(f"Gender bias: '{bcfg.template}' + profession, {bcfg.num_samples} samples per "
                f"gender → {out_dir}", results,
                ["configuration", "chi2", "dof", "p_value", "seconds"],
                ["configuration", "χ²", "dof", "p-value", "time s"])
    for row in results:
        print(f"  {row['configuration']}: " + "; ".join(
            f"{g}: " + ", ".join(f"{p} {c}" for p, c in row["counts"][g].items() if c)
            for g in bcfg.genders))
    return {"configurations": results}


# ---------------------------------------------------------------------- memorisation
def run_memorization(cfg, model, tokenizer, out_dir: Path) -> dict:
    mcfg = cfg.memorization
    verifier = Verifier(int(mcfg.window), int(mcfg.digits))
    context = [document_start(cfg, tokenizer)] + tokenizer(
        mcfg.context, add_special_tokens=False)["input_ids"]
    rows = [run_shortest_path(model, tokenizer, context, mcfg.pattern, verifier,
                              num_results=int(mcfg.num_results), top_k=mcfg.top_k,
                              encodings=mcfg.encodings, max_tokens=int(mcfg.max_tokens),
                              batch_size=int(mcfg.batch_size),
                              max_expansions=int(mcfg.max_expansions))]
    for length in progress(list(mcfg.stop_lengths), desc="sampling"):
        rows.append(run_sampling(model, tokenizer, context, verifier, stop_length=int(length),
                                 num_samples=int(mcfg.num_samples), top_k=mcfg.top_k,
                                 batch_size=int(mcfg.batch_size), seed=cfg.seed))
    plot_memorization(rows, out_dir / "memorization.png")
    print_table(f"Verified extraction of {verifier.window}-term windows of known sequences "
                f"after {mcfg.context!r} → {out_dir}", rows,
                ["method", "stop_length", "attempts", "candidates", "unique", "verified",
                 "duplicate_rate", "seconds", "cpu_seconds", "verified_per_cpu_second"],
                ["method", "stop length", "attempts", "candidates", "unique", "verified",
                 "duplicates", "wall s", "CPU s", "verified / CPU s"])
    return {"rows": rows}


# ---------------------------------------------------------------------- toxicity
def run_toxicity(cfg, model, tokenizer, out_dir: Path) -> dict:
    tcfg = cfg.toxicity
    configs = [Configuration(c.encodings, int(c.edits)) for c in tcfg.configurations]
    try:
        words = load_insult_words(None if tcfg.words is None else list(tcfg.words))
        items = find_insult_sentences(load_lambada_passages(tcfg.corpus), words)
    except CtrlgError as error:
        print(f"toxicity: {error}; nothing to extract", file=sys.stderr)
        return {"inputs": 0, "message": str(error), "rows": [], "ratios": {}}
    if not items:
        message = (f"no sentence of the corpus contains one of the {len(words)} insult words; "
                   f"nothing to extract")
        print(f"toxicity: {message}", file=sys.stderr)
        return {"inputs": 0, "message": message, "rows": [], "ratios": {}}
    items = items[:tcfg.limit] if tcfg.limit is not None else items
    attempts = []
    jobs = [(a, c, i) for a in tcfg.attacks for c in configs for i in items]
    for attack, config, item in progress(jobs, desc="toxicity"):
        attempts.append(attempt(model, tokenizer, item, attack, config, top_k=tcfg.top_k,
                                max_results=int(tcfg.max_results),
                                batch_size=int(tcfg.batch_size),
                                max_expansions=int(tcfg.max_expansions),
                                bos_id=document_start(cfg, tokenizer)))
    rows = summarise(attempts, configs)
    gain = ratios(rows, configs[0].name, configs[-1].name)
    write_jsonl(out_dir / "attempts.jsonl", attempts)
    plot_toxicity(rows, attempts, out_dir / "toxicity.png")
    print_table(f"Toxic content: {len(items)} corpus sentences with an insult, top-"
                f"{tcfg.top_k} → {out_dir}", rows,
                ["attack", "configuration", "inputs", "successes", "success_pct",
                 "success_kept_pct", "per_input", "per_input_kept", "seconds"],
                ["attack", "configuration", "inputs", "with a match", "success %",
                 "insult kept %", "matches / input", "kept / input", "time s"])
    print(f"{configs[-1].name} over {configs[0].name}: prompted success ×"
          f"{gain.get('prompted')}, unprompted matches per input ×{gain.get('unprompted')} "
          f"(ReLM, GPT-2 XL: ×2.5 and ×93)")
    return {"inputs": len(items), "words": words, "rows": rows, "ratios": gain,
            "per_input": [{"attack": a["attack"], "configuration": a["configuration"],
                           "target": a["target"], "matches": len(a["matches"]),
                           "message": a["message"]} for a in attempts]}


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
    wall, cpu = time.perf_counter(), time.process_time()
    if cfg.task == "lambada":
        result = run_lambada(cfg, model, tokenizer, out_dir, resume_dir)
    else:
        runner = {"bias": run_bias, "memorization": run_memorization,
                  "toxicity": run_toxicity}[cfg.task]
        result = runner(cfg, model, tokenizer, out_dir)
    # CPU seconds (all threads) beside wall seconds: on a shared machine the wall time measures
    # the load, the CPU time the work
    timing = {"wall_seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu}
    print(f"{cfg.task}: {timing['wall_seconds']:.0f} s wall, {timing['cpu_seconds']:.0f} s CPU "
          f"(after loading the LM)")
    write_json(out_dir / "results.json", {"task": cfg.task, **result, **timing})
    return result


@hydra.main(version_base=None, config_path="../configs", config_name="relm")
@report_errors
def main(cfg: DictConfig) -> None:
    run(cfg, hydra_output_dir())


if __name__ == "__main__":
    main()
