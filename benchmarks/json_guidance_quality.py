"""Guided JSON against logical masking on JSONSchemaBench schemas: the LM's likelihood of the
documents each produces, with the lazy guide's horizon as the only approximation varied.

    python -m benchmarks.json_guidance_quality --data /path/to/jsonschemabench/data \\
        [--category Glaiveai2K] [--schemas 30] [--seed 0] [--samples 4] [--max-new-tokens 128]
        [--modes logical,tables,h4,h8,h8r32] [--hmm default] [--reference h4]
        [--out benchmarks/results/json_guidance_quality.json]
    python -m benchmarks.json_guidance_quality --rescore SAVED.json --reference h4 --out OUT.json

A seeded sample of ``--schemas`` schemas of one JSONSchemaBench category (those the lazy compiler
takes, whose text fits ``--max-schema-chars``). Each is a chat prompt to the embedded
SmolLM2-135M-Instruct ("Write a JSON object that matches this JSON Schema: …"), and
:func:`ctrlg.generate` samples ``--samples`` documents (seed ``--seed``, ``--max-new-tokens``)
under the lazy automaton (:func:`ctrlg.dfa.lazy_json_schema`, exact budget masks), in the
``--modes``:

* **logical**: the exact masks alone (``mode="logical"``, ``horizon=`` so nothing is built
  before the first token);
* **tables**: Ctrl-G exactly, the tables over every state the budget reaches (the processor
  without ``horizon``);
* **hH** / **hHrM** / **hHfF** / **hHrMfF**: Ctrl-G with the lazy guide's horizon H
  (:mod:`ctrlg.guide.horizon`), regions of at most M states (default
  :data:`ctrlg.guide.horizon.MAX_REGION_STATES`) and a first token's horizon F (default H).

Ctrl-G modes use the HMM ``--hmm`` (an embedded name, ``default``, or a checkpoint folder).

``--write-prompts FILE`` instead writes the training prompts of a JSON HMM
(``configs/distill_json.yaml``): one line per schema of every category (text at most
``--max-schema-chars``, seeded order, at most ``--prompt-limit``), the instruction then the
schema after a space (the evaluation's blank line would split the line), leaving out the
schemas that the evaluation samples of ``--exclude-seeds`` pick.

Per document: log p_lm(y | prompt) (EOS included, as :func:`ctrlg.generate` reranks), its
tokens, whether it ended with EOS before the budget (a budget-forced ending closes whatever was
open), and ``jsonschema`` validity. Per mode: the means over schemas of the per-schema means,
and paired bootstrap intervals (schemas resampled) of each ctrlg mode minus logical, and with
``--reference MODE`` minus that mode too. ``--rescore`` summarises a saved run again (its rows;
nothing is generated).
"""

from __future__ import annotations

import argparse
import json
import random
import time
import warnings
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
INSTRUCTION = "Write a JSON object that matches this JSON Schema. Answer with the JSON only.\n\n"


def _pick_schemas(args, tok):
    from ctrlg import dfa
    from ctrlg.dfa.lazy import LazyTokenDFA

    files = sorted((args.data / args.category).glob("*.json"))
    random.Random(args.seed).shuffle(files)
    picked = []
    for f in files:
        text = f.read_text()
        if len(text) > args.max_schema_chars:
            continue
        schema = json.loads(text)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                d = dfa.lazy_json_schema(schema, tok)
        except Exception:      # refused (unsupported keyword, unsatisfiable, ...)
            continue
        if isinstance(d, LazyTokenDFA):
            picked.append((f.name, schema, d))
        if len(picked) == args.schemas:
            break
    return picked


def _write_prompts(args) -> None:
    from ctrlg.lm.models import load_tokenizer

    tok = load_tokenizer()
    excluded = set()
    for seed in [int(x) for x in args.exclude_seeds.split(",") if x]:
        sample = argparse.Namespace(**{**vars(args), "seed": seed})
        excluded |= {name for name, _, _ in _pick_schemas(sample, tok)}
    files = sorted(f for c in sorted(args.data.iterdir()) if c.is_dir() for f in c.glob("*.json"))
    random.Random(args.seed).shuffle(files)
    lines = []
    for f in files:
        text = f.read_text()
        if f.name in excluded or len(text) > args.max_schema_chars:
            continue
        try:
            lines.append(INSTRUCTION.strip() + " " + json.dumps(json.loads(text)))   # one line
        except ValueError:
            continue
        if len(lines) == args.prompt_limit:
            break
    args.write_prompts.parent.mkdir(parents=True, exist_ok=True)
    args.write_prompts.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} prompts to {args.write_prompts} ({len(excluded)} schemas left out)")


def _mode_options(mode: str, hmm) -> dict:
    """generate()'s options for a mode name (module docstring)."""
    from ctrlg.guide.horizon import MAX_REGION_STATES

    if mode == "logical":
        return {"mode": "logical", "hmm": None, "horizon": 1}
    if mode == "tables":
        return {"hmm": hmm}
    if not mode.startswith("h"):
        raise ValueError(f"unknown mode {mode!r}")
    rest, _, first = mode[1:].partition("f")
    horizon, _, states = rest.partition("r")
    return {"hmm": hmm, "horizon": int(horizon),
            "max_region_states": int(states) if states else MAX_REGION_STATES,
            "first_horizon": int(first) if first else None}


def _bootstrap(diffs: np.ndarray, resamples: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    means = [diffs[rng.integers(0, len(diffs), len(diffs))].mean() for _ in range(resamples)]
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def _other_reference(reference: str | None) -> str | None:
    """The ``--reference`` mode when it is not logical masking (always a baseline)."""
    return reference if reference and reference != "logical" else None


def _print_summary(summary: dict, reference: str | None) -> None:
    ref = _other_reference(reference)
    print("| mode | schemas | log p_lm per token | minus logical (95 % CI) | "
          + (f"minus {ref} (95 % CI) | " if ref else "") + "ended by EOS | tokens | valid | "
          "s per schema |")
    print("|---" * (8 + bool(ref)) + "|")
    for m, s in summary.items():
        cells = []
        for base in ["logical"] + ([ref] if ref else []):
            key = f"loglik_per_token_minus_{base}"
            cells.append("" if key not in s else f"{s[key]:+.3f} [{s[key + '_ci95'][0]:+.3f}, "
                                                 f"{s[key + '_ci95'][1]:+.3f}]")
        print(f"| {m} | {s['schemas']} | {s['loglik_per_token']:.3f} | " + " | ".join(cells)
              + f" | {100 * s['ended']:.0f} % | {s['tokens']:.1f} | {100 * s['valid']:.0f} % | "
              f"{s['seconds_per_schema']:.1f} |")


def _rescore(args) -> None:
    """--rescore: the saved run's rows summarised again (with --reference), nothing generated."""
    saved = json.loads(args.rescore.read_text())
    modes = [m for m in saved["rows"][0] if m != "file"]
    saved["summary"] = summarise(saved["rows"], modes, args.reference, args.resamples, args.seed)
    saved["rescored"] = f"--rescore --reference {args.reference}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(saved, indent=1, ensure_ascii=False))
    _print_summary(saved["summary"], args.reference)


def summarise(rows: list[dict], modes: list[str], reference: str | None, resamples: int,
              seed: int) -> dict:
    """Per mode: means over schemas of the per-schema means, and paired bootstrap intervals
    (schemas resampled) of each mode minus logical masking and, with ``reference``, minus that
    mode (log p_lm per token and the share ended by EOS)."""
    summary, per_schema = {}, {}
    for m in modes:
        keep = [r for r in rows if r[m]["docs"]]
        per_schema[m] = {r["file"]: {
            "loglik_per_token": float(np.mean([x["loglik"] / x["tokens"] for x in r[m]["docs"]])),
            "loglik": float(np.mean([x["loglik"] for x in r[m]["docs"]])),
            "tokens": float(np.mean([x["tokens"] for x in r[m]["docs"]])),
            "ended": float(np.mean([x["ended"] for x in r[m]["docs"]])),
            "valid": float(np.mean([x["valid"] for x in r[m]["docs"]]))} for r in keep}
        vals = per_schema[m].values()
        summary[m] = {k: float(np.mean([v[k] for v in vals])) for k in
                      ("loglik_per_token", "loglik", "tokens", "ended", "valid")}
        summary[m]["schemas"] = len(keep)
        summary[m]["seconds_per_schema"] = float(np.mean([r[m]["seconds"] for r in rows]))
    ref = _other_reference(reference)
    baselines = ["logical"] + ([ref] if ref else [])
    for base in baselines:
        for m in modes:
            if m in ("logical", base):
                continue
            both = sorted(set(per_schema[m]) & set(per_schema[base]))
            for k in ("loglik_per_token", "ended"):
                diffs = np.array([per_schema[m][f][k] - per_schema[base][f][k] for f in both])
                summary[m][f"{k}_minus_{base}"] = float(diffs.mean())
                summary[m][f"{k}_minus_{base}_ci95"] = _bootstrap(diffs, resamples, seed)
    return summary


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=None, help="JSONSchemaBench's data folder")
    p.add_argument("--category", default="Glaiveai2K")
    p.add_argument("--schemas", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-schema-chars", type=int, default=1500)
    p.add_argument("--modes", default="logical,tables,h4,h8,h8r32")
    p.add_argument("--hmm", default="default")
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--out", type=Path, default=RESULTS / "json_guidance_quality.json")
    p.add_argument("--write-prompts", type=Path, default=None)
    p.add_argument("--prompt-limit", type=int, default=4096)
    p.add_argument("--exclude-seeds", default="0,1")
    p.add_argument("--reference", default=None,
                   help="a mode: also intervals of each other mode minus this one")
    p.add_argument("--rescore", type=Path, default=None,
                   help="recompute the summary of a saved run (its rows) and write it to --out")
    args = p.parse_args(argv)
    if args.rescore is not None:
        _rescore(args)
        return
    if args.data is None:
        p.error("--data is required (JSONSchemaBench's data folder)")
    if args.write_prompts is not None:
        _write_prompts(args)
        return

    import jsonschema

    import ctrlg
    from ctrlg import HMM
    from ctrlg.hmm import load_default_hmm, load_embedded_hmm
    from ctrlg.lm.models import load_model, load_tokenizer

    tok = load_tokenizer()
    model = load_model().eval()
    if args.hmm == "default":
        hmm = load_default_hmm(tokenizer=tok)
    elif Path(args.hmm).is_dir():                  # a checkpoint folder (experiments.distill)
        hmm = HMM.load(args.hmm, tokenizer=tok)
    else:
        hmm = load_embedded_hmm(args.hmm, tokenizer=tok)
    modes = [m for m in args.modes.split(",") if m]
    if "logical" not in modes:
        p.error("--modes must include logical (the baseline of the intervals)")
    schemas = _pick_schemas(args, tok)
    rows = []
    start = time.perf_counter()
    for name, schema, d in schemas:
        messages = [{"role": "user", "content": INSTRUCTION + json.dumps(schema)}]
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        row = {"file": name}
        for mode in modes:
            t0 = time.perf_counter()
            outs = ctrlg.generate(model, tok, prompt, d, max_new_tokens=args.max_new_tokens,
                                  num_samples=args.samples, seed=args.seed, precision="float32",
                                  **_mode_options(mode, hmm))
            docs = []
            for g in outs:
                ended = g.token_ids[-1] == tok.eos_token_id and len(g.token_ids) < args.max_new_tokens
                try:
                    jsonschema.validate(json.loads(g.text), schema)
                    valid = True
                except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
                    valid = False
                docs.append({"text": g.text, "tokens": len(g.token_ids), "ended": bool(ended),
                             "valid": valid, "loglik": g.lm_log_likelihood})
            row[mode] = {"seconds": time.perf_counter() - t0, "docs": docs}
        rows.append(row)
        print(f"{name}: " + "  ".join(
            f"{m} {np.mean([x['loglik'] / x['tokens'] for x in row[m]['docs']]):.2f}/tok"
            for m in modes if row[m]["docs"]), flush=True)
    summary = summarise(rows, modes, args.reference, args.resamples, args.seed)
    out = {"command": "python -m benchmarks.json_guidance_quality " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("data", "out")),
           "wall_s": time.perf_counter() - start, "summary": summary, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False))
    _print_summary(summary, args.reference)

if __name__ == "__main__":
    main()
