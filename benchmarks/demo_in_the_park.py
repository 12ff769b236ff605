"""Ctrl-G §3.3 example with a regex constraint: "a sentence that ends with *in the park*".

The constraint is the regex ``[A-Z][^\\n.!?]* in the park\\.`` compiled over all encodings
(:func:`ctrlg.dfa.regex`). Ctrl-G guidance (``mode="ctrlg"``: p_lm · p_hmm(α | ·) with the
embedded HMM) plans ahead so the sentence can end naturally; logical masking (``mode="logical"``,
what Outlines/guidance do) only forbids dead tokens and tends to run on until the budget forces
an abrupt " in the park." Both use the same LM, prompt, seed and token budget.

    python -m benchmarks.demo_in_the_park [--samples 4] [--max-new-tokens 32]

Prints the accepted generations with their LM log-likelihood per token and writes
benchmarks/results/demo_in_the_park.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

PATTERN = r"[A-Z][^\n.!?]* in the park\."
PROMPT = "Write one sentence about a dog."


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/demo_in_the_park.json")
    args = parser.parse_args(argv)

    import ctrlg
    from ctrlg import dfa
    from ctrlg.hmm import load_default_hmm
    from ctrlg.lm.models import load_model, load_tokenizer

    tok = load_tokenizer()
    model = load_model().eval()
    hmm = load_default_hmm(tokenizer=tok)
    constraint = dfa.regex(PATTERN, tok, vocab_size=hmm.vocab_size)
    messages = [{"role": "user", "content": PROMPT}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    report = {"pattern": PATTERN, "prompt": PROMPT, "dfa": repr(constraint), "modes": {}}
    for mode in ("ctrlg", "logical"):
        t = time.perf_counter()
        results = ctrlg.generate(model, tok, prompt, constraint, hmm=hmm if mode == "ctrlg" else None,
                                 mode=mode, max_new_tokens=args.max_new_tokens,
                                 num_samples=args.samples, seed=args.seed)
        elapsed = time.perf_counter() - t
        rows = [{"text": r.text, "tokens": len(r.token_ids),
                 "lm_log_likelihood_per_token": r.lm_log_likelihood / max(len(r.token_ids), 1)}
                for r in results]
        report["modes"][mode] = {"seconds": elapsed, "results": rows}
        print(f"== {mode} ({elapsed:.1f}s)")
        for row in rows:
            print(f"  {row['lm_log_likelihood_per_token']:7.3f}/tok  {row['text']!r}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
