"""Interactive text editing as Ctrl-G measured it (§5, Table 3): ``python -m experiments.edit``.

    python -m experiments.edit                                  # quick default
    python -m experiments.edit data.limit=200                   # the benchmark (800 examples)
    python -m experiments.edit data.offset=10 data.limit=10     # a shard (benchmarks.merge_edit)
    python -m experiments.edit "methods=[prompt_only,logical,ctrlg]" data.path=stories.jsonl

Examples are cut from evaluation passages of the story corpus (:mod:`ctrlg.tasks.edit.examples`:
one span per passage, insert or continue, each constraint kind none / K / L / K&L); the methods
(:mod:`ctrlg.tasks.edit.methods`) run on the editing LM and HMM; the outputs are scored
independently (:mod:`ctrlg.tasks.edit.scoring`), beside two sanity rows: the reference spans and
the same spans with their words shuffled. ``generations.jsonl`` holds one record per example
(``operation``, ``kind``, ``prefix``, ``suffix``, ``reference``, ``keyphrases``, ``min_words``,
``max_words`` and per method ``{"text", "accepted"}`` with its scores); ``resume=true`` continues
a run with the same settings, keeping the first complete record of each selected example
(:func:`record_schema`; any other line is set aside with its reason). Prints the Table-3 shape
(rows = methods, columns = kind × quality / success / overall) and writes ``metrics.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig

from ctrlg.errors import CtrlgError, ExperimentConfigError, InsufficientMemoryError
from ctrlg.tasks.config import generation_config, load_hmm, load_lm
from ctrlg.tasks.edit import report
from ctrlg.tasks.edit.examples import KINDS, build_examples
from ctrlg.tasks.edit.methods import METHODS, run_method
from ctrlg.tasks.edit.scoring import Scorer, constraints_met, repetition
from ctrlg.tasks.record_files import RecordSchema, missing_seconds
from ctrlg.tasks.records import RecordWriter, progress, read_records, write_json
from experiments.common import find_resume_dir, hydra_output_dir, report_errors, start_run

GENERATION_KEYS = ("seed", "methods", "generation", "model", "hmm", "scorer", "data", "kinds")


def _settings(cfg: DictConfig) -> dict:
    return generation_config(cfg, GENERATION_KEYS)


def _examples(cfg: DictConfig):
    """(every example of passages 0 … offset + limit − 1, the indices of the shard's own, the
    shard's passages without a span). The examples before the shard are built (no model runs) so
    that a shard's indices, operations, sampling seeds and shuffled sanity rows are those of the
    same examples in one run over every passage: shards merge into that run
    (``benchmarks.merge_edit``)."""
    from ctrlg.data.stories import load_stories

    kinds = list(cfg.kinds)
    if not kinds or set(kinds) - set(KINDS):
        raise ExperimentConfigError(f"kinds must be a non-empty subset of {list(KINDS)}, got {kinds}")
    offset, limit = int(cfg.data.offset), cfg.data.limit
    if offset < 0:
        raise ExperimentConfigError(f"data.offset must be >= 0, got {offset}")
    stories = load_stories(str(cfg.data.split), cfg.data.path, offset=0,
                           limit=None if limit is None else offset + int(limit))
    shard = {story.index for story in stories[offset:]}
    examples, skipped = build_examples(stories, int(cfg.seed), kinds)
    selection = {i for i, example in enumerate(examples) if example.passage in shard}
    if not selection:
        raise ExperimentConfigError(f"no passage of {cfg.data.path or 'the story corpus'} "
                                    f"(offset {cfg.data.offset}, limit {cfg.data.limit}) has a span "
                                    "of whole sentences to cut")
    return examples, selection, [p for p in skipped if p in shard]


def _scored(scorer: Scorer, example, text: str) -> dict:
    fluency, coherence = scorer.nll(example.prefix, text, example.suffix)
    distinct2, repeated3 = repetition(example.prefix, text)
    return {"fluency": fluency, "coherence": coherence, "distinct2": distinct2,
            "repeated3": repeated3, "success": constraints_met(example, text)}


SCORES = ("fluency", "coherence", "distinct2", "repeated3", "success")
NONE = type(None)


def _output_problem(name: str, output, accepted: bool) -> str | None:
    """Why ``output`` is not a scored output ``{"text", ("accepted",) "fluency", …}`` as
    :func:`_scored` writes it, or None."""
    if not isinstance(output, dict) or not isinstance(output.get("text"), str):
        return f"no output {{'text': ...}} of {name!r}"
    if accepted and not isinstance(output.get("accepted"), bool):
        return f"{name!r}'s output has no 'accepted' flag"
    missing = [k for k in SCORES if k not in output]
    return f"{name!r}'s output lacks its scores {missing}" if missing else None


def record_schema(examples, methods) -> RecordSchema:
    """What a record of this run must be to be resumed: keyed by the example's ``index`` (an
    int), the selected example's own fields (its passage, operation, kind, prefix, suffix,
    reference, keyphrases and word range: a record of another example under the same index, of
    another data file or seed, is refused), and either ``skipped`` (a reason) or the reference's
    scores, the shuffled sanity row and every method's scored output ``{"text", "accepted",
    …}`` with its seconds."""
    own = {index: example.record() for index, example in enumerate(examples)}

    def check(record: dict) -> str | None:
        if record["index"] not in own:
            return None                              # the selection names it
        wanted = own[record["index"]]
        differing = [k for k, v in wanted.items() if record.get(k, NONE) != v]
        if differing:
            return (f"its {', '.join(differing)} differ from example {record['index']}'s (another "
                    f"data file or seed?)")
        if "skipped" in record:
            return None if isinstance(record["skipped"], str) else "'skipped' is not a reason"
        scores = record.get("reference_scores")
        if not isinstance(scores, dict) or [k for k in SCORES if k not in scores]:
            return "no scores of the reference ('reference_scores')"
        problem = _output_problem("shuffled", record.get("shuffled"), accepted=False)
        for method in methods:
            problem = problem or _output_problem(method, record.get(method), accepted=True)
        return problem or missing_seconds(record, methods)

    fields = {"index": int, "passage": int, "operation": str, "kind": str, "prefix": str,
              "suffix": str, "reference": str, "keyphrases": list, "min_words": (int, NONE),
              "max_words": (int, NONE)}
    return RecordSchema(fields=fields, check=check)


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """The experiment (module docstring); returns the report's rows."""
    examples, selection, skipped = _examples(cfg)
    resume_dir = find_resume_dir(cfg, out_dir, _settings)
    methods = start_run(cfg, out_dir, METHODS)
    schema = record_schema(examples, methods)
    previous = (read_records(resume_dir, schema=schema, selection=selection)
                if resume_dir is not None else [])
    done = {r["index"] for r in previous}
    model, tokenizer = load_lm(cfg.model)
    hmm = load_hmm(cfg.hmm, tokenizer) if "ctrlg" in methods else None
    scorer = Scorer(*load_lm(cfg.scorer), bos_token=cfg.model.bos_token)
    eos = tokenizer.eos_token_id
    gen = cfg.generation
    records = list(previous)
    rng = np.random.default_rng(int(cfg.seed))
    with RecordWriter(out_dir / "generations.jsonl", previous, schema=schema,
                      selection=selection) as writer:
        for index, example in enumerate(progress(examples, desc="edit")):
            shuffled_words = example.reference.split()
            rng.shuffle(shuffled_words)        # for every example, in order: shards draw alike
            if index in done or index not in selection:
                continue
            record = {"index": index, **example.record(), "seconds": {}}
            record["reference_scores"] = _scored(scorer, example, example.reference)
            shuffled = " " + " ".join(shuffled_words)
            record["shuffled"] = {"text": shuffled, **_scored(scorer, example, shuffled)}
            try:
                for method in methods:
                    out = run_method(method, example, model, tokenizer, hmm=hmm, eos_id=eos,
                                     num_samples=int(gen.num_samples),
                                     max_new_tokens=int(gen.max_new_tokens),
                                     seed=int(cfg.seed) * 100_003 + index,
                                     bos_token=cfg.model.bos_token,
                                     suffix_tokens=int(gen.suffix_tokens),
                                     precision=str(gen.precision),
                                     temperature=float(gen.temperature), top_p=float(gen.top_p),
                                     strength=float(gen.strength))
                    record[method] = {"text": out.text, "accepted": out.accepted,
                                      **_scored(scorer, example, out.text)}
                    record["seconds"][method] = out.seconds
            except InsufficientMemoryError:
                raise
            except CtrlgError as error:
                print(f"example {index} (passage {example.passage}, {example.kind}): skipped, "
                      f"{error}", file=sys.stderr)
                record = {"index": index, **example.record(),
                          "skipped": f"{type(error).__name__}: {error}"}
            writer.write(record)
            records.append(record)
    result = report.summarise(records, methods, list(cfg.kinds), int(cfg.bootstrap.resamples),
                              int(cfg.bootstrap.seed))
    result["skipped_passages"] = skipped
    write_json(out_dir / "metrics.json", result)
    print(f"Editing → {out_dir} ({len(records)} examples, {len(skipped)} passages without a span, "
          f"{len(result['skipped_examples'])} examples skipped)")
    print(report.format_report(result))
    return result


@hydra.main(version_base=None, config_path="../configs", config_name="edit")
@report_errors
def main(cfg: DictConfig) -> None:
    run(cfg, hydra_output_dir())


if __name__ == "__main__":
    main()
