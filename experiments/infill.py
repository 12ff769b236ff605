"""Text infilling with ILM-style hierarchical masks (Ctrl-G §4.2, after Donahue et al. 2020).

    python -m experiments.infill [data.limit=N] [data.mask_ratios=[0.13,0.4]] [resume=true]

Corpus: LAMBADA passages (narrative fiction, bundled, CC BY 4.0) — the ROC Stories split of ILM
is not available offline. For each target mask ratio (≈ 13/21/32/40 %), the mask probability p of
:func:`ctrlg.data.mask_hierarchical` is calibrated on ``data.calibration_docs`` passages, then
``data.limit`` other passages are masked (document/paragraph/sentence/n-gram/word spans).

The LM sees the story with blanks in its chat template and writes the complete story. The
constraint is the concatenation

    exact(f_0) · gap(g_1) · exact(f_1) · … · gap(g_m) · exact(f_m) · EOS

of the unmasked fragments f_i (tokenised on their own) and one gap per masked span whose length
in tokens lies in the range configured for its granularity (``gap_tokens``; word/n-gram/sentence
gaps may not contain a newline; no gap may contain EOS, nor the first token of the fragment that
follows it, which keeps the automaton deterministic and linear in size). Methods: ``logical`` (tokens that make
the constraint unsatisfiable are masked) and ``ctrlg`` (HMM-guided). The completed stories are
scored against the originals with BLEU-4 and ROUGE-L, per mask ratio.

Robustness: every finished passage is appended to ``generations.jsonl`` at once;
``resume=true`` (the newest earlier run of the same configuration) or ``resume=<run dir>``
continues an interrupted run (the same masks and seeds per passage, so the same outputs); a
passage whose constraint raises a ctrlg error is reported by ratio and index, recorded as
skipped, and the others go on.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from ctrlg.errors import CtrlgError, ExperimentConfigError, InsufficientMemoryError
from ctrlg.tasks.config import generation_config, load_hmm, load_lm
from ctrlg.tasks.records import (RecordWriter, format_table, interval_cell, interval_header,
                                 paired_intervals, progress, read_records, write_json)
from ctrlg.vocab import eos_token_ids
from experiments.common import find_resume_dir, hydra_output_dir, report_errors, start_run

METHODS = ("logical", "ctrlg")
METRICS = ("bleu4", "rouge_l")   # the corpus metrics scored against the original story
# the configuration keys that decide the generations: a resumed run must agree on all of them
GENERATION_KEYS = ("seed", "methods", "generation", "model", "hmm", "data", "gap_tokens",
                   "instruction", "rerank")


def newline_tokens(tokenizer) -> list[int]:
    """Ids of tokens whose bytes contain a newline."""
    from ctrlg.vocab import token_bytes

    return [i for i, b in enumerate(token_bytes(tokenizer)) if b"\n" in b]


def gap_dfa(granularity, gap_tokens, vocab_size: int, banned: list[int]):
    """Token sequences of a length in the granularity's range that avoid ``banned`` tokens."""
    from ctrlg import dfa

    low, high = (int(x) for x in gap_tokens[granularity.value])
    free = dfa.length(low, high, vocab_size=vocab_size)
    return dfa.intersect(free, dfa.banned_phrases([[t] for t in banned], vocab_size))


def constraint_pieces(document) -> list[tuple[str, object]]:
    """The masked document as alternating ("text", fragment) / ("gap", granularity) pieces.

    Whitespace around fragments is normalised: a fragment that follows a gap starts with one
    space (the gap ends at a word boundary, as BPE vocabularies attach the space to the next
    word), trailing whitespace is dropped, and whitespace-only fragments between two spans are
    removed, merging the two gaps into one of the coarser granularity."""
    from ctrlg.data import Granularity

    order = list(Granularity)  # coarse → fine
    pieces: list[tuple[str, object]] = []
    for index, fragment in enumerate(document.fragments):
        if index > 0:
            granularity = document.spans[index - 1].granularity
            if pieces and pieces[-1][0] == "gap":
                coarser = min(pieces[-1][1], granularity, key=order.index)
                pieces[-1] = ("gap", coarser)
            else:
                pieces.append(("gap", granularity))
        text = fragment.strip()
        if not text:
            continue
        if index > 0 and fragment[:1].isspace():
            text = " " + text
        pieces.append(("text", text))
    return pieces


def infill_constraint(document, tokenizer, gap_tokens, eos: list[int], newlines: list[int]):
    """(DFA, token budget) for one masked document (see module docstring).

    To keep the concatenation deterministic (and its DFA linear in the story length) a gap may
    not contain the first token of the fragment that follows it: the gap ends where that
    fragment begins. This removes the rare fillers that contain that token, and nothing else."""
    from ctrlg import dfa
    from ctrlg.data import Granularity

    V = len(tokenizer)
    keeps_newline = {Granularity.PARAGRAPH, Granularity.DOCUMENT}
    pieces = constraint_pieces(document)
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] if kind == "text" else p
               for kind, p in pieces]
    automata, budget = [], 1
    for index, ((kind, _), value) in enumerate(zip(pieces, encoded)):
        if kind == "text":
            automata.append(dfa.exact(value, V))
            budget += len(value)
            continue
        following = encoded[index + 1][:1] if index + 1 < len(encoded) else []
        banned = list(eos) + list(following) + ([] if value in keeps_newline else newlines)
        automata.append(gap_dfa(value, gap_tokens, V, sorted(set(banned))))
        budget += int(gap_tokens[value.value][1])
    automata.append(dfa.exact([eos[0]], V))
    return dfa.concat(*automata), budget


def prompt_ids(document, tokenizer, cfg) -> list[int]:
    message = f"{cfg.instruction}\n\n{document.with_blanks('___')}"
    if cfg.model.chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": message}],
                                             tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(message + "\n\n")["input_ids"]


def _generation_config(cfg: DictConfig) -> dict:
    """The settings that decide the generations; a resumed run must agree on all of them."""
    return generation_config(cfg, GENERATION_KEYS)


def infill_item(story: str, index: int, p: float, target: float, methods, model, tokenizer, hmm,
                eos, newlines, cfg) -> dict:
    """Mask one passage, build its constraint and complete it with each method: its record."""
    import ctrlg
    from ctrlg.data import mask_document, mask_ratio

    data = cfg.data
    document = mask_document(story, p, cfg.seed * 7919 + index, data.max_ngram)
    constraint, budget = infill_constraint(document, tokenizer, cfg.gap_tokens, eos, newlines)
    budget = min(budget, int(cfg.generation.max_new_tokens_cap))
    prompt = prompt_ids(document, tokenizer, cfg)
    record = {"target_ratio": float(target), "p": p, "index": index,
              "mask_ratio": mask_ratio(document), "story": story,
              "blanked": document.with_blanks("___"),
              "granularities": [g.value for g in document.granularities],
              "dfa_states": constraint.num_states, "max_new_tokens": budget, "seconds": {}}
    for method in methods:
        start = time.perf_counter()
        results = ctrlg.generate(model, tokenizer, prompt, constraint,
                                 hmm=hmm if method == "ctrlg" else None,
                                 mode="ctrlg" if method == "ctrlg" else "logical",
                                 max_new_tokens=budget, num_samples=int(cfg.generation.num_samples),
                                 seed=cfg.seed * 100_003 + index,
                                 rank_by_lm=cfg.rerank != "none", do_sample=True,
                                 temperature=cfg.generation.temperature,
                                 precision=str(cfg.generation.get("precision", "float32")),
                                 top_p=cfg.generation.top_p, top_k=0)
        record["seconds"][method] = time.perf_counter() - start
        text = results[0].text.strip() if results else ""
        ok = bool(results) and constraint.accepts(results[0].token_ids)
        record[method] = {"text": text, "accepted": ok}
    return record


def score(records: list[dict], targets, methods) -> list[dict]:
    """One row per (mask ratio, method): BLEU-4 / ROUGE-L against the original story, success %,
    summed seconds; skipped items are left out."""
    from ctrlg import metrics

    rows = []
    for target in targets:
        done = [r for r in records if r["target_ratio"] == float(target) and "skipped" not in r]
        if not done:
            continue
        for method in methods:
            row = metrics.evaluate_generations([r[method]["text"] for r in done],
                                               [[r["story"]] for r in done],
                                               [r[method]["accepted"] for r in done],
                                               with_meteor=False)
            rows.append({"target_ratio": float(target),
                         "mask_ratio": 100 * sum(r["mask_ratio"] for r in done) / len(done),
                         "method": method, "bleu4": row["bleu4"], "rouge_l": row["rouge_l"],
                         "success": row["success"],
                         "seconds": sum(r["seconds"][method] for r in done)})
    return rows


def intervals(records: list[dict], targets, methods, boot) -> list[dict]:
    """Paired-bootstrap intervals (Koehn 2004, :func:`ctrlg.metrics.paired_bootstrap`) of
    ctrlg − ``boot.baseline`` for BLEU-4 and ROUGE-L, per mask ratio and over all passages of all
    ratios pooled (each passage of each ratio is one item); [] when a method is missing or
    ``boot.resamples`` is 0. Cost: ``resamples`` × two corpus re-scorings per row."""
    baseline = boot.baseline
    if not boot.resamples or baseline not in methods or "ctrlg" not in methods or baseline == "ctrlg":
        return []
    done = [r for r in records if "skipped" not in r]
    groups = [(float(t), [r for r in done if r["target_ratio"] == float(t)]) for t in targets]
    rows = []
    for target, group in [*groups, ("all", done)]:
        if not group:
            continue
        (ci,) = paired_intervals(group, [[r["story"]] for r in group], baseline, ["ctrlg"],
                                 METRICS, boot).values()
        rows.append({"target_ratio": target, "items": len(group),
                     "pair": f"ctrlg − {baseline}", **ci})
    return rows


def format_intervals(rows: list[dict], confidence: float) -> str:
    shown = [{"target_ratio": r["target_ratio"], "items": r["items"], "pair": r["pair"],
              **{m: interval_cell(r[m]) for m in METRICS}} for r in rows]
    return format_table(shown, ["target_ratio", "items", "pair", *METRICS],
                        ["target ratio", "passages", "paired bootstrap",
                         *(interval_header(m, confidence) for m in METRICS)])


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """The whole experiment; returns ``{"ratio/method": metrics}`` and writes the result files.

    Each finished passage is appended to ``generations.jsonl`` at once; ``resume=true`` (the
    newest earlier run with the same :data:`GENERATION_KEYS`) or ``resume=<run dir>`` continues
    an interrupted run; a passage whose constraint raises a :class:`ctrlg.errors.CtrlgError` is
    reported by ratio and index, recorded as skipped, and the others go on."""
    from ctrlg.data import calibrate_mask_probability, load_lambada_passages

    resume_dir = find_resume_dir(cfg, out_dir, _generation_config)
    methods = start_run(cfg, out_dir, METHODS)
    previous = read_records(resume_dir) if resume_dir is not None else []
    done = {(r["target_ratio"], r["index"]) for r in previous}
    data = cfg.data
    passages = load_lambada_passages(data.path, limit=data.offset + data.limit)
    calibration = passages[:data.calibration_docs]
    stories = passages[data.offset:data.offset + data.limit]
    model, tokenizer = load_lm(cfg.model)
    hmm = load_hmm(cfg.hmm, tokenizer) if "ctrlg" in methods else None
    eos = eos_token_ids(tokenizer, model)
    newlines = newline_tokens(tokenizer)

    records = list(previous)
    with RecordWriter(out_dir / "generations.jsonl", previous) as writer:
        for target in data.mask_ratios:
            p = calibrate_mask_probability(calibration, float(target), seed=cfg.seed,
                                           max_ngram=data.max_ngram, iterations=16)
            for index, story in enumerate(progress(stories, desc=f"infill {target:.0%}")):
                if (float(target), index) in done:
                    continue
                try:
                    record = infill_item(story, index, p, target, methods, model, tokenizer,
                                         hmm, eos, newlines, cfg)
                except InsufficientMemoryError:
                    raise                      # the run's settings, not this passage: stop
                except CtrlgError as error:
                    print(f"ratio {target} item {index}: skipped, {error}", file=sys.stderr)
                    record = {"target_ratio": float(target), "p": p, "index": index,
                              "story": story, "skipped": f"{type(error).__name__}: {error}"}
                writer.write(record)
                records.append(record)

    rows = score(records, data.mask_ratios, methods)
    skipped = [{"target_ratio": r["target_ratio"], "index": r["index"], "reason": r["skipped"]}
               for r in records if "skipped" in r]
    if not rows:
        raise ExperimentConfigError(f"all {len(records)} passages were skipped: "
                                    f"{skipped[0]['reason'] if skipped else 'no passages'}")
    boot = cfg.bootstrap
    cis = intervals(records, data.mask_ratios, methods, boot)
    write_json(out_dir / "metrics.json", {"stories": len(stories), "skipped": skipped,
                                          "rows": rows, "bootstrap": cis})
    print(f"Infilling ({len(stories)} LAMBADA passages per ratio, {len(skipped)} skipped, "
          f"K={cfg.generation.num_samples}) → {out_dir}")
    print(format_table(rows, ["mask_ratio", "method", "bleu4", "rouge_l", "success", "seconds"],
                       ["mask %", "method", "BLEU-4", "ROUGE-L", "success %", "time s"]))
    if cis:
        print(format_intervals(cis, float(boot.confidence)))
    return {f"{r['target_ratio']}/{r['method']}": r for r in rows}


@hydra.main(version_base=None, config_path="../configs", config_name="infill")
@report_errors
def main(cfg: DictConfig) -> None:
    run(cfg, hydra_output_dir())


if __name__ == "__main__":
    main()
