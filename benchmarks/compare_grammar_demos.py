"""Compare two ``benchmarks.demo_grammar`` runs of the same prompts (say ``dfa.grammar`` against
``dfa.lazy_grammar``), grammar by grammar and mode by mode.

Per run: outputs, the share that ``lark`` parses, the mean LM log-likelihood per token, the mean
length in tokens, the processor's time over the rest of ``generate``, and the share of *structured*
outputs — what the prompts ask for rather than a minimal sentence:

* arithmetic: an operator (``+ - * /``) outside a leading sign;
* lists: at least three items (names between brackets and commas);
* JSON: an object or array with at least two members (``json.loads``).

Paired over prompts: the difference (second − first) of the per-prompt mean log-likelihood and
structured share, with a 95 % bootstrap interval over prompts (10,000 resamples, seed 0).

    python -m benchmarks.compare_grammar_demos FIRST.json SECOND.json --out SUMMARY.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np


def structured(grammar: str, text: str) -> bool:
    """Whether ``text`` is more than a minimal sentence of ``grammar`` (module docstring)."""
    body = text.strip()
    if grammar == "arithmetic":
        return bool(re.search(r"\S\s*[-+*/]", body))
    if grammar == "lists":
        return len(re.findall(r"[^\[\],\s][^\[\],]*", body)) >= 3
    if grammar == "json":
        try:
            value = json.loads(body)
        except ValueError:
            return False
        return isinstance(value, (dict, list)) and len(value) >= 2
    return True


def per_prompt(results: list[dict], grammar: str) -> dict[str, tuple[float, float]]:
    """prompt -> (mean log-likelihood per token, structured share)."""
    out: dict[str, list] = {}
    for r in results:
        out.setdefault(r["prompt"], []).append((r["lm_log_likelihood_per_token"],
                                                structured(grammar, r["text"])))
    return {p: (float(np.mean([a for a, _ in v])), float(np.mean([b for _, b in v])))
            for p, v in out.items()}


def bootstrap(diffs: np.ndarray, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), size=(resamples, len(diffs)))].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def summary(run: dict, grammar: str, mode: str) -> dict:
    entry = run["grammars"][grammar]
    results = entry["modes"][mode]["results"]
    s = dict(entry["modes"][mode]["summary"])
    s["structured_share"] = float(np.mean([structured(grammar, r["text"]) for r in results]))
    s["mean_tokens"] = float(np.mean([r["tokens"] for r in results]))
    s["constraint"] = entry["constraint"]
    return s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    first, second = (json.loads(p.read_text()) for p in (args.first, args.second))
    rows = []
    for grammar in first["grammars"]:
        if grammar not in second["grammars"]:
            continue
        for mode in first["grammars"][grammar]["modes"]:
            if mode not in second["grammars"][grammar]["modes"]:
                continue
            a = per_prompt(first["grammars"][grammar]["modes"][mode]["results"], grammar)
            b = per_prompt(second["grammars"][grammar]["modes"][mode]["results"], grammar)
            prompts = sorted(set(a) & set(b))
            d_ll = np.array([b[p][0] - a[p][0] for p in prompts])
            d_st = np.array([b[p][1] - a[p][1] for p in prompts])
            rows.append({"grammar": grammar, "mode": mode, "prompts": len(prompts),
                         "first": summary(first, grammar, mode),
                         "second": summary(second, grammar, mode),
                         "loglik_diff": float(d_ll.mean()), "loglik_diff_ci": bootstrap(d_ll),
                         "structured_diff": float(d_st.mean()),
                         "structured_diff_ci": bootstrap(d_st)})
            print(json.dumps({k: rows[-1][k] for k in ("grammar", "mode", "prompts", "loglik_diff",
                                                        "loglik_diff_ci", "structured_diff",
                                                        "structured_diff_ci")}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"first": str(args.first), "second": str(args.second),
                                    "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
