"""The kept-entry lookahead's per-step passes, compiled loops against the torch code they
replaced, in one process: the m largest scores per row (``torch.topk``), the entries at or above a
per-row floor (a comparison over [R, V], the boolean's row sums and ``nonzero``), and the listed
entries' dot products (three [K, h] gathers and two products).

    OMP_NUM_THREADS=1 python -m benchmarks.bench_row_candidates [--rows 128] [--hidden 512 2048]

Scores: random log-softmaxed rows of V = 49,152 (a floor that keeps ≈ 0.1 % of each row);
entries: 2,000 (row, token, table row) triples. Median of ``--repeats`` calls, one torch thread.
Writes ``benchmarks/results/bench_row_candidates.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from benchmarks.bench_prior_head import median_time
from ctrlg.kernels.entry_dots_cpu import entry_dots
from ctrlg.kernels.row_candidates_cpu import at_least_per_row, top_per_row


def median_ms(fn, repeats: int) -> float:
    return 1e3 * median_time(fn, repeats)


def torch_at_least(scores, rows, floor):
    hit = scores[torch.as_tensor(rows)] >= torch.as_tensor(floor, dtype=torch.float32)[:, None]
    counts = hit.sum(1)
    return hit.nonzero(as_tuple=True), counts


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=49_152)
    parser.add_argument("--hidden", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results/bench_row_candidates.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    R, V = args.rows, args.vocab
    scores = torch.randn(R, V, generator=gen).mul_(3).log_softmax(1).contiguous()
    rows = np.arange(R)
    floor = torch.quantile(scores[:, :4096], 0.999, dim=1).numpy()
    out = {"rows": R, "vocab": V, "cpu_threads": 1, "passes": [], "dots": []}
    for name, compiled_fn, torch_fn in [
            ("top 4 per row", lambda: top_per_row(scores, rows, 4), lambda: torch.topk(scores, 4)),
            ("entries above a floor", lambda: at_least_per_row(scores, rows, floor, 4096),
             lambda: torch_at_least(scores, rows, floor))]:
        row = {"pass": name, "compiled_ms": median_ms(compiled_fn, args.repeats),
               "torch_ms": median_ms(torch_fn, args.repeats)}
        out["passes"].append(row)
        print(f"{name}: compiled {row['compiled_ms']:.2f} ms, torch {row['torch_ms']:.2f} ms "
              f"(× {row['torch_ms'] / row['compiled_ms']:.2f})")
    rng = np.random.default_rng(0)
    for h in args.hidden:
        priors = torch.rand(R, h, generator=gen).softmax(1)
        emission_t = torch.rand(V, h, generator=gen)
        tables = torch.rand(33 * 400, h, generator=gen)
        K = args.entries
        r, v, j = rng.integers(0, R, K), rng.integers(0, V, K), rng.integers(0, len(tables), K)

        def torch_dots():
            q = priors[torch.as_tensor(r)] * emission_t[torch.as_tensor(v)]
            return (q * tables[torch.as_tensor(j)]).sum(1), q.sum(1)

        row = {"hidden": h, "entries": K,
               "compiled_ms": median_ms(lambda: entry_dots(priors, emission_t, tables, r, v, j),
                                        args.repeats),
               "torch_ms": median_ms(torch_dots, args.repeats)}
        out["dots"].append(row)
        print(f"entry dots, h = {h}, {K} entries: compiled {row['compiled_ms']:.2f} ms, torch "
              f"{row['torch_ms']:.2f} ms (× {row['torch_ms'] / row['compiled_ms']:.2f})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
