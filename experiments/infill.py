"""Text infilling as Ctrl-G ran it (§4.2, Table 2): ``python -m experiments.infill [overrides]``.

    python -m experiments.infill                                  # quick default (≤ 5 min, 2-core CPU)
    python -m experiments.infill data.limit=250                   # the full benchmark
    python -m experiments.infill ratios=[0.32] "methods=[logical,ilm,ctrlg]" data.path=stories.jsonl

Evaluation passages of the story corpus (:mod:`ctrlg.data.stories`: LAMBADA 4000–5152, never
trained on; ``data.path``: a JSONL of ``{"text": …}``) masked with ILM's mask function at each
target ratio of masked characters; methods ``ctrlg`` / ``logical`` (the story LM writes the whole
passage under the infilling constraint, with or without the HMM) and ``ilm`` (the ILM-style
supervised model): :mod:`ctrlg.tasks.infill.pipeline`. Each finished (passage, ratio) is appended
to ``generations.jsonl`` at once (``original``, ``masked``, ``mask_ratio``, per method ``{"text",
"accepted"}``); ``resume=true`` or ``resume=<run dir>`` continues a run with the same settings.
Prints BLEU-4 / ROUGE-L per ratio and method, ILM's mean ± sd over seeds, success and seconds per
passage, and paired bootstrap intervals of ctrlg − logical and ctrlg − ilm; ``metrics.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from ctrlg.errors import CtrlgError, ExperimentConfigError, InsufficientMemoryError
from ctrlg.tasks.config import generation_config, load_hmm, load_lm, resolve_weight_formats
from ctrlg.tasks.infill import pipeline
from ctrlg.tasks.record_files import RecordSchema
from ctrlg.tasks.records import RecordWriter, format_table, progress, read_records, write_json
from experiments.common import find_resume_dir, hydra_output_dir, report_errors, start_run

GENERATION_KEYS = ("seed", "methods", "ratios", "generation", "ilm", "model", "ilm_model", "hmm",
                   "data")


def _settings(cfg: DictConfig) -> dict:
    return generation_config(cfg, GENERATION_KEYS)


def _check(cfg: DictConfig) -> None:
    """Bad settings named before any model loads."""
    ratios = list(cfg.ratios)
    if not ratios or any(not 0 < float(r) < 1 for r in ratios):
        raise ExperimentConfigError(f"ratios must be mask ratios in (0, 1), got {ratios}")
    if int(cfg.generation.num_samples) < 1 or int(cfg.ilm.seeds) < 1:
        raise ExperimentConfigError("generation.num_samples and ilm.seeds must be ≥ 1")
    if not 0 < float(cfg.ilm.get("top_p", 1.0)) <= 1:
        raise ExperimentConfigError(f"ilm.top_p must lie in (0, 1], got {cfg.ilm.top_p}")


def _passages(cfg: DictConfig):
    from ctrlg.data.stories import load_stories

    stories = load_stories(str(cfg.data.split), cfg.data.path, offset=int(cfg.data.offset), limit=cfg.data.limit)
    if not stories:
        raise ExperimentConfigError(f"data.offset={cfg.data.offset}, data.limit={cfg.data.limit}: "
                                    "no passage selected")
    pipeline.check_passages([s.text for s in stories], [s.index for s in stories],
                            str(cfg.data.path or "the story corpus"))
    return stories


def _warn_if_missed(target: float, calibration: pipeline.MaskCalibration) -> None:
    """A warning when the calibrated masks still miss the target ratio by more than a point after
    every draw (very few passages: ILM's masks take whole units, so the mean ratio moves in steps)."""
    if abs(calibration.reached - target) > pipeline.RATIO_TOLERANCE:
        print(f"ratio {target:.0%}: the masks of the selected passages cover {calibration.reached:.1%} "
              f"of their characters, not {target:.0%}, after {calibration.draws} draws (ILM's masks "
              f"take whole units); more passages (data.limit) bring the mean closer", file=sys.stderr)


def _check_resumed_masks(previous: list[dict], masks: dict) -> None:
    """ExperimentConfigError when a resumed run's records were masked otherwise than this run masks
    the same passages (a run started before the masks' redraws, whose calibration had missed):
    one run holds one draw of masks."""
    for record in previous:
        drawn = masks.get(float(record["target_ratio"]))
        if drawn is not None and "p" in record and float(record["p"]) != drawn.p:
            raise ExperimentConfigError(
                f"resume: ratio {record['target_ratio']} passage {record['index']} was masked with "
                f"p = {record['p']}, this run masks with p = {drawn.p} (draw {drawn.draws}); "
                f"start afresh, or take that ratio from a new run (benchmarks.merge_infill RUN@ratios)")


def record_schema(stories, methods) -> RecordSchema:
    """What a record of this run must be to be resumed: keyed by (target ratio, passage index),
    the selected passage's own text, and (unless it was skipped) every method's output."""
    originals = {s.index: s.text for s in stories}

    def check(record: dict) -> str | None:
        if originals.get(record["index"]) != record["original"]:
            return f"passage {record['index']}'s text is not the selected passage's"
        if "skipped" in record:
            return None
        missing = [m for m in methods if not isinstance(record.get(m), dict) or "text" not in record[m]]
        return f"a record without the output of {', '.join(missing)}" if missing else None

    return RecordSchema(fields={"target_ratio": float, "index": int, "original": str},
                        key=("target_ratio", "index"), check=check)


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """The experiment (module docstring); returns ``{"ratio/method": row}``."""
    _check(cfg)
    resolve_weight_formats(cfg, ("model", "ilm_model"))    # bf16_weights: auto → what it is here
    stories = _passages(cfg)
    resume_dir = find_resume_dir(cfg, out_dir, _settings)
    methods = start_run(cfg, out_dir, pipeline.METHODS)
    schema = record_schema(stories, methods)
    selection = [(float(t), s.index) for t in cfg.ratios for s in stories]
    previous = (read_records(resume_dir, schema=schema, selection=selection)
                if resume_dir is not None else [])
    done = {(r["target_ratio"], r["index"]) for r in previous}
    texts = [s.text for s in stories]
    masks = {}
    for target in cfg.ratios:
        calibration = pipeline.calibrate_masks(texts, float(target), int(cfg.seed), int(cfg.data.max_ngram))
        _warn_if_missed(float(target), calibration)
        masks[float(target)] = calibration
    _check_resumed_masks(previous, masks)
    story_lm = ilm_lm = hmm = None
    if {"ctrlg", "logical"} & set(methods):
        story_lm = load_lm(cfg.model)
        hmm = load_hmm(cfg.hmm, story_lm[1]) if "ctrlg" in methods else None
    if "ilm" in methods:
        ilm_lm = load_lm(cfg.ilm_model)
    tokenizer = (story_lm or ilm_lm)[1]
    eos = tokenizer.eos_token_id
    records = list(previous)
    with RecordWriter(out_dir / "generations.jsonl", previous, schema=schema,
                      selection=selection) as writer:
        for target, calibration in masks.items():
            for position, (story, document) in progress(list(enumerate(zip(stories, calibration.documents))),
                                                         desc=f"infill {target:.0%}"):
                if (target, story.index) in done:
                    continue
                try:
                    record = _item(story, document, target, calibration.p, calibration.seed + position,
                                   methods, story_lm, ilm_lm, hmm, eos, cfg)
                except InsufficientMemoryError:
                    raise
                except CtrlgError as error:
                    print(f"ratio {target} passage {story.index}: skipped, {error}", file=sys.stderr)
                    record = {"target_ratio": target, "index": story.index, "original": story.text,
                              "skipped": f"{type(error).__name__}: {error}"}
                writer.write(record)
                records.append(record)
    return report(cfg, records, methods, out_dir)


def _item(story, document, target, p, mask_seed, methods, story_lm, ilm_lm, hmm, eos, cfg) -> dict:
    from ctrlg.data.infill_mask import mask_ratio

    record = {"target_ratio": target, "p": p, "mask_seed": mask_seed, "index": story.index, "original": story.text,
              "masked": document.with_blanks("___"), "mask_ratio": mask_ratio(document),
              "granularities": [g.value for g in document.granularities], "seconds": {}}
    seed = int(cfg.seed) * 100_003 + story.index
    gen = cfg.generation
    for method in ("logical", "ctrlg"):
        if method in methods:
            model, tokenizer = story_lm
            out = pipeline.guided_completion(
                model, tokenizer, document, hmm=hmm if method == "ctrlg" else None,
                eos_token_id=eos, num_samples=int(gen.num_samples), seed=seed,
                temperature=float(gen.temperature), strength=float(gen.strength),
                precision=str(gen.precision), bos_token=cfg.model.bos_token)
            record[method] = {"text": out.text, "accepted": out.accepted}
            record["seconds"][method] = out.seconds
    if "ilm" in methods:
        from ctrlg.tasks.infill.constraint import build_constraint

        model, tokenizer = ilm_lm
        budget = build_constraint(document, tokenizer, len(tokenizer), eos).budget
        fills = pipeline.ilm_completions(model, tokenizer, document, samples=int(cfg.ilm.seeds),
                                         seed=seed, max_new_tokens=budget,
                                         temperature=float(cfg.ilm.temperature),
                                         top_p=float(cfg.ilm.get("top_p", 1.0)), eos_ids=[eos])
        record["ilm_seeds"] = [{"text": f.text, "accepted": f.accepted} for f in fills]
        record["ilm"] = record["ilm_seeds"][0]
        record["seconds"]["ilm"] = fills[0].seconds
    return record


def report(cfg, records, methods, out_dir: Path) -> dict:
    """Scores, intervals and tables of ``records`` (printed; ``metrics.json`` in ``out_dir``)."""
    ratios = [float(r) for r in cfg.ratios]
    rows = pipeline.score_rows(records, ratios, methods)
    skipped = [{"target_ratio": r["target_ratio"], "index": r["index"], "reason": r["skipped"]}
               for r in records if "skipped" in r]
    if not rows:
        raise ExperimentConfigError(f"all {len(records)} passages were skipped: "
                                    f"{skipped[0]['reason'] if skipped else 'no passages'}")
    boot = cfg.bootstrap
    cis = pipeline.interval_rows(records, ratios, methods, list(boot.baselines), int(boot.resamples),
                                 int(boot.seed), float(boot.confidence))
    write_json(out_dir / "metrics.json", {"rows": rows, "bootstrap": cis, "skipped": skipped})
    shown = [{**r, "bleu4": _cell(r, "bleu4"), "rouge_l": _cell(r, "rouge_l")} for r in rows]
    print(f"Infilling → {out_dir} ({len(skipped)} skipped)")
    print(format_table(shown, ["target_ratio", "mask_ratio", "passages", "method", "bleu4", "rouge_l",
                               "success", "seconds"],
                       ["target", "masked chars %", "passages", "method", "BLEU-4", "ROUGE-L",
                        "success %", "s / passage"]))
    if cis:
        cells = [{"target_ratio": c["target_ratio"], "passages": c["passages"], "pair": c["pair"],
                  **{m: f"{c[m]['delta']:+.2f} [{c[m]['low']:+.2f}, {c[m]['high']:+.2f}]"
                     for m in pipeline.METRICS}} for c in cis]
        print(format_table(cells, ["target_ratio", "passages", "pair", *pipeline.METRICS],
                           ["target", "passages", "paired bootstrap", "BLEU-4 (95 % CI)",
                            "ROUGE-L (95 % CI)"]))
    return {f"{r['target_ratio']}/{r['method']}": r for r in rows}


def _cell(row: dict, metric: str) -> str:
    if f"{metric}_sd" in row:
        return f"{row[metric]:.2f} ± {row[metric + '_sd']:.2f}"
    return f"{row[metric]:.2f}"


@hydra.main(version_base=None, config_path="../configs", config_name="infill")
@report_errors
def main(cfg: DictConfig) -> None:
    run(cfg, hydra_output_dir())


if __name__ == "__main__":
    main()
