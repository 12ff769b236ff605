"""The CommonGen run from loaded models to ``metrics.json``: load the LM, HMM and judge of a
config, prepare each batch (constraints, prompts; items the budget cannot satisfy are reported
and recorded as skipped), decode it with every method, append each finished record to
``generations.jsonl`` at once (so ``resume`` continues an interrupted run), then score and print.

May import: the library below :mod:`ctrlg.tasks` and :mod:`ctrlg.tasks.records` / :mod:`ctrlg.tasks.config`; within
this package, every module above.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ctrlg import metrics
from ctrlg.data.commongen_prompts import target_prefix
from ctrlg.errors import ExperimentConfigError
from ctrlg.lm.judge import Judge
from ctrlg.tasks.commongen.decoding import batch_seed, eos_ids, generate_batch
from ctrlg.tasks.commongen.items import (batches, build_constraint, judge_prompt_ids, judge_style,
                                         keyword_groups, prompt_ids, unsatisfiable_reason)
from ctrlg.tasks.commongen.rerank import rerank_rule
from ctrlg.tasks.commongen.scoring import print_tables, reference_words, score_methods
from ctrlg.tasks.config import load_hmm, load_lm, resolve_device
from ctrlg.tasks.record_files import RecordSchema
from ctrlg.tasks.records import RecordWriter, progress, read_records, write_json

__all__ = ["load_models", "load_judge", "prepare_batch", "decode_batch", "decode_items", "report",
           "record_schema", "resume_records"]


def load_models(cfg: DictConfig, specs: dict):
    """(model, tokenizer, hmm): the LM and, when a method guides with it, the HMM (None
    otherwise), both on ``device``, checked to carry a prior head when a method uses
    ``prior=head``."""
    device = resolve_device(cfg.get("device", "cpu"))
    model, tokenizer = load_lm(cfg.model, device)
    needs_hmm = any(s["guide"] == "ctrlg" for s in specs.values())
    hmm = load_hmm(cfg.hmm, tokenizer).to(device) if needs_hmm else None
    heads = [m for m in cfg.methods if specs[m]["guide"] == "ctrlg" and specs[m]["prior"] == "head"]
    if heads and getattr(hmm, "prior_head", None) is None:
        raise ExperimentConfigError(f"method(s) {heads} use prior=head but the HMM "
                                    f"({cfg.hmm.get('path') or 'the embedded default'}) has no "
                                    f"prior head saved with it or named by hmm.prior_head; "
                                    f"train one with `python -m experiments.distill` (it does by "
                                    f"default; base_hmm=... for a head alone) or use the "
                                    f"filtering prior, e.g. methods=[logical,ctrlg_w075]")
    return model, tokenizer, hmm


def load_judge(cfg: DictConfig) -> Judge | None:
    """The judge LM of ``judge`` (None when ``judge.weight`` is 0): ``judge.model`` (null: the
    embedded LM) with ``judge.adapter`` (null: none) in ``model.dtype`` on ``device``, reading each candidate
    as its prompt style continues (:func:`ctrlg.data.commongen_prompts.target_prefix`)."""
    if not rerank_rule(cfg).get("judge_weight"):
        return None
    judge_cfg = cfg.judge
    style = judge_style(judge_cfg)
    model, tokenizer = load_lm(OmegaConf.create({"name": judge_cfg.get("model"),
                                                 "adapter": judge_cfg.get("adapter"),
                                                 "dtype": cfg.model.get("dtype", "float32")}),
                               resolve_device(cfg.get("device", "cpu")))
    return Judge(model, tokenizer, text_prefix=target_prefix(style["prompt_style"]))


def prepare_batch(batch: list, cfg: DictConfig, tokenizer, vocab_size: int, eos: list[int],
                  keep) -> list[tuple[dict, object, list[int]]]:
    """(record, constraint, prompt ids) of each item of ``batch`` whose constraint can be met
    within the token budget; an item whose cannot is reported on stderr and passed to ``keep``
    as skipped."""
    ready = []
    for index, example in batch:
        groups = keyword_groups(example, cfg.constraint)
        start = time.perf_counter()
        constraint = build_constraint(example, groups, tokenizer, cfg.constraint, vocab_size, eos[0])
        record = {"index": index, "concepts": list(example.concepts),
                  "keyword_groups": groups, "references": list(example.references),
                  "dfa_states": constraint.num_states,
                  "dfa_seconds": time.perf_counter() - start}
        reason = unsatisfiable_reason(constraint, cfg, eos)
        if reason is not None:
            print(f"item {index} ({', '.join(example.concepts)}): skipped, {reason}",
                  file=sys.stderr)
            keep({**record, "skipped": reason})
            continue
        record["seconds"] = {}
        ready.append((record, constraint, prompt_ids(example, tokenizer, cfg.model)))
    return ready


def decode_batch(ready: list, first_index: int, methods: list[str], specs: dict, model, tokenizer,
                 hmm, cfg: DictConfig, judge: Judge | None = None,
                 prompt_memo: dict | None = None) -> None:
    """Every method on the ``ready`` items of one batch (:func:`generate_batch`, seeded by
    :func:`batch_seed`; the methods share guide tables; ``prompt_memo[method]`` keeps the
    candidates of prompt-determined methods across batches); each record gets the method's
    output and its share of the batch's seconds."""
    if not ready:
        return
    shared: dict = {}
    style = None if judge is None else judge_style(cfg.judge)   # resolved once per batch
    judge_prompts = None if judge is None else \
        [judge_prompt_ids(record["concepts"], judge.tokenizer, style) for record, _, _ in ready]
    for method in methods:
        start = time.perf_counter()
        outputs = generate_batch(specs[method], model, tokenizer, [p for _, _, p in ready],
                                 [c for _, c, _ in ready], hmm, cfg,
                                 batch_seed(cfg.seed, first_index, method), shared, judge,
                                 judge_prompts,
                                 None if prompt_memo is None else prompt_memo.setdefault(method, {}))
        share = (time.perf_counter() - start) / len(ready)
        for (record, _, _), output in zip(ready, outputs):
            record[method] = output
            record["seconds"][method] = share
    for proc in shared.values():  # detach the prior heads' hooks from the LM
        if hasattr(proc.prior, "remove"):
            proc.prior.remove()


def record_schema(items: list, methods: list[str]) -> RecordSchema:
    """What a resumed record of this run must be: ``index`` (an int), ``concepts`` equal to
    the selected item's, ``references`` and ``keyword_groups`` lists, and either ``skipped``
    (a reason) or an output ``{"text": str, ...}`` of every method of this run."""
    concepts = {index: list(example.concepts) for index, example in items}

    def check(record: dict) -> str | None:
        if record["index"] in concepts and record["concepts"] != concepts[record["index"]]:
            return (f"its concepts {record['concepts']} are not item {record['index']}'s "
                    f"{concepts[record['index']]} (another data file?)")
        if "skipped" in record:
            return None if isinstance(record["skipped"], str) else "'skipped' is not a reason"
        for method in methods:
            output = record.get(method)
            if not isinstance(output, dict) or not isinstance(output.get("text"), str):
                return f"no output {{'text': ...}} of method {method!r}"
        return None

    return RecordSchema(fields={"index": int, "concepts": list, "references": list,
                                "keyword_groups": list}, check=check)


def resume_records(folder: Path, items: list, methods: list[str]) -> list[dict]:
    """The records of the run in ``folder`` that this run can keep: one per selected item, of
    :func:`record_schema`'s shape; the others are skipped with a warning
    (:func:`ctrlg.tasks.records.read_records`) and decoded again."""
    return read_records(folder, schema=record_schema(items, methods),
                        selection={index for index, _ in items})


def decode_items(items: list, previous: list[dict], methods: list[str], specs: dict, model,
                 tokenizer, hmm, cfg: DictConfig, out_dir: Path,
                 judge: Judge | None = None) -> list[dict]:
    """Every item not in ``previous`` (the records of a resumed run), batch by batch
    (:func:`batches`); each finished record is appended to ``generations.jsonl`` at once.
    Returns all records, the previous ones first."""
    done = {r["index"] for r in previous}
    eos = eos_ids(model, tokenizer)
    vocab_size = hmm.vocab_size if hmm is not None else len(tokenizer)
    writer = RecordWriter(out_dir / "generations.jsonl", previous,
                          schema=record_schema(items, methods),
                          selection={index for index, _ in items})
    records = list(previous)
    prompt_memo: dict = {}   # method -> prompt -> candidates (generate_batch)

    def keep(record: dict) -> None:
        writer.write(record)
        records.append(record)

    bar = progress(None, total=len(items), desc="commongen", initial=len(done & {i for i, _ in items}))
    try:
        for group in batches(items, int(cfg.batch_size)):
            batch = [(i, ex) for i, ex in group if i not in done]
            if not batch:
                continue
            ready = prepare_batch(batch, cfg, tokenizer, vocab_size, eos, keep)
            decode_batch(ready, group[0][0], methods, specs, model, tokenizer, hmm, cfg, judge,
                         prompt_memo)
            for record, _, _ in ready:
                keep(record)
            bar.update(len(batch))
    finally:
        bar.close()
        writer.close()
    return records


def report(records: list[dict], first_index: int, methods: list[str], specs: dict,
           cfg: DictConfig, out_dir: Path) -> dict:
    """Score the records that were not skipped (:func:`score_methods`), write ``metrics.json``
    and print the tables; returns ``{method: metrics row}``."""
    scored = [r for r in records if "skipped" not in r]
    skipped = [{"index": r["index"], "concepts": r["concepts"], "reason": r["skipped"]}
               for r in records if "skipped" in r]
    if not scored:
        raise ExperimentConfigError(f"all {len(records)} items were skipped (unsatisfiable within "
                                    f"generation.max_new_tokens={cfg.generation.max_new_tokens})")
    table, intervals = score_methods(scored, methods, specs, cfg)
    ref_words = reference_words(scored)
    write_json(out_dir / "metrics.json", {"items": len(scored), "skipped": skipped,
                                          "scales": metrics.SCALES,
                                          "reference_words": ref_words, "methods": table,
                                          "bootstrap": {"baseline": cfg.bootstrap.baseline,
                                                        "intervals": intervals}})
    print(f"CommonGen ({len(scored)} items from index {first_index}, {len(skipped)} skipped, "
          f"K={cfg.generation.num_samples}, beams={cfg.generation.get('num_beams', 1)}, "
          f"max_new_tokens={cfg.generation.max_new_tokens}) → {out_dir}")
    print_tables(table, intervals, methods, cfg, ref_words)
    return table
