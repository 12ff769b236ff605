"""Grammar constraints with the embedded LM: Ctrl-G guidance vs logical masking.

The example grammars (:mod:`ctrlg.dfa.cfg.examples`: arithmetic with nested parentheses, a SQL
SELECT subset, recursive lists, JSON) compiled with ``dfa.grammar`` for SmolLM2-135M-Instruct
(:func:`ctrlg.lm.models.load_model`) and the embedded HMM (:func:`ctrlg.hmm.load_default_hmm`).
Both modes use the same chat prompts, seed and token budget; Ctrl-G's tables are built over the
grammar's regular superset and the exact grammar mask is applied after (docs/grammar.md).
Reported per grammar and mode: the share of outputs that the ``lark`` library parses (its default
Earley parser), the LM log-likelihood per token, sampling and beam search, and the time spent in
the logits processor against the rest of ``generate`` (the LM, in the same process).
Also counted: the generations whose masks left a token undecided (an exact search past
``max_expansions``, :mod:`ctrlg.guide.grammar_masks`; the mask stays sound).

    python -m benchmarks.demo_grammar [--samples 4] [--max-new-tokens 48] [--beams 4]
        [--constraint lazy_grammar] [--prompts FILE] [--modes ctrlg]

``--constraint lazy_grammar`` compiles with ``dfa.lazy_grammar`` instead: the SQL subset becomes
a lazy automaton, the self-embedding grammars the Earley-driven constraint over the one-level
superset R_1 (so Ctrl-G's look-ahead sees less of the grammar than ``dfa.grammar``'s deeper one).

Writes benchmarks/results/demo_grammar.json.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

PROMPTS = {
    "arithmetic": ["Write an arithmetic expression with nested parentheses that equals 10.",
                   "Write a long arithmetic expression using +, * and parentheses."],
    "sql": ["Write a SQL query that selects the names of users older than 30 from the table "
            "users.", "Write a SQL query that lists every column of the table orders."],
    "lists": ["Write a nested list of fruits and vegetables, like [apple, [carrot, pea]].",
              "Write a list of three animals, each with a list of its foods."],
    "json": ["Describe a book as a JSON object with a title, an author and a year.",
             "Give a JSON list of two cities, each an object with a name and a population."],
}


class ProcessorClock:
    """Seconds spent in ``ConstraintLogitsProcessor.__call__`` while installed."""

    def __init__(self, cls):
        self.cls, self.seconds, self.original = cls, 0.0, cls.__call__

    def __enter__(self):
        clock = self

        def timed(proc, input_ids, scores):
            t0 = time.perf_counter()
            try:
                return clock.original(proc, input_ids, scores)
            finally:
                clock.seconds += time.perf_counter() - t0
        self.cls.__call__ = timed
        return self

    def __exit__(self, *exc):
        self.cls.__call__ = self.original


def run_mode(ctx, name, constraint, mode, args) -> dict:
    import lark

    import ctrlg
    import ctrlg.sampler

    parser = lark.Lark(ctx.examples[name], parser="earley")
    rows, t0 = [], time.perf_counter()
    with ProcessorClock(ctrlg.sampler.ConstraintLogitsProcessor) as clock, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for prompt_text in ctx.prompts[name]:
            messages = [{"role": "user", "content": prompt_text}]
            prompt = ctx.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            for search, kw in (("sampling", dict(num_samples=args.samples)),
                               ("beams", dict(num_samples=args.beams, num_beams=args.beams))):
                results = ctrlg.generate(ctx.model, ctx.tok, prompt, constraint,
                                         hmm=ctx.hmm if mode == "ctrlg" else None, mode=mode,
                                         max_new_tokens=args.max_new_tokens, seed=args.seed, **kw)
                for r in results:
                    try:
                        parser.parse(r.text)
                        parses = True
                    except lark.exceptions.LarkError:
                        parses = False
                    rows.append({"prompt": prompt_text, "search": search, "text": r.text,
                                 "parses": parses, "tokens": len(r.token_ids),
                                 "lm_log_likelihood_per_token":
                                     r.lm_log_likelihood / max(len(r.token_ids), 1)})
    elapsed = time.perf_counter() - t0
    n = max(len(rows), 1)
    summary = {"outputs": len(rows), "parse_rate": sum(r["parses"] for r in rows) / n,
               "mean_lm_log_likelihood_per_token":
                   sum(r["lm_log_likelihood_per_token"] for r in rows) / n,
               "seconds": elapsed, "processor_seconds": clock.seconds,
               "generations_with_undecided_tokens": sum("max_expansions" in str(w.message)
                                                        for w in caught),
               "processor_over_rest": clock.seconds / max(elapsed - clock.seconds, 1e-9)}
    return {"summary": summary, "results": rows}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grammars", nargs="+", default=list(PROMPTS))
    parser.add_argument("--constraint", choices=("grammar", "lazy_grammar"), default="grammar",
                        help="compile with dfa.grammar (default) or dfa.lazy_grammar")
    parser.add_argument("--prompts", type=Path, default=None,
                        help="a JSON file {grammar: [prompt, ...]} instead of the built-in prompts")
    parser.add_argument("--modes", nargs="+", choices=("ctrlg", "logical"),
                        default=["ctrlg", "logical"])
    parser.add_argument("--out", default="benchmarks/results/demo_grammar.json")
    args = parser.parse_args(argv)

    from types import SimpleNamespace

    import torch

    from ctrlg import dfa
    from ctrlg.dfa.cfg.examples import EXAMPLES
    from ctrlg.hmm import load_default_hmm
    from ctrlg.lm.models import load_model, load_tokenizer

    tok = load_tokenizer()
    ctx = SimpleNamespace(tok=tok, model=load_model().eval(), hmm=load_default_hmm(tokenizer=tok),
                          examples=EXAMPLES,
                          prompts=json.loads(args.prompts.read_text()) if args.prompts else PROMPTS)
    report = {"constraint": args.constraint, "prompts": str(args.prompts or "built-in"),
              "max_new_tokens": args.max_new_tokens,
              "samples": args.samples,
              "beams": args.beams, "torch_threads": torch.get_num_threads(), "grammars": {}}
    compile_fn = dfa.grammar if args.constraint == "grammar" else dfa.lazy_grammar
    for name in args.grammars:
        t0 = time.perf_counter()
        constraint = compile_fn(EXAMPLES[name], tok, vocab_size=ctx.hmm.vocab_size)
        entry = {"constraint": repr(constraint), "compile_s": time.perf_counter() - t0,
                 "modes": {}}
        for mode in args.modes:
            entry["modes"][mode] = run_mode(ctx, name, constraint, mode, args)
            s = entry["modes"][mode]["summary"]
            print(f"== {name} / {mode}: {json.dumps({k: round(v, 3) for k, v in s.items()})}")
            for row in entry["modes"][mode]["results"]:
                print(f"  {row['lm_log_likelihood_per_token']:7.3f}/tok {row['search'][:4]} "
                      f"{'ok ' if row['parses'] else 'BAD'} {row['text']!r}")
        report["grammars"][name] = entry
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
